"""``rcdiag.sweep.sweep``: a dump read once into a ``SweepState`` (``rcdiag.sweep``) through the engine entry every
command uses (``rcdiag.api.reading``), analyze's verdict built from the same state (the sections every analyze runs,
ridden on the same pass; its second pass, ``rcdiag.api.second_pass``), then the sweep's report built from both
(``rcdiag.sweep.build``); under ``--as NAME`` its recommendations also in that framework's settings, measured in one
more pass."""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rcdiag.api.analysis import framework_sections, with_defaults
from rcdiag.api.progress import ProgressCallback
from rcdiag.api.reading import Accumulated, accumulate, accumulate_chunks, merge_files
from rcdiag.api.report import analyze_state, build_report
from rcdiag.api.second_pass import complete_verdict
from rcdiag.frameworks.registry import framework as framework_named
from rcdiag.frameworks.section import SettingsSection
from rcdiag.frameworks.speak import chosen as spoken_chosen
from rcdiag.frameworks.speak import effect_of, speak
from rcdiag.io import Chunk
from rcdiag.records.report import FrameworkSetting, Report
from rcdiag.runtime.errors import ConfigError
from rcdiag.sections import Section
from rcdiag.settings.correction import CorrectionConfig
from rcdiag.settings.reading import ReadOptions
from rcdiag.sweep.build import build_sweep_report
from rcdiag.sweep.grid import SweepGrid, build_grid
from rcdiag.sweep.recommend import verl_config
from rcdiag.sweep.state import SweepState, new_sweep_state
from rcdiag.sweep.sweep_report import SweepReport


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
    # the sections every analyze runs (the verdict reads them) and, under --as NAME, NAME's own correction judged on
    # the same pass, as analyze --as judges it (framework_drops_gradient)
    sections = with_defaults(framework_sections(framework, (), None)[1])
    accumulated = accumulate(
        path,
        CorrectionConfig(verl_version=grid.verl_version),
        read,
        on_chunk=on_chunk,
        save_state=save_state,
        new_state=new_state,
        sections=sections,
    )
    analysis = _analysis(accumulated, sections)
    report = _report(accumulated, min_ess, complete_verdict(analysis, path, read))
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
    grid = grid or build_grid()
    new_state = functools.partial(new_sweep_state, grid, target_reject)
    config = CorrectionConfig(verl_version=grid.verl_version)
    sections = with_defaults(())  # the sections every analyze runs: the verdict reads them
    accumulated = accumulate_chunks(chunks, config, read, sections=sections, new_state=new_state, **options)
    return _report(accumulated, min_ess, _analysis(accumulated, sections))


def merge_sweep_states(paths: list[str | Path], min_ess: float = 0.0) -> SweepReport:
    """The sweep of one run over every shard whose ``rcdiag sweep --save-state`` files are given; recommendations
    (at the target the states were written with) when every state carries what they need."""
    accumulated = merge_files(paths, "sweep")  # any other kind refused
    return _report(accumulated, min_ess, _analysis(accumulated))


def _analysis(accumulated: Accumulated, sections: Sequence[Section] = ()) -> Report:
    """Analyze's report of the sweep's state (``SweepState.analyzed``: verl's metrics-only default and the sections'
    states the same pass kept), whose verdict heads the sweep; read before the sweep's report consumes the batches.
    A merged state's sections are read by their registered kinds' defaults."""
    state = accumulated.state
    assert isinstance(state, SweepState)  # what new_state builds, or the kind merge_files read
    return build_report(state.analyzed(), accumulated.info, accumulated.device, accumulated.screen, sections=sections)


def _report(accumulated: Accumulated, min_ess: float, analysis: Report) -> SweepReport:
    state = accumulated.state
    assert isinstance(state, SweepState)
    return build_sweep_report(state, analysis.input, accumulated.device, min_ess, analysis)
