"""``rcdiag sweep``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from rcdiag.cli.flags import AS_FLAGS, ENGINE, READ_FLAGS, RELEASE_FLAGS, SaveStateOpt, output_flags, path_argument
from rcdiag.cli.params import checked_option, with_flags
from rcdiag.runtime.option_checks import probability

if TYPE_CHECKING:
    from rcdiag.cli.output import Output
    from rcdiag.frameworks.registry import Chosen
    from rcdiag.settings.reading import ReadOptions

SWEEP = "Sweep"
SWEEP_FLAGS = {
    "rollout_is": "--is",
    "rollout_rs": "--rs",
    "rollout_is_threshold": "--thresholds",
    "rollout_rs_threshold": "--thresholds",
    "is_levels": "--is",
    "rs_options": "--rs",
    "thresholds": "--thresholds",
}
"""verl's fields -> the sweep's flags, for its messages (``cli.engine_config.named_by_flags``)."""


@with_flags(RELEASE_FLAGS, AS_FLAGS, READ_FLAGS, output_flags("sweep", "sweep"))
def sweep(
    path: Annotated[
        str,
        path_argument(
            "PATH", "The dump (any format `rcdiag analyze` reads; a path or an s3://, gs://, hdfs:// or file:// URL)."
        ),
    ],
    is_levels: Annotated[
        str | None,
        typer.Option(
            "--is",
            metavar="LEVEL[,LEVEL]",
            help="Sweep these IS levels (`token`, `sequence`). With neither --is nor --rs: every option.",
            rich_help_panel=ENGINE,
            show_default=False,
        ),
    ] = None,
    rs: Annotated[
        str | None,
        typer.Option(
            "--rs",
            metavar="OPTION[,OPTION]",
            help="Sweep these RS options (token_k1..k3, seq_sum_k1..k3, seq_mean_k1..k3, seq_max_k2/k3).",
            rich_help_panel=ENGINE,
            show_default=False,
        ),
    ] = None,
    thresholds: Annotated[
        str | None,
        typer.Option(
            "--thresholds",
            metavar="SPEC[,SPEC...]",
            help="The grid, when exactly one option is named; specs as in analyze (`2.0`, `0.5_2.0`). "
            "Default: docs/sweep.md.",
            rich_help_panel=ENGINE,
            show_default=False,
        ),
    ] = None,
    target_reject: Annotated[
        float,
        typer.Option(
            "--target-reject",
            metavar="F",
            help="Recommend per option the threshold rejecting the share closest to F without exceeding it "
            "(token share for token_* and token IS, response share for seq_* and sequence IS).",
            rich_help_panel=SWEEP,
            **checked_option(probability()),
        ),
    ] = 0.01,
    recommend: Annotated[
        bool,
        typer.Option(
            "--recommend/--no-recommend",
            help="--no-recommend skips the recommendations (and what they collect while reading).",
            rich_help_panel=SWEEP,
        ),
    ] = True,
    min_ess: Annotated[
        float,
        typer.Option(
            "--min-ess",
            metavar="E",
            help="Rank verl's presets whose IS leaves an ESS below E last.",
            rich_help_panel=SWEEP,
            **checked_option(probability()),
        ),
    ] = 0.0,
    save_state: SaveStateOpt = None,
    *,
    release: str,
    framework: Chosen | None,
    read: ReadOptions,
    out: Output,
) -> None:
    """What every threshold of every IS level and RS option would do, in one pass over the dump, and which
    threshold to pick.

    Each row equals `rcdiag analyze` with that single option at that threshold. Examples:

    * `rcdiag sweep run.parquet` (every option over the default grids, recommendations for 1% rejected)
    * `rcdiag sweep run.parquet --rs seq_mean_k1 --thresholds 0.99_1.01,0.999_1.001 --format json`
    * `rcdiag sweep run.parquet --target-reject 0.005 --min-ess 0.5`
    * `rcdiag sweep shard-07.parquet --save-state s07.json`, then `rcdiag merge s*.json`
    * `rcdiag sweep run.parquet --as trl` (each recommendation also in TRL's settings, measured under TRL's
      semantics in one more pass; docs/frameworks.md)

    Exit codes: 0 done (verl-would-crash rows do not change it), 2 bad option, threshold or input, 3 internal error.
    """
    from rcdiag.api import sweep as run_sweep
    from rcdiag.cli.engine_config import named_by_flags
    from rcdiag.cli.output import checked_state_path
    from rcdiag.cli.progress import progress
    from rcdiag.frameworks.registry import choose
    from rcdiag.io.outputs import reads
    from rcdiag.runtime.errors import ConfigError
    from rcdiag.sweep.grid import build_grid, split_list

    with named_by_flags(SWEEP_FLAGS):
        grid = build_grid(split_list(is_levels), split_list(rs), split_list(thresholds), release)
    if framework is not None and framework.settings.to_dict() != choose(framework.name).settings.to_dict():
        raise ConfigError(
            "sweep --as translates each recommendation whole into the framework's settings: --as-option has no use "
            "here (give the options to `analyze --as`)"
        )
    state_file = checked_state_path(save_state)
    reads(path)
    with progress(read, out) as on_chunk:
        report = run_sweep(
            path,
            grid,
            read,
            on_chunk=on_chunk,
            save_state=state_file,
            target_reject=target_reject if recommend else None,
            min_ess=min_ess,
            framework=None if framework is None else framework.name,
        )
    out.emit(report)
