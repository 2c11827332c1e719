"""Regenerate the pictures of docs/report.md from a shipped sample:

    python docs/make_pictures.py

docs/img/dashboard.png is ``rcdiag analyze ... --png``; docs/img/report.png is a screenshot of ``--html`` taken in
headless Chromium with the network cut (the same harness as the browser tests, which also checks that the page
made no request and logged no error); docs/img/dashboard_one_batch.png is ``--explain --png`` of a dump without a
step column (outliers.parquet without its ``step``). Needs the plot extra, websocket-client and Chromium.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import pyarrow.parquet as pq  # noqa: E402
from browser import open_offline  # noqa: E402  (tests/browser.py)
from PIL import Image  # noqa: E402  (matplotlib's dependency)

SAMPLE = "sample_data/train_forgot_temperature.parquet"
COMMAND = ["analyze", SAMPLE, "--is", "token", "--rs", "token_k1", "--rs-threshold", "0.5_2.0", "-q"]
"""The command docs/report.md shows."""
IMAGES = ROOT / "docs" / "img"
ONE_BATCH = "sample_data/outliers.parquet"
"""Written again without its step column for the one-batch dashboard (most real dumps have no steps)."""
SCREEN = (1280, 2300)
"""The screenshot: the page's width and the height shown (header, findings, checklist and the trend panels)."""


def main() -> None:
    IMAGES.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        page = Path(scratch) / "report.html"
        subprocess.run(
            [sys.executable, "-m", "rcdiag", *COMMAND, "--html", str(page), "--png", str(IMAGES / "dashboard.png"),
             "-o", str(Path(scratch) / "report.txt")],
            check=True, cwd=ROOT,
        )  # fmt: skip
        load = open_offline(page, width=SCREEN[0], height=SCREEN[1], full_page=False)
        one_batch = "outliers_without_steps.parquet"  # relative: the picture's title shows this name
        pq.write_table(pq.read_table(ROOT / ONE_BATCH).drop_columns(["step"]), Path(scratch) / one_batch)
        subprocess.run(
            [sys.executable, "-m", "rcdiag", "analyze", one_batch, "--explain", "-q",
             "--png", str(IMAGES / "dashboard_one_batch.png"), "-o", "one_batch.txt"],
            check=True, cwd=scratch, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])},
        )  # fmt: skip
    if load.failed or load.console_errors or len(load.requests) != 1:
        raise SystemExit(f"the report did not load cleanly offline: {load.failed} {load.console_errors}")
    shot = Image.open(io.BytesIO(load.screenshot)).convert("RGB").quantize(colors=256)  # a third of the bytes
    shot.save(IMAGES / "report.png", optimize=True)
    print(f"wrote {IMAGES / 'dashboard.png'}, {IMAGES / 'dashboard_one_batch.png'} and {IMAGES / 'report.png'}")


if __name__ == "__main__":
    main()
