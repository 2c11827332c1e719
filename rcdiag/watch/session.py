"""``rcdiag watch``: follow a directory (or object-store prefix) a trainer writes per-step dumps into, read each
new complete file once, and report every step as ``rcdiag analyze`` would on the finished directory.

Each file is read alone (``rcdiag.api.accumulate``) and its accumulators are merged into the running
``EngineState``; merging is how results combine everywhere in rcdiag, so the steps' numbers are those of one
analysis of the whole directory. After each file the state is committed: one state file (an rcdiag state, which
``rcdiag merge`` also reads) holding the accumulators *and* the files consumed and the alerts raised, written whole
or not at all (``rcdiag.outputs``). A watch killed at any point restarts from the last commit: a file is counted
once or not at all, never twice, and an alert is not raised again.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rcdiag.interrupts as interrupts
from rcdiag._version import __version__
from rcdiag.api import accumulate, build_report
from rcdiag.check.metric_names import metric_names, validate_rules
from rcdiag.config import CorrectionConfig
from rcdiag.engine import EngineState
from rcdiag.errors import ConfigError, InputError
from rcdiag.io import storage
from rcdiag.io.base import SourceInfo
from rcdiag.options import ReadOptions
from rcdiag.outputs import refuse_inputs
from rcdiag.report import Finding, Report, StepReport, Verdict
from rcdiag.validate import ScreenStats
from rcdiag.watch.alerts import Alert, AlertPolicy
from rcdiag.watch.deliver import Delivery, Dispatcher
from rcdiag.watch.files import DEFAULT_SETTLE, FileStamp, Follower
from rcdiag.watch.forecast import Forecast

STATE_DIR = ".rcdiag-watch"
"""Where a watch keeps its state by default: beside the watched directory (never inside it: that is an input)."""
WATCH_KEY = "watch"
"""The state file's extra top-level table: what was consumed, the alerts raised."""
DEFAULT_POLL = 0.5
"""Seconds between listings of the watched directory."""


def default_state_path(location: str) -> Path:
    """``<parent>/.rcdiag-watch/<name>.json`` for a local directory; ``./.rcdiag-watch/<url as a name>.json`` for
    an object-store prefix."""
    text = storage.local_path(location)
    if storage.is_remote(text):
        return Path(STATE_DIR) / f"{re.sub(r'[^A-Za-z0-9._-]+', '_', text.rstrip('/'))}.json"
    where = Path(text).resolve()
    return where.parent / STATE_DIR / f"{where.name}.json"


@dataclass(frozen=True)
class StepEvent:
    """One step as reported when a file holding it was read: its metrics (those of ``analyze`` on everything
    read so far), the run's verdict and findings at that point, and the alerts that newly hold."""

    step: StepReport
    file: str
    revised: bool
    """The step had rows in an earlier file too (a second DumpWriter part): these are its updated numbers."""
    verdict: Verdict | None
    findings: tuple[Finding, ...]
    alerts: tuple[Alert, ...]
    forecasts: tuple[Forecast, ...]
    files: int
    """Files consumed so far."""

    def to_dict(self) -> dict[str, Any]:
        verdict = None if self.verdict is None else {"status": self.verdict.status, "headline": self.verdict.headline}
        return _finite_tree(
            {
                "kind": "step",
                **self.step.to_dict(),
                "file": self.file,
                "revised": self.revised,
                "files": self.files,
                "verdict": verdict,
                "findings": [{"code": f.code, "severity": f.severity} for f in self.findings],
                "alerts": [a.to_dict() for a in self.alerts],
                "forecasts": [f.to_dict() for f in self.forecasts],
            }
        )


def _finite_tree(value: Any) -> Any:
    """Non-finite floats as ``None`` (JSON has no inf), as in every JSON rcdiag writes."""
    if isinstance(value, dict):
        return {k: _finite_tree(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_tree(v) for v in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value


class Watch:
    """A watched location and its persisted state; ``run`` follows it, ``poll_once`` reads what is ready now."""

    def __init__(
        self,
        location: str,
        config: CorrectionConfig | None = None,
        read: ReadOptions | None = None,
        *,
        state_path: str | Path | None = None,
        settle: float = DEFAULT_SETTLE,
        policy: AlertPolicy | None = None,
        dispatcher: Dispatcher | None = None,
    ) -> None:
        self.location = location
        self.config = config or CorrectionConfig()
        self.resolved = self.config.resolve()
        self.read = read or ReadOptions()
        self.policy = policy or AlertPolicy()
        validate_rules(self.policy.rules, metric_names(self.resolved), has_baseline=False)
        self.dispatcher = dispatcher or Dispatcher()
        self.state_path = Path(state_path) if state_path is not None else default_state_path(location)
        if storage.is_remote(str(self.state_path)):
            raise ConfigError(f"--state {self.state_path}: give a local file (the watch rewrites it after every file).")
        refuse_inputs([("--state", self.state_path)], [location])
        self.follower = Follower(location, settle)
        self.state = EngineState(self.resolved)
        self.sources: list[SourceInfo] = []
        self.screen = ScreenStats()
        self.consumed: dict[str, FileStamp] = {}
        self.alerted: dict[str, int | None] = {}
        self.device = "cpu"
        self.report: Report | None = None
        self._load()

    # ---------------------------------------------------------------------------------------------- state file

    def _load(self) -> None:
        if not self.state_path.exists():
            return
        from rcdiag.state import load_state, parse_state_json, read_state_bytes

        name = str(self.state_path)
        payload = parse_state_json(read_state_bytes(name)[0], name)
        saved = payload.get(WATCH_KEY) if isinstance(payload, dict) else None
        if not isinstance(saved, dict):
            raise InputError("is not a watch state (no 'watch' table): give another --state file", path=name)
        if saved.get("location") != _canonical(self.location):
            raise InputError(
                f"is the state of a watch of {saved.get('location')}, not of {_canonical(self.location)}: give "
                "another --state file",
                path=name,
            )
        state, sources, screen = load_state(name)
        if not self.resolved.same_computation(state.resolved):
            raise ConfigError(
                f"--state {name} was computed with another configuration ({state.resolved.config.to_dict()}); "
                "watch with the same engine flags, or give another --state file"
            )
        try:
            self.consumed = {item["name"]: FileStamp.from_dict(item) for item in saved["consumed"]}
            self.alerted = {str(key): step for key, step in saved["alerted"].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InputError(f"holds a damaged watch table ({type(exc).__name__}: {exc})", path=name) from None
        self.state, self.sources, self.screen = state, sources, screen
        if self.state.batches:
            self.report = build_report(self.state, self._info(), self.device, self.screen)

    def _commit(self) -> None:
        """Accumulators, files consumed and alerts raised, in one file written whole or not at all."""
        from rcdiag.state import save_state

        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        table = {
            "location": _canonical(self.location),
            "consumed": [stamp.to_dict() for stamp in self.consumed.values()],
            "alerted": self.alerted,
        }
        save_state(self.state_path, self.state, self.sources, self.screen, extra={WATCH_KEY: table})

    def _info(self) -> SourceInfo:
        from rcdiag.state import combined_info

        if not self.sources:
            return SourceInfo(path=self.location, format="", files=0)
        joined = combined_info(self.sources)
        return dataclasses.replace(joined, path=self.location, files=len(self.sources), reads=[])

    # ------------------------------------------------------------------------------------------------- reading

    def poll_once(self, on_event: Callable[[StepEvent], None] | None = None) -> tuple[list[StepEvent], int, bool]:
        """Read every complete file not read yet, committing after each and then handing its steps to ``on_event``;
        the steps read, how many files are still settling, and whether a new alert at ``exit_on`` stopped the
        reading (after that file)."""
        ready, waiting = self.follower.poll(self.consumed)
        events: list[StepEvent] = []
        for file, stamp in ready:
            interrupts.check()
            new = self._consume(file, stamp)
            for event in new:
                if on_event is not None:
                    on_event(event)
            events += new
            if any(self.policy.stops(event.alerts) for event in new):
                return events, waiting, True
        return events, waiting, False

    def _consume(self, file: Any, stamp: FileStamp) -> list[StepEvent]:
        from rcdiag.io.paths import identity
        from rcdiag.state import content_fingerprint

        name = str(file)
        got = accumulate(name, self.config, self.read)
        if isinstance(file, Path):
            now = os.stat(file)
            if (now.st_size, now.st_mtime_ns) != (stamp.size, stamp.mtime_ns):
                return []  # rewritten while read: read again once it settles
        steps = sorted(step for step in got.state.batches if step is not None)
        if None in got.state.batches:
            raise InputError(
                "has rows without a step (no step column, and no step in its name); a watch reports per step",
                path=name,
            )
        info = got.info
        reads = [dict(identity(name), part=None)]
        if isinstance(file, Path):
            reads[0].update(inode=[stamp.inode[0], stamp.inode[1]] if stamp.inode else None)
            reads[0]["fingerprint"] = content_fingerprint(name)
        revised = {step for step in steps if step in self.state.batches}
        self.state.merge(got.state)
        self.sources.append(dataclasses.replace(info, reads=reads))
        self.screen = self.screen.merge(got.screen)
        self.consumed[stamp.name] = stamp
        self.device = got.device
        report = build_report(self.state, self._info(), self.device, self.screen)
        self.report = report
        by_step = {s.step: s for s in report.steps}
        events = []
        for step in steps:
            alerts, forecasts = self.policy.evaluate(report, step, findings=step == steps[-1], alerted=self.alerted)
            for alert in alerts:
                self.alerted[alert.key] = step
            events.append(
                StepEvent(by_step[step], stamp.name, step in revised, report.verdict, report.findings,
                          tuple(alerts), tuple(forecasts), len(self.consumed))
            )  # fmt: skip
        self._commit()  # then report: a kill between the two loses this file's lines, never counts it twice
        for event in events:
            for alert in event.alerts:
                self.dispatcher.send(self.alert_payload(alert))
        return events

    def alert_payload(self, alert: Alert) -> dict[str, Any]:
        """The JSON an ``--on-alert`` command reads and a ``--webhook`` receives."""
        verdict = self.report.verdict if self.report is not None else None
        return _finite_tree(
            {
                **alert.to_dict(),
                "watch": self.location,
                "verdict": None if verdict is None else {"status": verdict.status, "headline": verdict.headline},
                "rcdiag_version": __version__,
            }
        )

    # ----------------------------------------------------------------------------------------------- following

    def run(
        self,
        *,
        poll: float = DEFAULT_POLL,
        once: bool = False,
        timeout: float | None = None,
        max_idle: float | None = None,
        on_event: Callable[[StepEvent], None] | None = None,
        on_poll: Callable[[int, list[Delivery]], None] | None = None,
    ) -> str:
        """Follow the location until an end: ``"once"`` (with ``once``, nothing left to read), ``"timeout"``,
        ``"idle"`` (``max_idle`` seconds without a new file) or ``"alert"`` (a new alert at ``exit_on``).
        ``on_event`` sees each step after its commit; ``on_poll`` the files still settling and the deliveries
        finished since the last poll."""
        start = last_new = time.monotonic()
        while True:
            events, waiting, stopped = self.poll_once(on_event)
            if on_poll is not None:
                on_poll(waiting, self.dispatcher.outcomes())
            if stopped:
                return "alert"
            now = time.monotonic()
            if timeout is not None and now - start >= timeout:
                return "timeout"
            if events:
                last_new = now
                continue  # more may have landed meanwhile
            if once and waiting == 0:
                return "once"
            if max_idle is not None and now - last_new >= max_idle:
                return "idle"
            time.sleep(poll)


def _canonical(location: str) -> str:
    text = storage.local_path(location)
    return text.rstrip("/") if storage.is_remote(text) else str(Path(text).resolve())
