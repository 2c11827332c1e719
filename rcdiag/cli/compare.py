"""``rcdiag compare``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from rcdiag.cli.options import (
    DEFAULT_CHUNK,
    BadRowPolicy,
    BatchNormOpt,
    ChunkOpt,
    DeviceOpt,
    FormatOpt,
    IsOpt,
    IsThresholdOpt,
    MaskColOpt,
    OldColOpt,
    OnBadRowOpt,
    OutputOpt,
    PresetOpt,
    RolloutColOpt,
    RsOpt,
    RsThresholdOpt,
    SeqColOpt,
    StepColOpt,
    WorkersOpt,
)
from rcdiag.render import OutputFormat

TEMPERATURE = "Temperature"


def compare(
    path_a: Annotated[Path, typer.Argument(help="Dump A.", metavar="A", show_default=False)],
    path_b: Annotated[Path, typer.Argument(help="Dump B.", metavar="B", show_default=False)],
    temperature_a: Annotated[
        float | None,
        typer.Option(
            "--temperature-a",
            metavar="T",
            help="Rollout sampling temperature of A (default: the dump's `temperature` metadata).",
            rich_help_panel=TEMPERATURE,
            show_default=False,
        ),
    ] = None,
    temperature_b: Annotated[
        float | None,
        typer.Option(
            "--temperature-b",
            metavar="T",
            help="Rollout sampling temperature of B (default: the dump's `temperature` metadata).",
            rich_help_panel=TEMPERATURE,
            show_default=False,
        ),
    ] = None,
    is_level: IsOpt = None,
    is_threshold: IsThresholdOpt = None,
    rs: RsOpt = None,
    rs_threshold: RsThresholdOpt = None,
    batch_normalize: BatchNormOpt = None,
    preset: PresetOpt = None,
    old_col: OldColOpt = None,
    rollout_col: RolloutColOpt = None,
    mask_col: MaskColOpt = None,
    step_col: StepColOpt = None,
    seq_col: SeqColOpt = None,
    on_bad_row: OnBadRowOpt = BadRowPolicy.error,
    device: DeviceOpt = "cpu",
    chunk_tokens: ChunkOpt = DEFAULT_CHUNK,
    workers: WorkersOpt = 1,
    output_format: FormatOpt = OutputFormat.table,
    output: OutputOpt = None,
) -> None:
    """Run both dumps through the same rollout correction and compare them: every metric with its difference and
    ratio, a temperature analysis, the per-step difference, and verdicts.

    kl grows as 1/T^2 with the sampling temperature T, so `compare` turns each side's kl into a logit-noise
    estimate T*sqrt(2 kl) that is comparable across temperatures, and says whether the engines' noise is the same,
    whether one side handles the temperature wrongly, or whether one side has a systematic shift. Examples:

    * `rcdiag compare run_t06.parquet run_t10.parquet`
    * `rcdiag compare old_engine.parquet new_engine.parquet --temperature-a 0.7 --temperature-b 0.7 --is token`
    * `rcdiag compare a.parquet b.parquet --format json -o comparison.json`

    Exit codes: 0 done (findings do not change it), 2 bad option, configuration or input, 3 internal error.
    """
    from rcdiag.cli.engine_config import build_config, read_options
    from rcdiag.cli.output import write_rich, write_text
    from rcdiag.compare import compare as run_compare

    config = build_config(
        preset_name=preset,
        is_level=is_level,
        is_threshold=is_threshold,
        rs=rs,
        rs_threshold=rs_threshold,
        batch_normalize=batch_normalize,
    )
    config.resolve()
    comparison = run_compare(
        path_a,
        path_b,
        config,
        temperature_a=temperature_a,
        temperature_b=temperature_b,
        **read_options(
            device=device,
            chunk_tokens=chunk_tokens,
            old_col=old_col,
            rollout_col=rollout_col,
            mask_col=mask_col,
            step_col=step_col,
            seq_col=seq_col,
            on_bad_row=on_bad_row,
            workers=workers,
        ),
    )
    if output_format is OutputFormat.json:
        import json

        write_text(json.dumps(comparison.to_dict(), indent=2, allow_nan=False) + "\n", output)
    else:
        from rcdiag.render.compare_table import render_comparison

        write_rich(lambda console: render_comparison(comparison, console), output)
    if output is not None:
        warnings = sum(f.severity == "warning" for f in comparison.findings)
        print(f"rcdiag: wrote {output} ({warnings} warning(s) in findings)", file=sys.stderr)
