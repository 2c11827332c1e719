"""Options shared by the commands that run the engine (analyze, compare, check)."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated

import typer

from rcdiag.constants import DEFAULT_CHUNK_TOKENS
from rcdiag.render import OutputFormat

ENGINE = "Rollout correction (verl's algorithm.rollout_correction)"
RUN = "Run"


class ISLevel(str, enum.Enum):
    """``--is`` choices."""

    token = "token"
    sequence = "sequence"
    none = "none"


IsOpt = Annotated[
    ISLevel | None,
    typer.Option(
        "--is",
        help="IS weight level (verl's `rollout_is`); `none` turns IS off. Default: off.",
        rich_help_panel=ENGINE,
        show_default=False,
    ),
]
IsThresholdOpt = Annotated[
    str | None,
    typer.Option(
        "--is-threshold",
        metavar="SPEC",
        help="`rollout_is_threshold`: `U` truncates weights at U (TIS); `L_U` zeroes weights outside [L, U] "
        "(IcePop). Default 2.0.",
        rich_help_panel=ENGINE,
        show_default=False,
    ),
]
RsOpt = Annotated[
    str | None,
    typer.Option(
        "--rs",
        metavar="OPTIONS",
        help="`rollout_rs`: comma-separated RS options (token_k1..k3, seq_sum_k1..k3, seq_mean_k1..k3, "
        "seq_max_k2/k3), combined with AND; `none` turns RS off.",
        rich_help_panel=ENGINE,
        show_default=False,
    ),
]
RsThresholdOpt = Annotated[
    str | None,
    typer.Option(
        "--rs-threshold",
        metavar="SPEC",
        help="`rollout_rs_threshold`: one spec for all options or one per option, comma-separated. k1: "
        "`L_U` ratio bounds (a bare `U` means [1/U, U]); k2/k3: an upper bound.",
        rich_help_panel=ENGINE,
        show_default=False,
    ),
]
BatchNormOpt = Annotated[
    bool | None,
    typer.Option(
        "--batch-normalize/--no-batch-normalize",
        help="`rollout_is_batch_normalize`: normalise IS weights to mean 1 per batch (reports the factor).",
        rich_help_panel=ENGINE,
        show_default=False,
    ),
]
PresetOpt = Annotated[
    str | None,
    typer.Option(
        "--preset",
        metavar="NAME",
        help="One of verl's 19 RolloutCorrectionConfig presets (`rcdiag presets` lists them); the flags above "
        "override its fields.",
        rich_help_panel=ENGINE,
        show_default=False,
    ),
]
DeviceOpt = Annotated[
    str,
    typer.Option(
        "--device",
        help="`cpu` (numpy), `cuda`/`cuda:N` (PyTorch), or `auto` (a GPU when one is visible).",
        rich_help_panel=RUN,
    ),
]
ChunkOpt = Annotated[
    int,
    typer.Option(
        "--chunk-tokens",
        metavar="N",
        help="Read about N tokens at a time (bounds memory; never changes a metric). A longer response "
        "forms its own chunk.",
        rich_help_panel=RUN,
        min=1,
    ),
]
DEFAULT_CHUNK = DEFAULT_CHUNK_TOKENS
WorkersOpt = Annotated[
    int,
    typer.Option(
        "--workers",
        metavar="N",
        help="Split the dump (a Parquet file's row groups, or the files of a directory of shards) among N "
        "processes (CPU); the report is the same as with one.",
        rich_help_panel=RUN,
        min=1,
    ),
]
SaveStateOpt = Annotated[
    Path | None,
    typer.Option(
        "--save-state",
        metavar="FILE",
        help="Also write the accumulated state here; `rcdiag merge` combines states of shards into one report.",
        rich_help_panel=RUN,
        show_default=False,
    ),
]
FormatOpt = Annotated[
    OutputFormat, typer.Option("--format", help="`table` (terminal) or `json`.", rich_help_panel="Output")
]
OutputOpt = Annotated[
    Path | None,
    typer.Option(
        "--output", "-o", metavar="FILE", help="Write the result here instead of stdout.", rich_help_panel="Output"
    ),
]

INPUT = "Input"


class BadRowPolicy(str, enum.Enum):
    """``--on-bad-row`` choices (mirrors ``rcdiag.validate.OnBadRow`` without importing numpy)."""

    error = "error"
    skip = "skip"


def _column_option(flag: str, role: str) -> typer.models.OptionInfo:
    return typer.Option(
        flag,
        metavar="NAME",
        help=f"Column (or JSON/tensor key) holding {role}. Default: recognised by its common names.",
        rich_help_panel=INPUT,
        show_default=False,
    )


OldColOpt = Annotated[str | None, _column_option("--old-col", "the trainer's log-probs (old_log_prob)")]
RolloutColOpt = Annotated[str | None, _column_option("--rollout-col", "the rollout engine's log-probs")]
MaskColOpt = Annotated[str | None, _column_option("--mask-col", "the response mask (1 = valid token)")]
StepColOpt = Annotated[str | None, _column_option("--step-col", "the training step")]
SeqColOpt = Annotated[str | None, _column_option("--seq-col", "the sequence id of a one-row-per-token dump")]
IdColOpt = Annotated[
    str | None,
    typer.Option(
        "--id-col",
        metavar="NAME",
        help="Column naming each response in --explain's worst responses and --sequences. Default: uid, "
        "sample_id or prompt_id (the long layout's sequence id).",
        rich_help_panel=INPUT,
        show_default=False,
    ),
]
OnBadRowOpt = Annotated[
    BadRowPolicy,
    typer.Option(
        "--on-bad-row",
        help="Rows with NaN, +inf, a log-prob above +1e-3 or a mask value other than 0/1 at a valid position: "
        "`error` stops with exit 2 naming the first; `skip` leaves them out and reports how many, by reason.",
        rich_help_panel=INPUT,
    ),
]
QuietOpt = Annotated[
    bool,
    typer.Option("--quiet", "-q", help="No progress bar on stderr.", rich_help_panel=RUN),
]

EXPLAIN = "Explain (where the mismatch sits)"
ExplainOpt = Annotated[
    bool,
    typer.Option(
        "--explain",
        help="Also break the mismatch down by token position, rollout probability and response length, list the "
        "worst responses and run the bias detectors (temperature_mismatch, logprob_offset, position_drift, "
        "mismatch_trend).",
        rich_help_panel=EXPLAIN,
    ),
]
WorstOpt = Annotated[
    int,
    typer.Option(
        "--worst",
        metavar="N",
        min=0,
        help="Responses in the worst-responses list (implies --explain).",
        rich_help_panel=EXPLAIN,
    ),
]
SequencesOpt = Annotated[
    Path | None,
    typer.Option(
        "--sequences",
        metavar="FILE.parquet",
        help="Write one row per response (log-ratio sum, mean and max, the sequence IS weight, each RS option's "
        "statistic and verdict) to this Parquet file (implies --explain).",
        rich_help_panel=EXPLAIN,
        show_default=False,
    ),
]
