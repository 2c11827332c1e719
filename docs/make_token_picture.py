"""Regenerate docs/img/token_text.png: the HTML report's by-token sections for the shipped stop-token sample.

    python docs/make_token_picture.py      # needs rcdiag[tokens] and Chromium (tests/browser.py)

The page holds the sections ``rcdiag analyze sample_data/stop_token.parquet --explain --tokenizer
sample_data/tokenizer.json --worst 3 --html FILE`` writes (``rcdiag.render.token_html``), alone, screenshotted
offline in headless Chromium.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import browser  # noqa: E402

import rcdiag  # noqa: E402
from rcdiag.render.html import page, section, table  # noqa: E402
from rcdiag.render.token_html import token_sections  # noqa: E402

SAMPLE = ROOT / "sample_data" / "stop_token.parquet"
TOKENIZER = ROOT / "sample_data" / "tokenizer.json"
OUT = ROOT / "docs" / "img" / "token_text.png"


def main() -> None:
    report = rcdiag.analyze(SAMPLE, tokenizer=TOKENIZER, worst=2)
    html = page(
        "rcdiag report", "sample_data/stop_token.parquet (by-token sections)", token_sections(report, section, table)
    )
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "tokens.html"
        path.write_text(html)
        loaded = browser.open_offline(path, width=1200, height=900)
    OUT.write_bytes(loaded.screenshot)
    print(f"wrote {OUT.relative_to(ROOT)} ({len(loaded.screenshot):,} bytes)")


if __name__ == "__main__":
    main()
