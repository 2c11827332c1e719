"""The sweep's report from its state: analyze's verdict on the same state and the advice that agrees with it, every
row (pooled and per step), the recommendations, the bias detectors', the ``--as`` framework's and the crash
findings, and verl's presets ranked. The library reads the dump and builds analyze's report of it
(``rcdiag.api.sweeping``)."""

from __future__ import annotations

from rcdiag.catalogue import finding
from rcdiag.catalogue.emit import emit
from rcdiag.catalogue.findings import Code
from rcdiag.explain.detector_state import DetectorState
from rcdiag.explain.detectors import detect_sums
from rcdiag.records.report import Finding, InputFacts, Report
from rcdiag.settings.correction import router_replay_mode
from rcdiag.sweep.advice import advise
from rcdiag.sweep.recommend import place_on_grid, recommend
from rcdiag.sweep.state import PointResult, SweepState
from rcdiag.sweep.sweep_report import SweepReport, SweepRow, rank_presets


def build_sweep_report(
    state: SweepState, facts: InputFacts, device: str, min_ess: float, analysis: Report | None = None
) -> SweepReport:
    """Compute every row (pooled and per step), the recommendations, the crash findings and the preset ranking;
    with ``analysis`` (analyze's report of the same state: ``SweepState.analyzed``), its verdict, its bias detectors'
    findings and the advice that agrees with the verdict (``rcdiag.sweep.advice``). Consumes the state: each step's
    batch is dropped once its rows are computed (the pooled rows first), so the states and the rows they give are
    not all held at once."""
    target = state.target_reject
    recommendations = recommend(state.collector, target) if state.collector and target is not None else None
    stepped = any(step is not None for step in state.batches)
    pooled: dict[tuple[str, str], PointResult] | None = state.pooled().compute() if stepped else None
    per_step = [
        (step, state.batches.pop(step).compute())
        for step in sorted(state.batches, key=lambda step: (step is None, step or 0))
    ]
    if pooled is None:
        pooled = per_step[0][1] if per_step else state.pooled().compute()
    specs = {(option, point.spec): point.is_spec for option, points in state.grid.options for point in points}
    rows = []
    for key, point in pooled.items():
        steps = tuple((int(step), result[key].metrics) for step, result in per_step if step is not None)
        crash_steps = tuple(int(step) for step, result in per_step if step is not None and result[key].crashes)
        crashes = point.crashes or next((result[key].crashes for _, result in per_step if result[key].crashes), ())
        rows.append(SweepRow(key[0], key[1], point.metrics, steps, crashes, crash_steps, specs[key]))
    aimed = target if recommendations is not None else None
    presets = tuple(rank_presets(rows, min_ess, state.grid.verl_version, router_replay_mode(facts.metadata)))
    verdict = None if analysis is None else analysis.verdict
    advice = None
    if verdict is not None:
        advice, presets = advise(verdict, presets, aimed)
    return SweepReport(
        rows=tuple(rows),
        recommendations=tuple(place_on_grid(recommendations or (), rows, target, state.grid.verl_version)),
        target_reject=aimed,
        presets=presets,
        min_ess=min_ess,
        input=facts,
        findings=(*_detector_findings(state, analysis), *_framework_findings(analysis), *_crash_findings(rows)),
        device=device,
        verl_version=state.grid.verl_version,
        verdict=verdict,
        advice=advice,
    )


def _detector_findings(state: SweepState, analysis: Report | None) -> list[Finding]:
    """The bias detectors' findings: analyze's (``mismatch_trend`` included), else those read from the sums alone;
    none from a state without their sums."""
    if analysis is not None:
        return [f for f in analysis.findings if finding(f.code).detects is not None]
    detectors = state.whole_dump.get(DetectorState.KEY)
    return detect_sums(detectors) if isinstance(detectors, DetectorState) else []


def _framework_findings(analysis: Report | None) -> list[Finding]:
    """Under ``sweep --as NAME``, analyze's ``framework_drops_gradient`` on the same pass: NAME's own correction
    judged, as ``analyze --as NAME`` judges it."""
    return [] if analysis is None else [f for f in analysis.findings if f.code == Code.FRAMEWORK_DROPS_GRADIENT]


def _crash_findings(rows: list[SweepRow]) -> list[Finding]:
    """One finding per row where verl would crash at that threshold; an empty batch crashes verl whatever the
    threshold, so it is one finding for the sweep."""
    findings: list[Finding] = []
    empty_seen = False
    for row in rows:
        for crash in row.crashes:
            empty = crash.code == "verl_crash_empty_batch"
            if empty and empty_seen:
                continue
            empty_seen = empty_seen or empty
            where = "" if empty else f"{row.option} at {row.threshold}: "
            findings.append(emit(crash.code, where + crash.message, metric=crash.metric, steps=row.crash_steps or None))
    return findings
