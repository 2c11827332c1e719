"""``rcdiag merge``: one report from the saved states of many shards."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from rcdiag.cli.flags import QUIET_FLAGS, DetailsOpt, TokenizerOpt, output_flags, path_argument
from rcdiag.cli.params import with_flags

if TYPE_CHECKING:
    from rcdiag.cli.output import Output


@with_flags(QUIET_FLAGS, output_flags("report", "merge"))
def merge(
    states: Annotated[
        list[str],
        path_argument(
            "STATE",
            "State files written by `rcdiag analyze ... --save-state` (or all by `rcdiag sweep`): paths or "
            "URLs, or a directory, prefix or quoted glob of them (`'s3://bucket/states/*.json'`).",
        ),
    ],
    tokenizer: TokenizerOpt = None,
    details: DetailsOpt = False,
    *,
    quiet: bool,
    out: Output,
) -> None:
    """Merge the saved states of shards analysed (or swept) anywhere (Slurm arrays, Ray, Kubernetes jobs) into
    the report of one run over all of them.

    Every state must have been computed with the same configuration (exit 2 otherwise). The flags that say how to
    read a dump were used when each state was written; `-q` is accepted (merge draws no progress bar). Example:

    * `rcdiag analyze part-0.parquet --preset decoupled_geo_rs --save-state s0.json` (on each machine)
    * `rcdiag merge s0.json s1.json s2.json --format json -o report.json`
    """
    from rcdiag.api import merge as merge_reports
    from rcdiag.engine.state_files import STATE_INPUT
    from rcdiag.explain.token_report import claim_tokenizer
    from rcdiag.io.outputs import reads
    from rcdiag.records.report import Report

    reads(*states, what=STATE_INPUT)  # before the first is read for its kind
    claim_tokenizer(tokenizer)  # and the tokenizer's file, read later by merge_states

    report = merge_reports(list(states), tokenizer=tokenizer)
    if not isinstance(report, Report):  # states of `rcdiag sweep --save-state`: a sweep report
        out.as_kind("sweep", "merge").emit(report)
        return
    out.emit(report, details=True) if details else out.emit(report)
