"""Regenerate the pictures of docs/watch.md from the planted run of tests/watch/test_watch.py:

    python docs/make_watch_pictures.py

The run: 20 steps written with ``DumpWriter``, the mismatch flat to step 5, then ``k3_kl`` growing every step.

* docs/img/watch_live.png: the live view of ``rcdiag watch RUN --max k3_kl=1e-3`` after the last step, drawn by the
  view's own renderer into a recording rich console (``export_svg``), the SVG shot in headless Chromium.
* docs/img/watch_tensorboard.png: TensorBoard's own frontend (the installed ``tensorboard`` package, served on
  127.0.0.1 with the network cut for the browser) on the event files ``rcdiag watch RUN --tensorboard DIR`` wrote,
  its scalars filtered to ``k3_kl``.

Needs the tensorboard extra and Chromium.
"""

from __future__ import annotations

import base64
import io
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from browser import FLAGS, DevTools, _page_socket, find_chromium  # noqa: E402  (tests/browser.py)

IMAGES = ROOT / "docs" / "img"
STEPS, PLANTED_FROM, LIMIT = 20, 6, 1e-3
"""The planted run of tests/watch/test_watch.py and the bound the docs watch it with."""
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
LOOPBACK_ONLY = [
    *(f for f in FLAGS if not f.startswith(("--host-resolver", "--proxy-server"))),
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
]
"""tests/browser.py's Chromium, every host unreachable but 127.0.0.1 (where TensorBoard serves)."""


def write_planted(directory: Path) -> None:
    """tests/watch/test_watch.py's planted run: noise 0.02 to step 5, then growing so that k3_kl grows linearly."""
    from rcdiag.io import synthetic
    from rcdiag.io.dump_writer import DumpWriter

    writer = DumpWriter(directory, metadata={"temperature": 1.0})
    for step in range(STEPS):
        noise = 0.02 if step < PLANTED_FROM else 0.02 * np.sqrt(1 + 0.5 * (step - PLANTED_FROM + 1))
        scenario = synthetic.with_overrides("healthy", noise=noise)
        table = synthetic.generate(scenario, rows=32, steps=1, seed=100 + step, median_length=60, max_length=200,
                                   empty_rows=0)  # fmt: skip
        table = table.set_column(3, "step", pa.array(np.full(table.num_rows, step, dtype=np.int64)))

        def rows(name: str, dtype: type, table: pa.Table = table) -> list[np.ndarray]:
            return [np.asarray(v, dtype=dtype) for v in table.column(name).to_pylist()]

        writer.write(step=step, old_log_prob=rows("old_log_prob", np.float32),
                     rollout_log_prob=rows("rollout_log_prob", np.float32),
                     response_mask=rows("response_mask", np.int8))  # fmt: skip


def live_view_svg(run: Path, state: Path) -> str:
    """The live view's last frame, rendered by the watch's own view into a recording console."""
    from rich.console import Console

    from rcdiag.check.rules import parse_assignment
    from rcdiag.render.watch_table import WatchScreen
    from rcdiag.watch import AlertPolicy, Watch

    session = Watch(
        str(run),
        state_path=state,
        settle=0.0,
        policy=AlertPolicy((parse_assignment(f"k3_kl={LIMIT:g}", "max", option="--max"),)),
    )
    screen = WatchScreen(session.location, session.consumed)
    session.run(once=True, poll=0.05, on_event=screen.add)
    console = Console(record=True, width=118, force_terminal=True, color_system="truecolor", file=io.StringIO())
    console.print(screen.render())
    return console.export_svg(title=f"rcdiag watch {run.name} --max k3_kl={LIMIT:g}")


def shoot(url: str, out: Path, size: tuple[int, int], wait_ms: int) -> None:
    """A headless Chromium screenshot of ``url`` (every host but 127.0.0.1 unreachable)."""
    chromium = find_chromium()
    if chromium is None:
        raise SystemExit("no Chromium found")
    flags = [f for f in LOOPBACK_ONLY if not f.startswith("--remote-")]
    with tempfile.TemporaryDirectory(prefix="rcdiag-chromium-") as profile:
        subprocess.run(
            [chromium, *flags, f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}",
             f"--virtual-time-budget={wait_ms}", f"--screenshot={out}", url],
            check=True, capture_output=True, timeout=180,
        )  # fmt: skip


def crop(path: Path) -> None:
    """Cut the page's white margin around the terminal window."""
    from PIL import Image, ImageOps

    with Image.open(path) as image:
        box = ImageOps.invert(image.convert("RGB")).getbbox()
        cropped = image.crop(box) if box else image.copy()
    cropped.save(path)


def scalars(base: str, out: Path) -> None:
    """TensorBoard's scalars dashboard filtered to k3_kl, unsmoothed and with every point in the chart's scale
    (the outliers setting lives in the page's localStorage: set it, then load the dashboard)."""
    chromium = find_chromium()
    if chromium is None:
        raise SystemExit("no Chromium found")
    with tempfile.TemporaryDirectory(prefix="rcdiag-chromium-") as profile:
        process = subprocess.Popen([chromium, *LOOPBACK_ONLY, f"--user-data-dir={profile}", "about:blank"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            tools = DevTools(_page_socket(Path(profile), process))
            tools.call("Page.enable")
            tools.call("Emulation.setDeviceMetricsOverride", width=1100, height=640, deviceScaleFactor=1, mobile=False)
            tools.call("Page.navigate", url=f"{base}/")
            tools.wait_for("Page.loadEventFired")
            tools.call("Runtime.evaluate", expression="localStorage.setItem('_ignoreYOutliers', 'false')")
            tools.events.clear()
            tools.call("Page.navigate", url=f"{base}/?shot=1#scalars&tagFilter=k3_kl&_smoothingWeight=0")
            tools.wait_for("Page.loadEventFired")
            time.sleep(8.0)  # the charts draw after the data requests
            out.write_bytes(base64.b64decode(tools.call("Page.captureScreenshot", format="png")["data"]))
            tools.close()
        finally:
            process.terminate()
            process.wait(timeout=20)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def tensorboard_picture(run: Path, scratch: Path) -> None:
    logs = scratch / "tensorboard"
    command = [sys.executable, "-m", "rcdiag", "watch", str(run), "--state", str(scratch / "tb-state.json"), "--once",
               "--max", f"k3_kl={LIMIT:g}", "--format", "json", "--tensorboard", str(logs / "rcdiag")]  # fmt: skip
    subprocess.run(command, check=True, env=ENV, capture_output=True)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(logs), "--port", str(port), "--host", "127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{base}/data/runs", timeout=2).read()
                break
            except OSError:
                time.sleep(0.5)
        scalars(base, IMAGES / "watch_tensorboard.png")
    finally:
        server.terminate()
        server.wait(timeout=20)


def main() -> None:
    IMAGES.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rcdiag-watch-pictures-") as name:
        scratch = Path(name)
        run = scratch / "planted"
        write_planted(run)
        svg = scratch / "live.svg"
        os.chdir(scratch)  # the view names the directory as given: "planted"
        svg.write_text(live_view_svg(Path("planted"), scratch / "live-state.json"))
        shoot(svg.as_uri(), IMAGES / "watch_live.png", (1180, 620), 2000)
        crop(IMAGES / "watch_live.png")
        tensorboard_picture(run, scratch)
    print(f"wrote {IMAGES / 'watch_live.png'} and {IMAGES / 'watch_tensorboard.png'}")


if __name__ == "__main__":
    main()
