"""``rcdiag analyze``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from rcdiag.cli.flags import (
    AS_FLAGS,
    ENGINE_FLAGS,
    MICROBATCH_FLAGS,
    READ_FLAGS,
    DetailsOpt,
    ExplainOpt,
    SaveStateOpt,
    SequencesOpt,
    TokenizerOpt,
    TokensOpt,
    WorstOpt,
    output_flags,
    path_argument,
)
from rcdiag.cli.params import with_flags
from rcdiag.cli.tracking import TRACKING_FLAGS
from rcdiag.io import format_names

if TYPE_CHECKING:
    from rcdiag.cli.engine_config import EngineFlags
    from rcdiag.cli.output import Output
    from rcdiag.export.tracking import TrackingOptions
    from rcdiag.frameworks.registry import Chosen
    from rcdiag.microbatch import MicroBatchSettings
    from rcdiag.settings.reading import ReadOptions


@with_flags(ENGINE_FLAGS, AS_FLAGS, MICROBATCH_FLAGS, READ_FLAGS, TRACKING_FLAGS, output_flags("report", "analyze"))
def analyze(
    path: Annotated[
        str,
        path_argument(
            "PATH",
            f"The dump: a file ({', '.join(format_names())}), or a directory or quoted glob of shards; a local "
            "path or an s3://, gs://, hdfs:// or file:// URL.",
        ),
    ],
    save_state: SaveStateOpt = None,
    explain: ExplainOpt = False,
    worst: WorstOpt = None,
    sequences: SequencesOpt = None,
    tokens: TokensOpt = None,
    tokenizer: TokenizerOpt = None,
    details: DetailsOpt = False,
    *,
    engine: EngineFlags,
    framework: Chosen | None,
    microbatch: MicroBatchSettings | None,
    read: ReadOptions,
    tracking: TrackingOptions | None,
    out: Output,
) -> None:
    """Run verl's rollout correction over a dump: a verdict first (status, causes, one prescription measured on the
    dump), the off-policy table, a row per IS/RS option and the health warnings; with `--details` every
    `rollout_corr/*` metric and the findings checklist.

    With no IS/RS flag and no preset you get verl's default: the 13 off-policy metrics (kl, k3_kl,
    chi2_token/seq, PPLs). Examples:

    * `rcdiag analyze run.parquet --rs token_k1 --rs-threshold 0.5_2.0`
    * `rcdiag analyze run.parquet --preset decoupled_geo_rs_token_tis --format json -o report.json`
    * `rcdiag analyze run.parquet --is sequence --is-threshold 5 --batch-normalize`
    * `rcdiag analyze logs/exp_001/` (NeMo-RL `train_data_step*.jsonl`), `rcdiag analyze "dumps/*.pt" --on-bad-row skip`
    * `rcdiag analyze shard-07.parquet --save-state s07.json`, then `rcdiag merge s*.json`
    * `rcdiag analyze run.parquet --explain --worst 20 --sequences per_response.parquet`
    * `rcdiag analyze run.parquet --explain --tokenizer Qwen3-8B/ --tokens by_token.parquet` (which token ids
      carry the mismatch; needs token ids in the dump)
    * `rcdiag analyze run.parquet --details` (every metric table, the per-step table and the checklist)
    * `rcdiag analyze run.parquet --verl-version 0.7.1 --rs token_k1 --rs-threshold 1.5 --micro-batch-size 4`
      (would verl's actor crash on a micro-batch?)
    * `rcdiag analyze run.parquet --as trl --as-option vllm_importance_sampling_mode=token_truncate` (TRL's own
      `sampling/*` keys beside verl's; docs/frameworks.md)
    * `rcdiag analyze dumps/run-42 --tensorboard tb/run-42/rcdiag --mlflow sqlite:///mlflow.db` (every step's
      values into the dashboards; docs/dashboards.md)

    Exit codes: 0 done (findings do not change it), 2 bad option, configuration or input, 3 internal error.
    """
    from rcdiag.api import analyze as run_analysis
    from rcdiag.cli.output import checked_path, checked_state_path
    from rcdiag.cli.progress import progress
    from rcdiag.io.outputs import reads

    config = engine.config()
    if framework is not None:
        config = engine.for_framework(framework, config)
    state_file = checked_state_path(save_state)
    sequences_file = checked_path(sequences, "--sequences")
    tokens_file = checked_path(tokens, "--tokens")
    reads(path)  # the outputs named by flags are refused over the dump now; the tokenizer's file when it is read
    with progress(read, out) as on_chunk:
        report = run_analysis(
            path,
            config,
            read,
            on_chunk=on_chunk,
            save_state=state_file,
            explain=explain,
            worst=worst,
            sequences=sequences_file,
            microbatch=microbatch,
            tokenizer=tokenizer,
            tokens=tokens_file,
            framework=framework,
        )
    if tracking is not None:
        from rcdiag.cli.tracking import export

        export(report, tracking, path)
    out.emit(report, details=True) if details else out.emit(report)
