"""Delivering alerts: a command with the alert's JSON on stdin (``--on-alert``) and an HTTP POST (``--webhook``).

Each target has its own thread and queue, so a slow command or an unreachable server never holds up the watch; a
failure is reported (``Delivery.ok`` false, read back with ``outcomes``), never fatal. The webhook retries
connection errors, timeouts, 429 and 5xx answers with exponential backoff; another 4xx is final.
"""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from rcdiag.runtime.errors import ConfigError

COMMAND_TIMEOUT = 30.0
"""Seconds an ``--on-alert`` command may run before it is killed (reported as a failure)."""
WEBHOOK_TIMEOUT = 10.0
"""Seconds one POST may take."""
WEBHOOK_ATTEMPTS = 4
WEBHOOK_BACKOFF = 0.5
"""Seconds before the first retry; doubled before each next one."""
DRAIN_SECONDS = 60.0
"""At the end of a watch, how long pending deliveries may still take."""


@dataclass(frozen=True)
class Delivery:
    """What became of one alert at one target."""

    target: str
    key: str
    ok: bool
    detail: str
    attempts: int = 1


class _Worker:
    def __init__(self, name: str) -> None:
        self.name = name
        self.jobs: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.done: queue.Queue[Delivery] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name=f"rcdiag-{name}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (payload := self.jobs.get()) is not None:
            self.done.put(self._guarded(payload))

    def _guarded(self, payload: dict[str, Any]) -> Delivery:
        try:
            return self.deliver(payload)
        except Exception as exc:  # a delivery never ends the watch
            return Delivery(self.name, str(payload.get("key")), False, f"{type(exc).__name__}: {exc}")

    def deliver(self, payload: dict[str, Any]) -> Delivery:
        raise NotImplementedError


class CommandTarget(_Worker):
    """``--on-alert CMD``: run through the shell with the alert's JSON on stdin."""

    def __init__(self, command: str, timeout: float = COMMAND_TIMEOUT) -> None:
        self.command, self.timeout = command, timeout
        super().__init__("on-alert")

    def deliver(self, payload: dict[str, Any]) -> Delivery:
        key = str(payload.get("key"))
        data = (json.dumps(payload) + "\n").encode()
        try:
            done = subprocess.run(
                self.command, shell=True, input=data, capture_output=True, timeout=self.timeout, check=False
            )
        except subprocess.TimeoutExpired:
            return Delivery(self.name, key, False, f"'{self.command}' ran past {self.timeout:g} s and was killed")
        except OSError as exc:
            return Delivery(self.name, key, False, f"'{self.command}' could not start: {exc.strerror or exc}")
        if done.returncode != 0:
            said = done.stderr.decode(errors="replace").strip().splitlines()
            tail = f": {said[-1][:200]}" if said else ""
            return Delivery(self.name, key, False, f"'{self.command}' exited {done.returncode}{tail}")
        return Delivery(self.name, key, True, f"'{self.command}' exited 0")


class WebhookTarget(_Worker):
    """``--webhook URL``: POST the alert's JSON (``Content-Type: application/json``)."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = WEBHOOK_TIMEOUT,
        attempts: int = WEBHOOK_ATTEMPTS,
        backoff: float = WEBHOOK_BACKOFF,
    ) -> None:
        self.url, self.timeout, self.attempts, self.backoff = url, timeout, attempts, backoff
        super().__init__("webhook")

    def deliver(self, payload: dict[str, Any]) -> Delivery:
        key = str(payload.get("key"))
        data = json.dumps(payload).encode()
        why = ""
        for attempt in range(1, self.attempts + 1):
            request = urllib.request.Request(
                self.url, data=data, method="POST", headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                    return Delivery(self.name, key, True, f"{self.url} answered {answer.status}", attempt)
            except urllib.error.HTTPError as exc:
                why = f"{self.url} answered {exc.code}"
                if exc.code != 429 and exc.code < 500:
                    return Delivery(self.name, key, False, why, attempt)
            except (urllib.error.URLError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                why = f"{self.url}: {reason}"
            if attempt < self.attempts:
                time.sleep(self.backoff * 2 ** (attempt - 1))
        return Delivery(self.name, key, False, f"{why} (after {self.attempts} attempts)", self.attempts)


class Dispatcher:
    """Every target's queue: ``send`` returns at once; ``outcomes`` reads what was delivered or failed since."""

    def __init__(self, command: str | None = None, webhook: str | None = None) -> None:
        self.targets: list[_Worker] = []
        if webhook and urllib.parse.urlparse(webhook).scheme not in ("http", "https"):
            raise ConfigError(f"--webhook {webhook}: give an http:// or https:// URL.")
        if command:
            self.targets.append(CommandTarget(command))
        if webhook:
            self.targets.append(WebhookTarget(webhook))

    def send(self, payload: dict[str, Any]) -> None:
        for target in self.targets:
            target.jobs.put(payload)

    def outcomes(self) -> list[Delivery]:
        found: list[Delivery] = []
        for target in self.targets:
            while not target.done.empty():  # one reader (the watch's thread): not empty stays not empty
                found.append(target.done.get_nowait())
        return found

    def close(self, wait: float = DRAIN_SECONDS) -> list[Delivery]:
        """Let pending deliveries finish (at most ``wait`` seconds in all); their outcomes."""
        deadline = time.monotonic() + wait
        for target in self.targets:
            target.jobs.put(None)
        for target in self.targets:
            target.thread.join(max(0.0, deadline - time.monotonic()))
        return self.outcomes()
