"""``rcdiag watch``: follow a run's dump directory live (docs/watch.md)."""

from __future__ import annotations

import enum
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rcdiag.catalogue.metrics import packs_help
from rcdiag.cli.flags import ENGINE_FLAGS, READ_FLAGS, path_argument
from rcdiag.cli.params import checked_option, choice_flag, with_flags
from rcdiag.cli.rule_flags import bound_option, fail_on_option, pack_option, rules_option
from rcdiag.cli.tracking import TRACKING_FLAGS
from rcdiag.runtime.errors import ExitCode, RcdiagError
from rcdiag.runtime.option_checks import count, duration

if TYPE_CHECKING:
    from rcdiag.cli.engine_config import EngineFlags
    from rcdiag.export.tracking import Tracker, TrackingOptions
    from rcdiag.render.watch_table import WatchScreen
    from rcdiag.settings.reading import ReadOptions
    from rcdiag.watch import Delivery, Watch
    from rcdiag.watch.session import Event

FOLLOW = "Following"
ALERTS = "Alerts"


class WatchFormat(str, enum.Enum):
    """``--format`` choices of ``watch``."""

    table = "table"
    json = "json"


class ExitOn(str, enum.Enum):
    """``--exit-on`` choices."""

    warning = "warning"
    error = "error"


def _seconds(flag: str, help_text: str, panel: str = FOLLOW) -> Any:
    return Annotated[
        float | None,
        typer.Option(flag, metavar="SECONDS", **checked_option(duration()), help=help_text, rich_help_panel=panel),
    ]


@with_flags(ENGINE_FLAGS, READ_FLAGS, TRACKING_FLAGS)
def watch(
    path: Annotated[
        str,
        path_argument("DIR", "The directory (or s3://, gs://, hdfs:// prefix) the trainer writes per-step dumps into."),
    ],
    state: Annotated[
        str | None,
        typer.Option(
            "--state",
            metavar="FILE",
            help="The watch's state (accumulators, files read, alerts raised) and its log `FILE.log`, one line "
            "appended per file; a restart resumes from them. Default: `.rcdiag-watch/NAME.json` beside DIR.",
            rich_help_panel=FOLLOW,
            show_default=False,
        ),
    ] = None,
    output_format: Annotated[
        WatchFormat,
        typer.Option(
            "--format",
            **choice_flag(WatchFormat),
            help="`table`: a live view on a terminal, one line per step otherwise; `json`: one JSON object per step "
            "per line (flushed).",
        ),
    ] = WatchFormat.table,
    poll: Annotated[
        float,
        typer.Option(
            "--poll",
            metavar="SECONDS",
            **checked_option(duration(0.01)),
            help="Seconds between listings.",
            rich_help_panel=FOLLOW,
        ),
    ] = 0.5,
    settle: Annotated[
        float,
        typer.Option(
            "--settle",
            metavar="SECONDS",
            **checked_option(duration()),
            help="A file not written by DumpWriter is read once its size and modification time have not changed "
            "for this long (DumpWriter's parts appear whole, by rename). 0: read files as soon as they appear.",
            rich_help_panel=FOLLOW,
        ),
    ] = 2.0,
    once: Annotated[
        bool,
        typer.Option(
            "--once", help="Read what is there (waiting for files to settle) and exit.", rich_help_panel=FOLLOW
        ),
    ] = False,
    timeout: _seconds("--timeout", "Exit (0) after this long.") = None,  # type: ignore[valid-type]
    max_idle: _seconds("--max-idle", "Exit (0) after this long without a new file (read, settling or waiting).") = None,  # type: ignore[valid-type]
    max_rules: bound_option(  # type: ignore[valid-type]
        "--max", "Alert when a metric goes above, e.g. `kl=1e-2` (and forecast the crossing).", ALERTS
    ) = None,
    min_rules: bound_option(  # type: ignore[valid-type]
        "--min", "Alert when a metric goes below, e.g. `rollout_is_eff_sample_size=0.8`.", ALERTS
    ) = None,
    max_abs_rules: bound_option(  # type: ignore[valid-type]
        "--max-abs", "Alert when a metric's absolute value goes above, e.g. `kl=0.1`.", ALERTS
    ) = None,
    packs: pack_option(  # type: ignore[valid-type]
        f"Rule pack: {packs_help()}; or `analyze` (alert on every warning or error finding). Repeatable.", ALERTS
    ) = None,
    fail_on: fail_on_option(  # type: ignore[valid-type]
        "Findings that alert: a severity and/or finding codes, as for `check`. Default: `warning`.", ALERTS
    ) = None,
    rules_file: rules_option(  # type: ignore[valid-type]
        "TOML rules, as for `check` (docs/check.md); relative rules (a baseline) and `exact = true` are refused.",
        ALERTS,
    ) = None,
    on_alert: Annotated[
        str | None,
        typer.Option(
            "--on-alert",
            metavar="CMD",
            help="Run CMD (through the shell) with each new alert's JSON on stdin; its failure is reported, not fatal.",
            rich_help_panel=ALERTS,
            show_default=False,
        ),
    ] = None,
    webhook: Annotated[
        str | None,
        typer.Option(
            "--webhook",
            metavar="URL",
            help="POST each new alert's JSON to URL (retried with backoff, in the background).",
            rich_help_panel=ALERTS,
            show_default=False,
        ),
    ] = None,
    exit_on: Annotated[
        ExitOn | None,
        typer.Option(
            "--exit-on",
            **choice_flag(ExitOn),
            help="Stop with exit 1 on a new alert of this severity or worse (rules fail as `error`, forecasts warn).",
            rich_help_panel=ALERTS,
            show_default=False,
        ),
    ] = None,
    horizon: Annotated[
        int,
        typer.Option(
            "--forecast-horizon",
            metavar="STEPS",
            **checked_option(count(1)),
            help="Alert when a bounded metric's trend is expected to cross its bound within this many steps.",
            rich_help_panel=ALERTS,
        ),
    ] = 50,
    *,
    engine: EngineFlags,
    read: ReadOptions,
    tracking: TrackingOptions | None,
) -> None:
    """Follow DIR while a trainer writes dumps into it: read each new complete file once, report every step as
    `rcdiag analyze DIR` would, and alert on findings, rule failures and forecast crossings.

    * `rcdiag watch dumps/run-42 --max kl=1e-2 --on-alert 'mail -s rcdiag me@lab'`
    * `rcdiag watch dumps/run-42 --format json --pack verl --webhook http://127.0.0.1:9000/hook`
    * `rcdiag watch dumps/run-42 --max k3_kl=1e-3 --exit-on error` (exit 1 at the first failing step)
    * `rcdiag watch dumps/run-42 --once` (read what is there, then exit)
    * `rcdiag watch dumps/run-42 --tensorboard tb/run-42/rcdiag` (each step's values as TensorBoard scalars)

    Exit codes: 0 ended by --once, --timeout or --max-idle, 1 a new alert at --exit-on, 2 bad option or input,
    3 internal error, 130 Ctrl-C (the state holds every step reported).
    """
    from rcdiag.check import load_rules
    from rcdiag.check.rule_set import rule_set
    from rcdiag.watch import AlertPolicy, Dispatcher, Watch
    from rcdiag.watch.alerts import DEFAULT_GATE
    from rcdiag.watch.deliver import DRAIN_SECONDS
    from rcdiag.watch.session import claim_state

    claim_state(path, state)  # before the rules file is read: a --state over it is refused
    loaded = load_rules(rules_file) if rules_file is not None else None
    if loaded is not None and loaded.exact:
        from rcdiag.runtime.errors import ConfigError

        raise ConfigError(
            f"{rules_file}: exact = true is check's gate (--exact); a watch reports the exact match in its report "
            "but raises no alert on it: leave it out of the rules the watch reads"
        )
    bounds = {"max": max_rules, "min": min_rules, "max_abs": max_abs_rules}
    ruled = rule_set(bounds, packs, fail_on, loaded)
    config = engine.config(base=loaded.config() if loaded is not None else None)
    policy = AlertPolicy(ruled.rules, ruled.gate or DEFAULT_GATE, exit_on.value if exit_on else None, horizon)
    session = Watch(
        path, config, read, state_path=state, settle=settle, policy=policy, dispatcher=Dispatcher(on_alert, webhook)
    )
    view = _view(output_format.value, session)
    trackers = _open_trackers(tracking, path, resume=bool(session.consumed))
    on_event = _tracked(view.event, trackers) if trackers else view.event
    ended = "aborted"
    try:
        with view:
            ended = session.run(
                poll=poll, once=once, timeout=timeout, max_idle=max_idle, on_event=on_event, on_poll=view.poll
            )
        session.close()  # the log folded into the state file (after a signal the log keeps it: nothing is written)
    except RcdiagError:
        session.close()  # a file that cannot be read stops the watch: what was read before stays, whole
        raise
    finally:
        for outcome in session.dispatcher.close(wait=0.0 if ended == "aborted" else DRAIN_SECONDS):
            _say_delivery(outcome)
        if trackers:
            from rcdiag.export.tracking import close_all

            close_all(trackers, quietly=ended == "aborted")
    if ended == "alert":
        raise typer.Exit(ExitCode.CHECK_FAILED)


def _view(format_name: str, session: Watch) -> _View:
    """The format's live screen on a terminal where it has one, else its line renderer."""
    from rcdiag.render.registry import FORMATS, renderer

    live = FORMATS[format_name].renderers.get("watch")
    if live is not None and sys.stdout.isatty():
        return _LiveView(live.load()(session.location, session.consumed))
    return _View(renderer(format_name, "watch_line", "watch").load())


def _open_trackers(tracking: TrackingOptions | None, path: str, *, resume: bool) -> list[Tracker]:
    """``--tensorboard`` / ``--mlflow``, opened before the first step (``--tensorboard`` was refused inside the
    watched directory, where an event file would be read as a dump: rcdiag.io.outputs.Ledger); ``resume`` (the state
    holds files read): TensorBoard continues the latest run of its directory, whose steps this watch logged."""
    if tracking is None:
        return []
    return tracking.open(run_name=Path(path.rstrip("/")).name or path, resume=resume)


def _tracked(on_event: Any, trackers: list[Tracker]) -> Any:
    """The view's event handler, and each new or revised step's values logged to the trackers at once."""
    from rcdiag.watch import StepEvent

    def handle(event: Event) -> None:
        if isinstance(event, StepEvent):
            values = {**event.step.metrics, **event.step.extras}
            for tracker in trackers:
                tracker.log_step(event.step.step, values)
                tracker.flush()
        on_event(event)

    return handle


def _say_delivery(outcome: Delivery) -> None:
    if not outcome.ok:
        print(f"rcdiag: alert {outcome.key}: {outcome.target} failed: {outcome.detail}", file=sys.stderr, flush=True)


class _View:
    """Writes each event as the format's line renderer gives it (``rcdiag.render.registry``, kind ``watch_line``)."""

    def __init__(self, line: Callable[[Event], str]) -> None:
        self.line = line

    def __enter__(self) -> _View:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def event(self, event: Event) -> None:
        from rcdiag.cli.output import write_stdout

        write_stdout(self.line(event))

    def poll(self, waiting: int, outcomes: list[Delivery]) -> None:
        for outcome in outcomes:
            _say_delivery(outcome)


class _LiveView(_View):
    """The live view on a terminal: the registry's ``watch`` screen, redrawn on every event and settling count."""

    def __init__(self, screen: WatchScreen) -> None:
        self.screen = screen
        self.live: Any = None

    def __enter__(self) -> _LiveView:
        from rich.live import Live

        from rcdiag.cli.console import stdout_console

        self.live = Live(self.screen.render(), console=stdout_console(), refresh_per_second=4, transient=False)
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(*exc)

    def event(self, event: Event) -> None:
        self.screen.add(event)
        self.live.update(self.screen.render())

    def poll(self, waiting: int, outcomes: list[Delivery]) -> None:
        super().poll(waiting, outcomes)
        if waiting != self.screen.waiting:
            self.screen.waiting = waiting
            self.live.update(self.screen.render())
