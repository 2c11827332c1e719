"""Micro-batches as a section (``rcdiag.sections``): every row kept by step while the dump is read (one process),
each step split as verl's actor does and simulated (the record ``rcdiag.records.report.MicroBatchReport``, JSON
``microbatch``, docs/json.md), and its findings."""

from __future__ import annotations

from typing import ClassVar

from rcdiag.catalogue.emit import emit
from rcdiag.microbatch.plan import MicroBatchSettings
from rcdiag.microbatch.rows import MicroBatchRows, StepRows
from rcdiag.microbatch.simulate import simulate_step
from rcdiag.records.report import LEGACY_ASSERT, Finding, MicroBatchPath, MicroBatchReport, StepMicroBatches
from rcdiag.sections.base import PlainSection, RunFacts
from rcdiag.settings.correction import ResolvedConfig


class MicroBatchSection(PlainSection):
    """``analyze`` with micro-batch options (``rcdiag.MicroBatchSettings``): what verl computes and where it crashes
    per micro-batch. Keeps every valid token until the run ends, in one process; its state is not saved
    (``--save-state``): a state file would hold every token."""

    KEY: ClassVar[str] = MicroBatchRows.KEY
    STATE = MicroBatchRows
    SAVED = False
    ONE_PROCESS = "micro-batch options"

    def __init__(self, settings: MicroBatchSettings | None = None) -> None:
        self.settings = settings or MicroBatchSettings()

    def new_state(self) -> MicroBatchRows:
        return MicroBatchRows(self.settings)

    def record(self, state: MicroBatchRows | None, run: RunFacts) -> MicroBatchReport | None:
        if state is None:
            return None
        if state.simulated is None:
            state.simulated = simulate(state.steps(), run.resolved, state.settings)
        return state.simulated

    def findings(self, state: MicroBatchRows | None, run: RunFacts) -> list[Finding]:
        report = self.record(state, run)
        return [] if report is None else findings(report)


def findings(report: MicroBatchReport) -> list[Finding]:
    """The crashes of the path this configuration takes, and the splits verl refuses, each naming the first."""
    out: list[Finding] = []
    refused = [s for s in report.steps if s.refused is not None]
    if refused:
        first = refused[0]
        out.append(_finding("verl_refuses_microbatch_setup", refused, f"verl refuses this split: {first.refused}"))
    if report.path == "legacy_actor":
        hit = [s for s in report.steps if s.legacy_crashes]
        if hit:
            where, micro = hit[0].legacy_crashes[0]
            why = (
                f"RS rejects all {micro.n_valid_tokens} of its valid tokens"
                if micro.n_valid_tokens
                else "it has no valid token at all"
            )
            message = (
                f"{where.describe()} (rows {_rows(micro.rows)}): {why}, and verl <= 0.7.1's actor computes the "
                f"off-policy metrics per micro-batch: {LEGACY_ASSERT}"
            )
            out.append(_finding("verl_crash_microbatch_all_rejected", hit, message, _count(hit, legacy=True)))
    if report.path == "bypass":
        hit = [s for s in report.steps if s.bypass_crashes]
        if hit:
            where, micro = hit[0].bypass_crashes[0]
            message = f"{where.describe()} (rows {_rows(micro.rows)}): bypass mode raises {micro.bypass_crash}"
            out.append(_finding("verl_crash_microbatch_empty", hit, message, _count(hit, legacy=False)))
    return out


def _rows(rows: tuple[int, ...]) -> str:
    return ", ".join(map(str, rows[:8])) + (", ..." if len(rows) > 8 else "")


def _count(steps: list[StepMicroBatches], legacy: bool) -> float:
    return float(sum(len(s.legacy_crashes if legacy else s.bypass_crashes) for s in steps))


def _finding(code: str, steps: list[StepMicroBatches], message: str, value: float | None = None) -> Finding:
    numbered = tuple(int(s.step) for s in steps if s.step is not None)
    where = f"at {len(numbered)} step{'s' if len(numbered) != 1 else ''}, first " if numbered else ""
    return emit(code, f"{where}{message}", value=value, steps=numbered or None)


def path_of(resolved: ResolvedConfig) -> MicroBatchPath:
    """Which per-micro-batch path verl runs under this configuration and release."""
    if resolved.config.bypass_mode:
        return "bypass"
    return "legacy_actor" if resolved.version.legacy_actor else "driver"


def simulate(
    steps: dict[int | None, StepRows], resolved: ResolvedConfig, settings: MicroBatchSettings
) -> MicroBatchReport:
    """Split every step as verl would and simulate both paths."""
    simulated = tuple(simulate_step(step, rows, resolved, settings) for step, rows in steps.items())
    return MicroBatchReport(settings.to_dict(), path_of(resolved), simulated)
