"""``rcdiag watch``: follow a directory (or object-store prefix) a trainer writes per-step dumps into, read each
new complete file once, and report every step as ``rcdiag analyze`` would on the finished directory.

Each file (a rollout's rank files as one: ``rcdiag.watch.files``) is read alone (``rcdiag.api.accumulate``) and its
accumulators are merged into the running ``EngineState``; merging is how results combine everywhere in rcdiag, so
the steps' numbers are those of one analysis of the whole directory. After each file the state is committed, at a
cost that does not grow with the run: one line appended to ``STATE.log`` (the file read, its source, the accumulators
of the steps it added to, the whole-dump sums of the run so far (the exact match, the bias detectors'), the
screen, the alerts raised). The state file itself (an rcdiag state, which ``rcdiag
merge`` also reads: the accumulators *and* the files consumed and the alerts raised) is rewritten whole or not at all
(``rcdiag.io.outputs``) only when the log outgrows it, and when the watch ends: it then carries a new generation, and
the log's lines of older ones are skipped. A watch killed at any point restarts from the state file and its log's
complete lines of the same generation (a line cut by the kill is dropped, its file read again): a file is counted
once or not at all, never twice, and an alert is not raised again.
"""

from __future__ import annotations

import dataclasses
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rcdiag.runtime.interrupts as interrupts
from rcdiag._version import __version__
from rcdiag.api import accumulate, analyze_state, build_report, with_defaults
from rcdiag.check.metric_names import metric_names, validate_rules
from rcdiag.core.limits import finite_tree
from rcdiag.diagnosis.health import BATCH_RULES, CONTEXT_RULES, Context, Hit, could_fire_in_context
from rcdiag.engine.stream import EngineState
from rcdiag.explain.detector_state import DetectorState
from rcdiag.io import storage
from rcdiag.io.base import SourceInfo
from rcdiag.io.outputs import ledger, reads, writes
from rcdiag.io.screen import ScreenStats
from rcdiag.metrics.batch import BatchResult
from rcdiag.records.report import Finding, Report, StepReport
from rcdiag.runtime.errors import ConfigError, InputError
from rcdiag.sections.exact import ExactState
from rcdiag.sections.registry import KNOWN
from rcdiag.sections.slices import SliceRows, SlicesSection
from rcdiag.sections.token_ids import TokenIdsSection
from rcdiag.settings.correction import CorrectionConfig
from rcdiag.settings.reading import ReadOptions
from rcdiag.watch.alerts import Alert, AlertPolicy, file_alert
from rcdiag.watch.deliver import Delivery, Dispatcher
from rcdiag.watch.files import DEFAULT_SETTLE, FileChange, FileStamp, Follower, Ready
from rcdiag.watch.forecast import Forecast, NoTrend

STATE_DIR = ".rcdiag-watch"
"""Where a watch keeps its state by default: beside the watched directory (never inside it: that is an input)."""
WATCH_KEY = "watch"
"""The state file's extra top-level table: what was consumed, the alerts raised."""
DEFAULT_POLL = 0.5
"""Seconds between listings of the watched directory."""
LOG_SUFFIX = ".log"
"""The state's log: ``STATE.log``, one JSON line per commit since the state file was last written."""
COMPACT_BYTES = 1 << 20
"""The log is folded into the state file once it is larger than both this and the state file (so a rewrite, whose
cost grows with the run, comes at most once per doubling: each file's commit costs the same on average)."""


def log_path(state_path: Path) -> Path:
    """``STATE.log`` beside ``STATE``."""
    return state_path.with_name(state_path.name + LOG_SUFFIX)


def default_state_path(location: str) -> Path:
    """``<parent>/.rcdiag-watch/<name>.json`` for a local directory; ``./.rcdiag-watch/<url as a name>.json`` for
    an object-store prefix."""
    text = storage.local_path(location)
    if storage.is_remote(text):
        return Path(STATE_DIR) / f"{re.sub(r'[^A-Za-z0-9._-]+', '_', text.rstrip('/'))}.json"
    where = Path(text).resolve()
    return where.parent / STATE_DIR / f"{where.name}.json"


WATCHED_INPUT = "the watched directory {source}"
"""How a refused output names the watched location (rcdiag.io.outputs.Ledger)."""


def claim_state(location: str, state_path: str | Path | None) -> Path:
    """The watch's state file (``--state``, else ``default_state_path``), added with its log to the run's outputs
    and ``location`` to its inputs (rcdiag.io.outputs.Ledger): a state over an input (a rules file, a file of the
    watched directory) is refused before anything is read. The state itself is the watch's own: it is read back
    on a restart, never an input."""
    path = Path(state_path) if state_path is not None else default_state_path(location)
    if storage.is_remote(str(path)):
        raise ConfigError(f"--state {path}: give a local file (the watch appends to its log after every file).")
    with ledger():
        writes(path, "--state")
        writes(log_path(path), "--state")
        reads(location, what=WATCHED_INPUT)
    return path


@dataclass(frozen=True)
class StepEvent:
    """One step, reported once the file holding it is read and committed: its metrics (those ``analyze`` gives on
    everything read so far), and the rule and forecast alerts that newly hold at it."""

    step: StepReport
    file: str
    revised: bool
    """The step had rows in an earlier file too (a second DumpWriter part): these are its updated numbers."""
    alerts: tuple[Alert, ...]
    forecasts: tuple[Forecast, ...]
    files: int
    """Files read so far."""
    no_trend: tuple[NoTrend, ...] = ()
    """Bounded metrics not forecast because a level change leaves no trend since (``rcdiag.watch.forecast``)."""

    def to_dict(self) -> dict[str, Any]:
        return finite_tree(
            {
                "kind": "step",
                **self.step.to_dict(),
                "file": self.file,
                "revised": self.revised,
                "files": self.files,
                "alerts": [a.to_dict() for a in self.alerts],
                "forecasts": [f.to_dict() for f in self.forecasts],
                "no_trend": [f.to_dict() for f in self.no_trend],
            }
        )


@dataclass(frozen=True)
class ReportEvent:
    """The whole run so far (``analyze``'s report of everything read): its verdict and findings, and the finding
    alerts that newly hold. Built after the steps' lines (it costs more as steps accumulate): after the last file
    ready, and every ``REPORT_SECONDS`` while catching up."""

    step: int | None
    """The last step read."""
    files: int
    report: Report
    alerts: tuple[Alert, ...]

    def to_dict(self) -> dict[str, Any]:
        verdict = self.report.verdict
        return finite_tree(
            {
                "kind": "report",
                "step": self.step,
                "files": self.files,
                "steps": len(self.report.steps),
                "verdict": None if verdict is None else {"status": verdict.status, "headline": verdict.headline},
                "findings": [
                    {"code": f.code, "severity": f.severity, "message": f.message} for f in self.report.findings
                ],
                "alerts": [a.to_dict() for a in self.alerts],
            }
        )


Event = StepEvent | ReportEvent
REPORT_SECONDS = 5.0
"""While files keep arriving faster than they are read, the whole report is rebuilt at most this often."""


class KeptHits:
    """``health.evaluate``'s batch hits, incrementally: each step's hits of the rules that read only its batch are
    kept until a file adds to the step; the rules that read the context (how many steps are tested) run again on
    each report, but only on a step that may fire them (``could_fire_in_context``). The findings are those of a
    full evaluation; what a report costs per step is a lookup and a comparison."""

    def __init__(self) -> None:
        self.kept: dict[int | None, tuple[tuple[Hit, ...] | None, ...]] = {}
        """Per step, each rule's hits (``None``: a context rule); tuples, the empty one shared, to keep it small."""

    def forget(self, steps: list[int]) -> None:
        for step in steps:
            self.kept.pop(step, None)

    def __call__(self, step: int | None, result: BatchResult, context: Context) -> list[Hit]:
        per_rule = self.kept.get(step)
        if per_rule is None:
            per_rule = tuple(None if rule in CONTEXT_RULES else tuple(rule(result, context)) for rule in BATCH_RULES)
            self.kept[step] = per_rule
        fires: bool | None = None
        out: list[Hit] = []
        for rule, found in zip(BATCH_RULES, per_rule, strict=True):
            if found is not None:
                out.extend(found)
                continue
            if fires is None:
                fires = could_fire_in_context(result, context.batches)
            if fires:
                out.extend(rule(result, context))
        return out


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
        self.state_path = claim_state(location, state_path)
        self.follower = Follower(location, settle)
        self.slices = SlicesSection(self.read.columns.by if self.read.columns is not None else ())
        self.state = EngineState(
            self.resolved,
            whole_dump={
                ExactState.KEY: ExactState(),
                DetectorState.KEY: DetectorState(),
                SliceRows.KEY: self.slices.new_state(),
            },
        )
        """Every step's accumulators, the exact match and the bias detectors' sums over every file read (a state saved
        before rcdiag compared bits, or ran the detectors by default, has not those, and keeps none) and every row's
        slices (per step)."""
        self.source: SourceInfo | None = None
        """Every file read, as one source (its ``reads``: each file's path, size, time, inode, fingerprint)."""
        self.screen = ScreenStats()
        self.consumed: dict[str, FileStamp] = {}
        self.alerted: dict[str, int | None] = {}
        self.log_path = log_path(self.state_path)
        self.generation: str | None = None
        """The state file's generation (the log's lines of another are stale); ``None``: no state file of this
        format yet, so the next commit writes it whole."""
        self.log_bytes = 0
        self.state_bytes = 0
        self.steps: dict[int, StepReport] = {}
        """Each step's numbers, computed once per file that adds to it (a report of every step costs more)."""
        self.device = "cpu"
        self.hits = KeptHits()
        self.report: Report | None = None
        self.last_step: int | None = None
        self.pending: list[Alert] = []
        """File alerts raised since the last report (``_changed``), shown with the next one."""
        self._load()

    # ---------------------------------------------------------------------------------------------- state file

    def _load(self) -> None:
        if not self.state_path.exists():
            return
        from rcdiag.engine.state_files import combined_info, load_state, parse_state_json, read_state_bytes

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
        state, sources, screen = load_state(name, KNOWN, "analyze")
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
        state.whole_dump.setdefault(SliceRows.KEY, self.slices.new_state())  # a state written before slices
        self.state, self.screen = analyze_state(state), screen
        self.source = combined_info(sources) if sources else None
        generation = saved.get("generation")
        self.generation = generation if isinstance(generation, str) else None  # a state of rcdiag <= 0.x: no log
        self.state_bytes = self.state_path.stat().st_size
        if self.generation is not None:
            self._replay()
        for step in self.state.batches:
            if step is not None:
                self.steps[step] = _step_report(self.state, step)
        self.last_step = max(self.steps, default=None)

    def _replay(self) -> None:
        """Apply the log's complete lines of this generation; cut a last line a kill left incomplete."""
        import json

        from rcdiag.io.outputs import write_file

        if not self.log_path.exists():
            return
        from rcdiag.io.paths import read_bytes

        name = str(self.log_path)
        data = read_bytes(name)  # a FIFO or a device is refused, never waited on
        end = data.rfind(b"\n") + 1
        number = 0
        try:
            for number, raw in enumerate(data[:end].splitlines(), 1):  # noqa: B007  (named in the error)
                line = json.loads(raw)
                if line.get("generation") == self.generation:
                    self._apply(line)
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
            raise InputError(f"line {number} is damaged ({type(exc).__name__}: {exc})", path=name) from None
        self.log_bytes = end
        if end < len(data):  # its file was not committed: it is read again
            write_file(name, data[:end])

    def _apply(self, line: dict[str, Any]) -> None:
        """One commit of the log: a file read (its steps' accumulators replace theirs), and the alerts raised."""
        from rcdiag.engine.state_files import combined_info, decode_state
        from rcdiag.runtime.fields import FieldError, dataclass_from

        if "file" in line:
            try:
                part = EngineState.from_state_dict(
                    self.resolved, decode_state({**line["counts"], "batches": line["batches"]}), KNOWN
                )
                info = dataclass_from(SourceInfo, line["source"], "source.")
                screen = dataclass_from(ScreenStats, line["screen"], "screen.")
            except FieldError as exc:
                raise ValueError(str(exc)) from None
            self.state.batches.update(part.batches)
            self.state.rows, self.state.tokens, self.state.valid_tokens = part.rows, part.tokens, part.valid_tokens
            for kind in (ExactState, DetectorState):  # the run so far's, replacing the earlier one
                if kind.KEY in line:
                    try:
                        whole = kind.from_state_dict(decode_state(line[kind.KEY]))
                    except FieldError as exc:
                        raise ValueError(str(exc)) from None
                    self.state.whole_dump[kind.KEY] = whole
            if "slices" in line:
                self._slices().replace_steps(SliceRows.from_state_dict(decode_state(line["slices"])))
            self.source = info if self.source is None else combined_info([self.source, info])
            self.screen = screen
            for item in (line["file"], *line.get("with", ())):  # "with": the other rank files of a rollout
                stamp = FileStamp.from_dict(item)
                self.consumed[stamp.name] = stamp
        self.alerted.update((str(key), step) for key, step in line["alerted"].items())

    def _commit(self, line: dict[str, Any]) -> None:
        """One line on the log (``_apply`` reads it back); the state file written whole when there is none of this
        format yet or the log has outgrown it."""
        import json

        from rcdiag.io.outputs import STATE_MODE, write_file

        if self.generation is None:
            self.compact()
            return
        data = (json.dumps({"generation": self.generation, **line}) + "\n").encode()
        write_file(self.log_path, data, mode=STATE_MODE, append=True)  # a failed append is cut back
        self.log_bytes += len(data)
        if self.log_bytes > max(self.state_bytes, COMPACT_BYTES):
            self.compact()

    def compact(self) -> None:
        """The state file written whole (accumulators, files consumed, alerts raised) with a new generation, then
        the log emptied: a kill between the two leaves a log whose lines the new state already holds, and skips."""
        from rcdiag.engine.state_files import save_state
        from rcdiag.io.outputs import STATE_MODE, write_file

        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        generation = secrets.token_hex(8)
        table = {
            "location": _canonical(self.location),
            "consumed": [stamp.to_dict() for stamp in self.consumed.values()],
            "alerted": self.alerted,
            "generation": generation,
        }
        sources = [self.source] if self.source is not None else []
        save_state(self.state_path, self.state, sources, self.screen, KNOWN, extra={WATCH_KEY: table})
        self.generation = generation
        self.state_bytes = self.state_path.stat().st_size
        if self.log_bytes or self.log_path.exists():
            write_file(self.log_path, b"", mode=STATE_MODE)
        self.log_bytes = 0

    def close(self) -> None:
        """Fold the log into the state file (so that ``rcdiag merge`` reads the whole state from it)."""
        if self.log_bytes or self.generation is None:
            self.compact()

    def _slices(self) -> SliceRows:
        """The state's slices (every row's numbers, per step: ``rcdiag.sections.slices``)."""
        slices = self.state.whole_dump[SliceRows.KEY]
        assert isinstance(slices, SliceRows)
        return slices

    def _info(self) -> SourceInfo:
        if self.source is None:
            return SourceInfo(path=self.location, format="", files=0)
        return dataclasses.replace(self.source, path=self.location, reads=[])

    # ------------------------------------------------------------------------------------------------- reading

    def poll_once(self, on_event: Callable[[Event], None] | None = None, final: bool = False) -> tuple[int, int, bool]:
        """Read every complete file (or rollout of rank files) not read yet: commit after each, then hand its steps
        to ``on_event``; after the last (and every ``REPORT_SECONDS`` before), the whole report. Returns the units
        read, how many files are still waiting, and whether a new alert at ``exit_on`` stopped the reading.
        ``final``: the directory is taken as it stands (``--once``: ``Follower.poll``)."""
        ready, waiting, changed = self.follower.poll(self.consumed, final)
        self._changed(changed)
        if self.pending and not ready:  # said now, with the report of what the state holds
            report = self.full_report()
            if on_event is not None:
                on_event(report)
            return 0, waiting, self.policy.stops(report.alerts)
        reported = time.monotonic()
        for index, unit in enumerate(ready):
            interrupts.check()
            events: list[Event] = list(self._consume(unit))
            for event in events:  # the steps' lines first: the whole report costs more as steps accumulate
                if on_event is not None:
                    on_event(event)
            if index == len(ready) - 1 or time.monotonic() - reported >= REPORT_SECONDS:
                report = self.full_report()
                reported = time.monotonic()
                if on_event is not None:
                    on_event(report)
                events.append(report)
            if any(self.policy.stops(event.alerts) for event in events):
                return index + 1, waiting, True
        return len(ready), waiting, False

    def _consume(self, unit: Ready) -> list[StepEvent]:
        from rcdiag.engine.state_files import combined_info, content_fingerprint, encode_state
        from rcdiag.io.paths import identity

        file, stamp = unit.file, unit.stamps[0]
        name = str(file)
        sections = with_defaults([TokenIdsSection(), self.slices])  # ids: history; every row's slices
        got = accumulate(name, self.config, self.read, sections=sections)
        if not self.follower.unchanged(unit):
            return []  # rewritten while read, or a rank file of its rollout appeared: read again once it settles
        for key in (ExactState.KEY, DetectorState.KEY):  # a state saved before exact match or the detectors: none
            if key not in self.state.whole_dump:
                got.state.whole_dump.pop(key, None)
        if None in got.state.batches:
            raise InputError(
                "has rows without a step (no step column, and no step in its name); a watch reports per step",
                path=name,
            )
        steps = sorted(step for step in got.state.batches if step is not None)
        read = dict(identity(name), part=None)
        if isinstance(file, Path):
            read.update(inode=list(stamp.inode) if stamp.inode else None, fingerprint=content_fingerprint(name))
        info = dataclasses.replace(got.info, reads=[read])
        revised = {step for step in steps if step in self.state.batches}
        self.state.merge(analyze_state(got.state))
        self.source = info if self.source is None else combined_info([self.source, info])
        self.screen = self.screen.merge(got.screen)
        self.consumed.update((each.name, each) for each in unit.stamps)
        self.device = got.device
        self.hits.forget(steps)
        for step in steps:
            self.steps[step] = _step_report(self.state, step)
        self.last_step = max(self.steps)
        if self.report is None:  # the metric names the rules and forecasts resolve against
            self.report = build_report(self.state, self._info(), self.device, self.screen, step_hits=self.hits)
        ordered = [self.steps[step] for step in sorted(self.steps)]
        events = []
        for step in steps:
            upto = dataclasses.replace(self.report, steps=tuple(s for s in ordered if s.step <= step))
            found = self._step_findings(upto)
            alerts, forecasts, flat = self.policy.on_step(upto, step, self.alerted, found)
            self.alerted.update((alert.key, step) for alert in alerts)
            events.append(
                StepEvent(self.steps[step], stamp.name, step in revised, tuple(alerts), tuple(forecasts),
                          len(self.consumed), tuple(flat))
            )  # fmt: skip
        state = self.state
        self._commit(
            {
                "file": stamp.to_dict(),
                "with": [each.to_dict() for each in unit.stamps[1:]],
                "source": dataclasses.asdict(info),
                "screen": self.screen.to_dict(),
                "counts": {"rows": state.rows, "tokens": state.tokens, "valid_tokens": state.valid_tokens},
                "batches": [[step, encode_state(state.batches[step].state_dict())] for step in steps],
                **{
                    key: encode_state(whole.state_dict())
                    for key, whole in state.whole_dump.items()
                    if key != SliceRows.KEY  # per step, as the batches: the whole table each time would grow
                },
                "slices": encode_state(self._slices().steps_state(list(steps))),
                "alerted": {alert.key: event.step.step for event in events for alert in event.alerts},
            }
        )  # then report: a kill between the two loses this file's lines, never counts it twice
        self._dispatch([alert for event in events for alert in event.alerts])
        return events

    def _detectors(self) -> DetectorState | None:
        """The bias detectors' sums of the run so far (``None``: a watch state saved without them)."""
        detectors = self.state.whole_dump.get(DetectorState.KEY)
        return detectors if isinstance(detectors, DetectorState) else None

    def _step_findings(self, upto: Report) -> list[Finding]:
        """The bias detectors' findings at a step: their sums of the run so far, ``mismatch_trend`` over the steps up
        to it (a run whose k3_kl climbs alerts at the step where the growth clears the fit's scatter)."""
        from rcdiag.explain.detectors import detect, mismatch_trend

        steps = [(s.step, s.metrics) for s in upto.steps]
        detectors = self._detectors()
        if detectors is not None:
            return detect(detectors, steps)
        trend = mismatch_trend(steps)
        return [] if trend is None else [trend]

    def _changed(self, changed: list[FileChange]) -> None:
        """A file alert for each file read earlier that changed or went, once per file (its key is kept in the
        state with the others): committed and delivered now, shown with the next report."""
        alerts = [file_alert(change, self.last_step, self.location) for change in changed]
        alerts = [alert for alert in alerts if alert.key not in self.alerted]
        if not alerts:
            return
        self.alerted.update((alert.key, alert.step) for alert in alerts)
        self._commit({"alerted": {alert.key: alert.step for alert in alerts}})
        self._dispatch(alerts)
        self.pending += alerts

    def full_report(self) -> ReportEvent:
        """``analyze``'s report of everything read so far, and the finding alerts new in it (after the file alerts
        raised since the last report)."""
        self.report = build_report(self.state, self._info(), self.device, self.screen, step_hits=self.hits)
        alerts = self.policy.on_report(self.report, self.last_step, self.alerted)
        earlier, self.pending = self.pending, []
        if alerts:
            self.alerted.update((alert.key, alert.step) for alert in alerts)
            self._commit({"alerted": {alert.key: alert.step for alert in alerts}})
            self._dispatch(alerts)
        return ReportEvent(self.last_step, len(self.consumed), self.report, (*earlier, *alerts))

    def _dispatch(self, alerts: list[Alert]) -> None:
        for alert in alerts:
            self.dispatcher.send(self.alert_payload(alert))

    def alert_payload(self, alert: Alert) -> dict[str, Any]:
        """The JSON an ``--on-alert`` command reads and a ``--webhook`` receives."""
        verdict = self.report.verdict if self.report is not None else None
        return finite_tree(
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
        on_event: Callable[[Event], None] | None = None,
        on_poll: Callable[[int, list[Delivery]], None] | None = None,
    ) -> str:
        """Follow the location until an end: ``"once"`` (with ``once``, nothing left to read), ``"timeout"``,
        ``"idle"`` (``max_idle`` seconds without a new file, read or waiting) or ``"alert"`` (a new alert at
        ``exit_on``).
        ``on_event`` sees each step after its commit, and each whole report; ``on_poll`` the files still settling
        and the deliveries finished since the last poll."""
        start = last_new = time.monotonic()
        was_waiting = 0
        while True:
            read, waiting, stopped = self.poll_once(on_event, final=once)
            if on_poll is not None:
                on_poll(waiting, self.dispatcher.outcomes())
            if stopped:
                return "alert"
            now = time.monotonic()
            if timeout is not None and now - start >= timeout:
                return "timeout"
            if waiting != was_waiting:  # a file appeared (settling, or a rank file waiting for its rollout)
                last_new, was_waiting = now, waiting
            if read:
                last_new = now
                continue  # more may have landed meanwhile
            if once and waiting == 0:
                return "once"
            if max_idle is not None and now - last_new >= max_idle:
                return "idle"
            time.sleep(poll)


def _step_report(state: EngineState, step: int) -> StepReport:
    """One step's numbers, as ``build_report`` computes them."""
    result = state.batches[step].compute()
    return StepReport(step, result.rows, result.valid_tokens, result.metrics, result.extras)


def _canonical(location: str) -> str:
    text = storage.local_path(location)
    return text.rstrip("/") if storage.is_remote(text) else str(Path(text).resolve())
