"""Open a local HTML file in headless Chromium with the network cut, over the DevTools protocol (a websocket client
is all it needs: no driver binary, no browser download), and say what the page did: every request it made, the
ones that failed, console errors and uncaught exceptions, its rendered text and a screenshot.

The network is cut three ways: the DevTools network emulation is offline, every host resolves to nothing, and
the proxy is a closed local port. Used by the browser tests and by docs/make_pictures.py.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from missing_components import INSTALL as MISSING_HINTS

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
    "--remote-allow-origins=*",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--proxy-server=127.0.0.1:9",
)
INSTALL = MISSING_HINTS["chromium"]


def find_chromium() -> str | None:
    """``$RCDIAG_CHROMIUM`` (when it is an executable), else the first Chromium or Chrome on the PATH."""
    given = os.environ.get("RCDIAG_CHROMIUM")
    if given:
        return shutil.which(given)
    return next((found for name in CHROMIUM_NAMES if (found := shutil.which(name))), None)


@dataclass
class PageLoad:
    """What one page did while loading offline."""

    text: str = ""
    requests: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    screenshot: bytes = b""
    height: int = 0
    values: dict[str, Any] = field(default_factory=dict)
    """The value of each expression given to ``open_offline(evaluate=...)``, once the page loaded."""


class DevTools:
    """A minimal DevTools-protocol client on one page target: ``call`` a method, keep every event."""

    def __init__(self, url: str) -> None:
        import websocket  # websocket-client, a test dependency

        self.ws = websocket.create_connection(url, timeout=60, suppress_origin=True, max_size=None)
        self.events: list[dict[str, Any]] = []
        self.last_id = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.last_id += 1
        self.ws.send(json.dumps({"id": self.last_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.last_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self.events.append(message)

    def wait_for(self, method: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(e["method"] == method for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {method} within {timeout:g} s")
            message = json.loads(self.ws.recv())
            if "method" in message:
                self.events.append(message)

    def close(self) -> None:
        self.ws.close()


def _page_socket(profile: Path, process: subprocess.Popen) -> str:
    """The websocket address of the browser's first page, once it is listening."""
    port_file = profile / "DevToolsActivePort"
    deadline = time.monotonic() + 60
    while not port_file.exists() or not port_file.read_text().strip():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"Chromium did not start (exit code {process.poll()})")
        time.sleep(0.05)
    port = port_file.read_text().split()[0]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:  # loopback only
        targets = json.load(answer)
    return next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")


def open_offline(
    path: Path, width: int = 1400, height: int = 900, full_page: bool = True, evaluate: dict[str, str] | None = None
) -> PageLoad:
    """Load ``path`` offline and report what happened; the screenshot covers the whole page (or the first
    ``height`` pixels); ``evaluate`` names JavaScript expressions to evaluate in the loaded page (DOM queries)."""
    chromium = find_chromium()
    if chromium is None:
        raise FileNotFoundError(f"no Chromium found: {INSTALL}")
    profile = Path(tempfile.mkdtemp(prefix="rcdiag-chromium-"))
    process = subprocess.Popen(
        [chromium, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        tools = DevTools(_page_socket(profile, process))
        try:
            return _load(tools, path, width, height, full_page, evaluate or {})
        finally:
            tools.close()
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(profile, ignore_errors=True)


def _load(tools: DevTools, path: Path, width: int, height: int, full_page: bool, evaluate: dict[str, str]) -> PageLoad:
    for domain in ("Network", "Runtime", "Log", "Page"):
        tools.call(f"{domain}.enable")
    tools.call("Network.emulateNetworkConditions", offline=True, latency=0, downloadThroughput=-1, uploadThroughput=-1)
    tools.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
    tools.call("Page.navigate", url=path.resolve().as_uri())
    tools.wait_for("Page.loadEventFired")
    result = PageLoad()
    result.text = tools.call("Runtime.evaluate", expression="document.body.innerText", returnByValue=True)["result"][
        "value"
    ]
    result.height = int(tools.call("Runtime.evaluate", expression="document.documentElement.scrollHeight",
                                   returnByValue=True)["result"]["value"])  # fmt: skip
    for name, expression in evaluate.items():
        answer = tools.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in answer:
            raise RuntimeError(f"{name}: {answer['exceptionDetails'].get('text')}")
        result.values[name] = answer["result"].get("value")
    if full_page:
        tools.call("Emulation.setDeviceMetricsOverride", width=width, height=min(result.height, 16000),
                   deviceScaleFactor=1, mobile=False)  # fmt: skip
    shot = tools.call("Page.captureScreenshot", format="png")
    result.screenshot = base64.b64decode(shot["data"])
    urls = {}
    for event in tools.events:
        method, params = event["method"], event.get("params", {})
        if method == "Network.requestWillBeSent":
            urls[params["requestId"]] = params["request"]["url"]
            result.requests.append(params["request"]["url"])
        elif method == "Network.loadingFailed":
            result.failed.append(f"{urls.get(params['requestId'], '?')}: {params.get('errorText')}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            result.console_errors.append(" ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
        elif method == "Runtime.exceptionThrown":
            result.console_errors.append(params["exceptionDetails"].get("text", "exception"))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            result.console_errors.append(f"{params['entry'].get('url', '')}: {params['entry'].get('text')}")
    return result
