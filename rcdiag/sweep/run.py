"""Library entry points of the sweep: read a dump once into a ``SweepState``, then build the report (analyze's
verdict on the same state, its rows, the recommendations, the crash findings and the presets ranked) from it."""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rcdiag.api import (
    ProgressCallback,
    accumulate,
    analyze_state,
    build_report,
    complete_verdict,
    with_defaults,
)
from rcdiag.backend import Backend, get_backend
from rcdiag.catalogue import finding
from rcdiag.catalogue.emit import emit
from rcdiag.config import CorrectionConfig, router_replay_mode
from rcdiag.engine import Engine
from rcdiag.errors import ConfigError
from rcdiag.explain.detector_state import DetectorState
from rcdiag.explain.detectors import detect_sums
from rcdiag.frameworks.registry import framework as framework_named
from rcdiag.frameworks.section import SettingsSection
from rcdiag.frameworks.speak import chosen as spoken_chosen
from rcdiag.frameworks.speak import effect_of, speak
from rcdiag.io import Chunk
from rcdiag.io.base import SourceInfo
from rcdiag.options import ReadOptions
from rcdiag.parallel import new_wholes
from rcdiag.report import Finding, FrameworkSetting, InputFacts, Report
from rcdiag.sweep.accumulated import PointResult, SweepState, new_sweep_state
from rcdiag.sweep.advice import advise
from rcdiag.sweep.grid import SweepGrid, build_grid
from rcdiag.sweep.recommend import place_on_grid, recommend, verl_config
from rcdiag.sweep.sweep_report import SweepReport, SweepRow, rank_presets
from rcdiag.validate import Screen, as_chunk


def _new_state(specs: dict[str, list[str]], version: str, target_reject: float | None) -> SweepState:
    return new_sweep_state(SweepGrid.from_specs(specs, version), target_reject)


def sweep(
    path: str | Path,
    grid: SweepGrid | None = None,
    read: ReadOptions | None = None,
    *,
    on_chunk: ProgressCallback | None = None,
    save_state: str | Path | None = None,
    target_reject: float | None = 0.01,
    min_ess: float = 0.0,
    framework: str | None = None,
    **options: Any,
) -> SweepReport:
    """Every option of ``grid`` (default: both IS levels and all 11 RS options over the default grids) at every
    threshold, in one pass over the dump; with ``target_reject``, the recommended threshold per option (from the
    same pass, docs/sweep.md); and verl's presets ranked (``min_ess``: those leaving a lower ESS last).

    ``read`` (or its fields as keywords) says how to read the dump, as for ``rcdiag.analyze``. Each row's
    metrics equal ``rcdiag.analyze`` with that single option at that threshold. With ``framework`` (an ``--as``
    name other than verl), each recommendation is also given in that framework's settings, its effect measured
    under its semantics in one more pass (``speak_recommendations``).
    """
    grid = grid or build_grid()
    read = ReadOptions.of(read, options)
    if read.columns is not None and read.columns.by:
        raise ConfigError(
            "--by breaks analyze's mismatch down by a column (analyze, check, compare, watch); a sweep scans "
            "thresholds over the whole dump: run it without --by"
        )
    new_state = functools.partial(_new_state, grid.specs(), grid.verl_version, target_reject)
    sections = with_defaults(())  # the sections every analyze runs: the verdict reads them
    accumulated = accumulate(
        path,
        CorrectionConfig(verl_version=grid.verl_version),
        read,
        on_chunk=on_chunk,
        save_state=save_state,
        new_state=new_state,
        sections=sections,
    )
    state = accumulated.state
    assert isinstance(state, SweepState)
    device = accumulated.device
    analysis = build_report(state.analyzed(), accumulated.info, device, accumulated.screen, sections=sections)
    report = build_sweep_report(state, analysis.input, device, min_ess, complete_verdict(analysis, path, read))
    return report if framework is None else speak_recommendations(report, path, framework, read)


def speak_recommendations(
    report: SweepReport, path: str | Path, name: str, read: ReadOptions | None = None
) -> SweepReport:
    """``report``'s recommendations also in framework ``name``'s settings (``rcdiag.frameworks.speak``), each one
    that is a setting to paste, all measured on the dump at ``path`` in one pass under that framework's semantics;
    ``--as verl`` changes nothing."""
    chosen = framework_named(name)
    if chosen.name == "verl":
        return report
    spoken = [
        speak(verl_config(rec.option, rec.threshold), chosen.name) if rec.threshold and rec.yaml else None
        for rec in report.recommendations
    ]
    measured = measure_settings(spoken, path, read)
    recommendations = tuple(
        dataclasses.replace(rec, framework=setting)
        for rec, setting in zip(report.recommendations, measured, strict=True)
    )
    return dataclasses.replace(report, recommendations=recommendations, framework=chosen.label)


def measure_settings(
    settings: list[FrameworkSetting | None], path: str | Path, read: ReadOptions | None = None
) -> list[FrameworkSetting | None]:
    """Each setting with its effect on the dump, all run in one pass (``SettingsSection``); one with nothing alike
    keeps no effect."""
    runs = [(i, c) for i, s in enumerate(settings) if s is not None and (c := spoken_chosen(s)) is not None]
    if not runs:
        return settings
    section = SettingsSection(tuple(c for _, c in runs))
    with warnings.catch_warnings(record=True):  # the sweep's own pass told the user about the dump
        again = accumulate(path, None, read, sections=[section])
    report = build_report(analyze_state(again.state), again.info, again.device, again.screen, sections=[section])
    out = list(settings)
    for (i, _), pooled in zip(runs, report.sections[SettingsSection.KEY].values, strict=True):
        setting = out[i]
        assert setting is not None
        out[i] = dataclasses.replace(setting, effect=effect_of(setting.name, pooled.extras))
    return out


def sweep_chunks(
    chunks: Iterable[Chunk],
    grid: SweepGrid | None = None,
    read: ReadOptions | None = None,
    *,
    target_reject: float | None = 0.01,
    min_ess: float = 0.0,
    **options: Any,
) -> SweepReport:
    """Like ``sweep`` but over chunks you built yourself; of ``read``, ``device`` and ``on_bad_row`` apply."""
    state = new_sweep_state(grid or build_grid(), target_reject)
    read = ReadOptions.of(read, options)
    backend = read.device if isinstance(read.device, Backend) else get_backend(read.device)
    screen = Screen(read.on_bad_row)
    sections = with_defaults(())
    engine = Engine(state.resolved, backend, new_wholes(sections), state=state)
    engine.run(screen(as_chunk(chunk, i) for i, chunk in enumerate(chunks)))
    info = SourceInfo(path="<memory>", format="chunks")
    analysis = build_report(state.analyzed(), info, backend.name, screen.stats, sections=sections)
    return build_sweep_report(state, analysis.input, backend.name, min_ess, analysis)


def merge_sweep_states(paths: list[str | Path], min_ess: float = 0.0) -> SweepReport:
    """The sweep of one run over every shard whose ``rcdiag sweep --save-state`` files are given; recommendations
    (at the target the states were written with) when every state carries what they need."""
    from rcdiag.sections.registry import load_kinds
    from rcdiag.state import combined_info, merge_state_files

    load_kinds()
    state, sources, stats = merge_state_files(paths, "sweep")
    assert isinstance(state, SweepState)  # merge_state_files refused any other kind
    analysis = build_report(state.analyzed(), combined_info(sources), "merged", stats)
    return build_sweep_report(state, analysis.input, "merged", min_ess, analysis)


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
    rows = []
    for key, point in pooled.items():
        steps = tuple((int(step), result[key].metrics) for step, result in per_step if step is not None)
        crash_steps = tuple(int(step) for step, result in per_step if step is not None and result[key].crashes)
        crashes = point.crashes or next((result[key].crashes for _, result in per_step if result[key].crashes), ())
        rows.append(SweepRow(key[0], key[1], point.metrics, steps, crashes, crash_steps))
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
        findings=(*_detector_findings(state, analysis), *_crash_findings(rows)),
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
