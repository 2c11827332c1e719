"""``rcdiag compare``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from rcdiag.cli.flags import AS_FLAGS, ENGINE_FLAGS, READ_FLAGS, given_path, output_flags, path_argument, side_columns
from rcdiag.cli.params import checked_option, with_flags
from rcdiag.runtime.option_checks import positive

if TYPE_CHECKING:
    from rcdiag.cli.engine_config import EngineFlags
    from rcdiag.cli.output import Output
    from rcdiag.frameworks.registry import Chosen
    from rcdiag.settings.reading import ReadOptions

TEMPERATURE = "Temperature"


def _temperature(side: str) -> object:
    return typer.Option(
        f"--temperature-{side}",
        metavar="T",
        **checked_option(positive()),  # as rcdiag.compare.check_temperature
        help=f"Rollout sampling temperature of {side.upper()} (default: the dump's `temperature` metadata; when "
        "both are known and differ, the flag is used and a finding says so).",
        rich_help_panel=TEMPERATURE,
        show_default=False,
    )


@with_flags(
    ENGINE_FLAGS, AS_FLAGS, READ_FLAGS, side_columns("a"), side_columns("b"), output_flags("comparison", "compare")
)
def compare(
    path_a: Annotated[str, path_argument("A", "Dump A (a path or URL).")],
    path_b: Annotated[str, path_argument("B", "Dump B (a path or URL).")],
    more: Annotated[
        list[str] | None,
        typer.Argument(
            help="More dumps: each is compared with the baseline (A unless --baseline), the tests' p-values "
            "Holm-adjusted over the comparisons.",
            metavar="C",
            show_default=False,
            callback=given_path,
        ),
    ] = None,
    baseline: Annotated[
        str | None,
        typer.Option(
            "--baseline",
            metavar="PATH",
            help="With more than two dumps: the one every other is compared with (one of the dumps given; default: A).",
            show_default=False,
        ),
    ] = None,
    temperature_a: Annotated[float | None, _temperature("a")] = None,
    temperature_b: Annotated[float | None, _temperature("b")] = None,
    *,
    engine: EngineFlags,
    framework: Chosen | None,
    read: ReadOptions,
    columns_a: dict[str, Any],
    columns_b: dict[str, Any],
    out: Output,
) -> None:
    """Run both dumps through the same rollout correction and compare them: every metric with its difference and
    ratio, whether B differs from A significantly (95% intervals), a temperature analysis, the per-step difference,
    and verdicts. With more dumps, each is compared with the baseline.

    kl grows as 1/T^2 with the sampling temperature T, so `compare` turns each side's kl into a logit-noise
    estimate T*sqrt(2 kl) that is comparable across temperatures, and says whether the engines' noise is the same,
    whether one side handles the temperature wrongly, or whether one side has a systematic shift. Examples:

    * `rcdiag compare run_t06.parquet run_t10.parquet`
    * `rcdiag compare old_engine.parquet new_engine.parquet --temperature-a 0.7 --temperature-b 0.7 --is token`
    * `rcdiag compare a.parquet b.parquet --old-col-b logp_train --format json -o comparison.json`
    * `rcdiag compare bf16.parquet fp8.parquet mxfp8.parquet --baseline bf16.parquet`
    * `rcdiag compare bf16.parquet int4.parquet --as trl` (TRL's own keys side by side, each side's prescription in
      TRL's settings; docs/frameworks.md)

    Exit codes: 0 done (findings do not change it), 2 bad option, configuration or input, 3 internal error.
    """
    import dataclasses

    from rcdiag.api import compare as run_compare
    from rcdiag.cli.progress import progress
    from rcdiag.io.outputs import reads

    paths = [path_a, path_b, *(more or [])]
    reads(*paths)  # all before A is read: an output over B is refused first
    config = engine.config()
    if framework is not None:
        config = engine.for_framework(framework, config)
    shared = read.columns
    assert shared is not None  # the command line's ReadOptions always hold a ColumnMap (cli/flags.py)
    read_a, read_b = (
        read.replace(columns=dataclasses.replace(shared, **side)) if side else read for side in (columns_a, columns_b)
    )
    if len(paths) > 2 or baseline is not None:
        from rcdiag.api import compare_many
        from rcdiag.runtime.errors import ConfigError

        if baseline is not None and baseline not in paths:
            raise ConfigError(f"--baseline {baseline} is none of the dumps given ({', '.join(paths)}).")
        with progress(read, out) as on_chunk:
            result = compare_many(
                paths,
                config,
                read,
                baseline=0 if baseline is None else paths.index(baseline),
                reads=(read_a, read_b),
                temperatures=(temperature_a, temperature_b),
                on_chunk=on_chunk,
                framework=framework,
            )
        out.emit(result)
        return
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
            framework=framework,
        )
    out.emit(comparison)
