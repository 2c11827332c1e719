"""A read state -> the typed report: every batch computed, the all-steps view, each section's record and every
finding, the checklist and the verdict. Writes nothing (a section's files: ``rcdiag.api.analysis.write_sections``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from rcdiag._version import __version__
from rcdiag.catalogue.checklist import checklist
from rcdiag.catalogue.emit import ordered
from rcdiag.diagnosis.health import StepHits, batch_hits, evaluate
from rcdiag.diagnosis.signature_rules import signature_findings
from rcdiag.diagnosis.verdict import judge
from rcdiag.engine.stream import EngineState, StepStates
from rcdiag.explain.detector_section import DetectorSection
from rcdiag.explain.section import ExplainSection
from rcdiag.io.base import SourceInfo
from rcdiag.io.screen import ScreenStats
from rcdiag.microbatch.section import MicroBatchSection
from rcdiag.records.report import Finding, InputFacts, Report, StepReport
from rcdiag.runtime.errors import ConfigError
from rcdiag.sections import RunFacts, Section
from rcdiag.sections.base import Values, ValuesRecord


def analyze_state(state: StepStates[Any]) -> EngineState:
    """``state`` as analyze's (a sweep's state makes a sweep report, not this one: ``rcdiag.api.sweeping``)."""
    if not isinstance(state, EngineState):
        raise ConfigError(
            "these are states of `rcdiag sweep --save-state`: merge them with `rcdiag merge` (a sweep report)"
        )
    return state


def build_report(
    state: EngineState,
    info: SourceInfo,
    device: str,
    screen: ScreenStats | None = None,
    *,
    sections: Sequence[Section] = (),
    step_hits: StepHits = batch_hits,
) -> Report:
    """Compute every batch, the all-steps view, each section's record and every finding. ``sections``: the run's
    (``rcdiag.sections``); a state it holds that no section given reads (a merged state file's) is read by its
    registered kind's defaults (``rcdiag.sections.registry``). Writes nothing (``write_sections``). ``step_hits``:
    ``health.evaluate``'s (``rcdiag watch`` keeps steps' hits)."""
    has_steps = any(step is not None for step in state.batches)
    per_step = sorted(
        ((step, batch.compute()) for step, batch in state.batches.items()),
        key=lambda item: (item[0] is None, item[0] or 0),
    )
    pooled = per_step[0][1] if not has_steps and per_step else state.pooled().compute()
    steps = tuple(
        StepReport(int(step), result.rows, result.valid_tokens, result.metrics, result.extras)
        for step, result in per_step
        if step is not None
    )
    facts = input_facts(state, info, screen)
    findings: list[Finding] = evaluate(
        per_step if per_step else [(None, pooled)], state.resolved, facts, step_hits=step_hits
    )
    findings.extend(signature_findings(pooled.metrics, pooled.extras, state.valid_tokens))
    stepped = [(step, result.metrics) for step, result in per_step if step is not None]
    run = RunFacts(state.resolved, pooled.metrics, pooled.extras, stepped, facts)
    from rcdiag.sections.registry import sections_for

    records: dict[str, Any] = {}
    for section in sections_for(state.whole_dump, sections):
        whole = state.whole_dump.get(section.KEY)
        record = section.record(whole, run)
        if record is not None:
            records[section.KEY] = record
        findings.extend(section.findings(whole, run))
    if not {ExplainSection.KEY, DetectorSection.KEY} & set(state.whole_dump):  # a state without the detectors'
        from rcdiag.explain.detectors import mismatch_trend  # sums: the trend reads only the per-step metrics

        trend = mismatch_trend(stepped)
        findings.extend([] if trend is None else [trend])
    findings = ordered(findings)
    explain = records.pop(ExplainSection.KEY, None)
    microbatch = records.pop(MicroBatchSection.KEY, None)
    metrics, extras = pooled.metrics, pooled.extras
    for record in records.values():
        if isinstance(record, ValuesRecord):  # a framework's own keys (--as NAME) first, per step and pooled
            metrics, extras = {**record.pooled.metrics, **metrics}, {**extras, **record.pooled.extras}
            steps = tuple(_with_values(step, record.step_metrics(step.step)) for step in steps)
    detectors = records.pop(DetectorSection.KEY, None)
    not_run = explain.not_run if explain is not None else None if detectors is None else detectors.not_run
    report = Report(
        config=state.resolved,
        input=facts,
        metrics=metrics,
        extras=extras,
        steps=steps,
        findings=tuple(findings),
        device=device,
        version=__version__,
        log_ratio=pooled.log_ratio,
        explain=explain,
        detectors=detectors,
        microbatch=microbatch,
        sections=records,
        checklist=checklist(findings, pooled.metrics, not_run),
    )
    return dataclasses.replace(report, verdict=judge(report))


def record_of(report: Report, key: str) -> Any:
    """A section's record in ``report``: a typed field for ``--explain``, the detectors and the micro-batches,
    ``Report.sections[key]`` for every other section."""
    typed: dict[str, Any] = {ExplainSection.KEY: report.explain, DetectorSection.KEY: report.detectors}
    typed[MicroBatchSection.KEY] = report.microbatch
    return typed[key] if key in typed else report.sections.get(key)


def _with_values(step: StepReport, values: Values) -> StepReport:
    """A step with a section's values beside verl's (its keys first) and rcdiag's."""
    return dataclasses.replace(
        step, metrics={**values.metrics, **step.metrics}, extras={**step.extras, **values.extras}
    )


def input_facts(state: StepStates[Any], info: SourceInfo, screen: ScreenStats | None = None) -> InputFacts:
    """What was read: the dump's description and the counts the state holds."""
    steps = sum(step is not None for step in state.batches)
    return InputFacts(
        path=info.path,
        format=info.format,
        rows=state.rows,
        tokens=state.tokens,
        valid_tokens=state.valid_tokens,
        empty_rows=sum(batch.empty_rows for batch in state.batches.values()),
        steps=steps,
        skipped_rows=screen.skipped_rows if screen else 0,
        columns=dict(info.columns),
        dtypes=dict(info.dtypes),
        metadata=dict(info.metadata),
        skipped_by_reason=dict(screen.skipped_by_reason) if screen else {},
        neg_inf_tokens=dict(screen.neg_inf_tokens) if screen else {},
        files=info.files,
        step_source=info.step_source if steps else "",
        neg_inf_first=dict(screen.neg_inf_first) if screen else {},
    )
