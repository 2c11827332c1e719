"""``rcdiag compare``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from rcdiag.cli.flags import ENGINE_FLAGS, READ_FLAGS, output_flags, path_argument, side_columns
from rcdiag.cli.params import with_flags

if TYPE_CHECKING:
    from rcdiag.cli.engine_config import EngineFlags
    from rcdiag.cli.output import Output
    from rcdiag.options import ReadOptions

TEMPERATURE = "Temperature"


def _temperature(side: str) -> object:
    return typer.Option(
        f"--temperature-{side}",
        metavar="T",
        help=f"Rollout sampling temperature of {side.upper()} (default: the dump's `temperature` metadata; when "
        "both are known and differ, the flag is used and a finding says so).",
        rich_help_panel=TEMPERATURE,
        show_default=False,
    )


@with_flags(ENGINE_FLAGS, READ_FLAGS, side_columns("a"), side_columns("b"), output_flags("comparison", "compare"))
def compare(
    path_a: Annotated[str, path_argument("A", "Dump A (a path or URL).")],
    path_b: Annotated[str, path_argument("B", "Dump B (a path or URL).")],
    temperature_a: Annotated[float | None, _temperature("a")] = None,
    temperature_b: Annotated[float | None, _temperature("b")] = None,
    *,
    engine: EngineFlags,
    read: ReadOptions,
    columns_a: dict[str, str],
    columns_b: dict[str, str],
    out: Output,
) -> None:
    """Run both dumps through the same rollout correction and compare them: every metric with its difference and
    ratio, a temperature analysis, the per-step difference, and verdicts.

    kl grows as 1/T^2 with the sampling temperature T, so `compare` turns each side's kl into a logit-noise
    estimate T*sqrt(2 kl) that is comparable across temperatures, and says whether the engines' noise is the same,
    whether one side handles the temperature wrongly, or whether one side has a systematic shift. Examples:

    * `rcdiag compare run_t06.parquet run_t10.parquet`
    * `rcdiag compare old_engine.parquet new_engine.parquet --temperature-a 0.7 --temperature-b 0.7 --is token`
    * `rcdiag compare a.parquet b.parquet --old-col-b logp_train --format json -o comparison.json`

    Exit codes: 0 done (findings do not change it), 2 bad option, configuration or input, 3 internal error.
    """
    import dataclasses

    from rcdiag.cli.progress import progress
    from rcdiag.compare import check_temperature
    from rcdiag.compare import compare as run_compare
    from rcdiag.outputs import reads

    reads(path_a, path_b)  # both before A is read: an output over B is refused first
    check_temperature(temperature_a, "--temperature-a")
    check_temperature(temperature_b, "--temperature-b")
    config = engine.config()
    shared = read.columns
    assert shared is not None  # the command line's ReadOptions always hold a ColumnMap (cli/flags.py)
    read_a, read_b = (
        read.replace(columns=dataclasses.replace(shared, **side)) if side else read for side in (columns_a, columns_b)
    )
    with progress(read, out) as on_chunk:
        comparison = run_compare(
            path_a,
            path_b,
            config,
            read_a,
            read_b=read_b,
            temperature_a=temperature_a,
            temperature_b=temperature_b,
            on_chunk=on_chunk,
        )
    out.emit(comparison)
