"""``rcdiag analyze``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rcdiag.cli.options import (
    DEFAULT_CHUNK,
    BadRowPolicy,
    BatchNormOpt,
    ChunkOpt,
    DeviceOpt,
    ExplainOpt,
    FormatOpt,
    IdColOpt,
    IsOpt,
    IsThresholdOpt,
    MaskColOpt,
    OldColOpt,
    OnBadRowOpt,
    OutputOpt,
    PresetOpt,
    QuietOpt,
    RolloutColOpt,
    RsOpt,
    RsThresholdOpt,
    SaveStateOpt,
    SeqColOpt,
    SequencesOpt,
    StepColOpt,
    WorkersOpt,
    WorstOpt,
)
from rcdiag.render import OutputFormat


def analyze(
    path: Annotated[
        Path,
        typer.Argument(
            help="The dump: a Parquet/Arrow file, a directory or quoted glob of shards, NeMo-RL or prime-rl JSONL, "
            "or a .pt/.npz file of tensors.",
            metavar="PATH",
            show_default=False,
        ),
    ],
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
    id_col: IdColOpt = None,
    on_bad_row: OnBadRowOpt = BadRowPolicy.error,
    device: DeviceOpt = "cpu",
    chunk_tokens: ChunkOpt = DEFAULT_CHUNK,
    workers: WorkersOpt = 1,
    save_state: SaveStateOpt = None,
    explain: ExplainOpt = False,
    worst: WorstOpt = 10,
    sequences: SequencesOpt = None,
    output_format: FormatOpt = OutputFormat.table,
    output: OutputOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Run verl's rollout correction over a dump and report every `rollout_corr/*` metric with findings.

    With no IS/RS flag and no preset you get verl's default: the 13 off-policy metrics (kl, k3_kl,
    chi2_token/seq, PPLs). Examples:

    * `rcdiag analyze run.parquet --rs token_k1 --rs-threshold 0.5_2.0`
    * `rcdiag analyze run.parquet --preset decoupled_geo_rs_token_tis --format json -o report.json`
    * `rcdiag analyze run.parquet --is sequence --is-threshold 5 --batch-normalize`
    * `rcdiag analyze logs/exp_001/` (NeMo-RL `train_data_step*.jsonl`), `rcdiag analyze "dumps/*.pt" --on-bad-row skip`
    * `rcdiag analyze shard-07.parquet --save-state s07.json`, then `rcdiag merge s*.json`
    * `rcdiag analyze run.parquet --explain --worst 20 --sequences per_response.parquet`

    Exit codes: 0 done (findings do not change it), 2 bad option, configuration or input, 3 internal error.
    """
    from rcdiag.api import analyze as run_analysis
    from rcdiag.cli.engine_config import build_config, read_options
    from rcdiag.cli.output import write_report
    from rcdiag.cli.progress import progress_bar, wanted

    config = build_config(
        preset_name=preset,
        is_level=is_level,
        is_threshold=is_threshold,
        rs=rs,
        rs_threshold=rs_threshold,
        batch_normalize=batch_normalize,
    )
    config.resolve()  # configuration errors before any reading
    show = wanted(quiet, json_to_stdout=output_format is OutputFormat.json and output is None)
    with progress_bar(show and workers == 1) as on_chunk:
        report = run_analysis(
            path,
            config,
            on_chunk=on_chunk,
            save_state=save_state,
            explain=explain,
            worst=worst,
            sequences=sequences,
            **read_options(
                device=device,
                chunk_tokens=chunk_tokens,
                old_col=old_col,
                rollout_col=rollout_col,
                mask_col=mask_col,
                step_col=step_col,
                seq_col=seq_col,
                id_col=id_col,
                on_bad_row=on_bad_row,
                workers=workers,
            ),
        )
    write_report(report, output_format, output)
