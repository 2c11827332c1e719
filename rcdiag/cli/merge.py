"""``rcdiag merge``: one report from the saved states of many shards."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rcdiag.cli.options import FormatOpt, OutputOpt
from rcdiag.render import OutputFormat


def merge(
    states: Annotated[
        list[Path],
        typer.Argument(
            help="State files written by `rcdiag analyze ... --save-state`.", metavar="STATE", show_default=False
        ),
    ],
    output_format: FormatOpt = OutputFormat.table,
    output: OutputOpt = None,
) -> None:
    """Merge the saved states of shards analysed (or swept) anywhere (Slurm arrays, Ray, Kubernetes jobs) into
    the report of one run over all of them.

    Every state must have been computed with the same configuration (exit 2 otherwise). Example:

    * `rcdiag analyze part-0.parquet --preset decoupled_geo_rs --save-state s0.json` (on each machine)
    * `rcdiag merge s0.json s1.json s2.json --format json -o report.json`
    """
    from rcdiag.state import state_kind

    if states and state_kind(states[0]) == "sweep":  # states of `rcdiag sweep --save-state`
        from rcdiag.cli.sweep import write_sweep
        from rcdiag.sweep.run import merge_sweep_states

        write_sweep(merge_sweep_states(list(states)), output_format, output)
        return
    from rcdiag.api import merge_states
    from rcdiag.cli.output import write_report

    write_report(merge_states(list(states)), output_format, output)
