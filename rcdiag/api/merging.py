"""``rcdiag merge``: the report of one run over every shard whose saved states (``--save-state``) are given, of the
kind the states declare (an analyze report, or a sweep's)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rcdiag.api.reading import merge_files
from rcdiag.api.report import analyze_state, build_report
from rcdiag.explain.section import ExplainSection
from rcdiag.io.outputs import reads
from rcdiag.records.report import Report

if TYPE_CHECKING:
    from rcdiag.sweep.sweep_report import SweepReport


def merge(
    paths: list[str | Path], *, tokenizer: str | Path | None = None, min_ess: float = 0.0
) -> Report | SweepReport:
    """The report the states' declared kind makes (the first file's ``kind``; every other must be of it): an analyze
    report (``merge_states``, ``tokenizer`` giving the token ids' text) or a sweep's (``merge_sweep_states``,
    ``min_ess`` ranking the presets)."""
    from rcdiag.engine.state_files import state_kind

    if paths and state_kind(paths[0]) == "sweep":  # states of `rcdiag sweep --save-state`
        from rcdiag.api.sweeping import merge_sweep_states

        return merge_sweep_states(paths, min_ess)
    return merge_states(paths, tokenizer=tokenizer)


def merge_states(paths: list[str | Path], *, tokenizer: str | Path | None = None) -> Report:
    """The report of one run over every shard whose state files are given (``analyze --save-state``);
    ``tokenizer`` gives the token ids' text (``analyze(tokenizer=...)``)."""
    from rcdiag.engine.state_files import STATE_INPUT

    reads(*paths, what=STATE_INPUT)  # the command line's outputs are refused over them before the tokenizer is read
    explain = ExplainSection(tokenizer=tokenizer)
    explain.read_inputs()
    merged = merge_files(paths, "analyze")
    given = [explain] if ExplainSection.KEY in merged.state.whole_dump else []
    return build_report(analyze_state(merged.state), merged.info, merged.device, merged.screen, sections=given)
