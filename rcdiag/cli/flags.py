"""The flags shared by commands, each declared once, and the groups that turn them into one value each: the engine
flags (``ENGINE_FLAGS``), how to read a dump (``READ_FLAGS``, a ``ReadOptions``), per-side columns
(``side_columns``) and the output target (``output_flags``). A command takes groups with
``@with_flags(ENGINE_FLAGS, READ_FLAGS, output_flags(...))``; a new command that reads dumps needs that one line.

A new input option is a ``ReadOptions`` field, a ``Flag`` in ``READ_FLAGS`` and a row in docs/options.md."""

from __future__ import annotations

import enum
from typing import Annotated, Any

import typer

from rcdiag.catalogue.findings import EXPLAIN_ONLY, detectors
from rcdiag.cli.engine_config import EngineFlags, ISLevel
from rcdiag.cli.params import Flag, FlagGroup, checked_option, choice_flag
from rcdiag.render.registry import FORMATS, ResultKind, format_names, pictures
from rcdiag.settings.constants import DEFAULT_CHUNK_TOKENS, DEVICES
from rcdiag.settings.reading import BAD_ROW_POLICIES, CHUNK_TOKENS, ON_BAD_ROW, RAY_ADDRESS, VOCAB_SIZE, WORKERS
from rcdiag.settings.section_options import MICROBATCH, WORST
from rcdiag.settings.versions import DEFAULT_VERSION, VERSIONS

ENGINE = "Rollout correction (verl's algorithm.rollout_correction)"
RUN = "Run"


IsOpt = Annotated[
    ISLevel | None,
    typer.Option(
        "--is",
        **choice_flag(ISLevel),
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
VerlVersionOpt = Annotated[
    str | None,
    typer.Option(
        "--verl-version",
        metavar="|".join(VERSIONS),
        help="Reproduce what this verl release logged (its `rollout_corr/*` formulas, presets and options; "
        f"docs/verl-differences.md). Default: {DEFAULT_VERSION}, the latest.",
        rich_help_panel=ENGINE,
        show_default=False,
    ),
]
VERSION_FLAG = Flag("verl_version", VerlVersionOpt)
RELEASE_FLAGS = FlagGroup("release", (VERSION_FLAG,), lambda values: _release(values["verl_version"]))
"""``--verl-version`` alone (``sweep``, which sweeps the engine options instead of taking them) -> its name."""


def _release(name: str | None) -> str:
    from rcdiag.settings.versions import verl_version

    return verl_version(name).name


ENGINE_FLAGS = FlagGroup(
    "engine",
    (
        Flag("is_level", IsOpt),
        Flag("is_threshold", IsThresholdOpt),
        Flag("rs", RsOpt),
        Flag("rs_threshold", RsThresholdOpt),
        Flag("batch_normalize", BatchNormOpt),
        Flag("preset", PresetOpt),
        VERSION_FLAG,
    ),
    lambda values: _engine_flags(values),
)
"""verl's ``rollout_correction`` fields (and ``--preset``) -> ``EngineFlags``."""


def _engine_flags(values: dict[str, Any]) -> EngineFlags:
    return EngineFlags(**values)


FRAMEWORK = "Framework (whose correction and keys; docs/frameworks.md)"
AS_NAMES = ("verl", "trl", "openrlhf", "areal", "skyrl", "slime", "prime-rl", "nemo-rl", "roll")
"""``--as`` choices, as ``rcdiag.frameworks.registry.FRAMEWORKS`` names them (tests/frameworks/test_frameworks_cli.py
checks it; the registry is not imported for ``--help``)."""


def as_option(help_text: str) -> Any:
    """``--as NAME`` with ``help_text`` (``analyze`` and ``check`` run the framework, ``presets`` describes it)."""
    option = typer.Option(
        "--as", metavar="|".join(AS_NAMES), help=help_text, rich_help_panel=FRAMEWORK, show_default=False
    )
    return Annotated[str | None, option]


AsOpt = as_option(
    "Also compute this framework's own correction and the keys it logs, with its release's defaults "
    "(`rcdiag presets --as NAME`), into the metrics and each step's. Default: verl (rcdiag's own keys)."
)
AsOptionOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--as-option",
        metavar="KEY=VALUE",
        help="One of the framework's own options, KEY as its config spells it (dotted where it nests), VALUE JSON "
        "or a bare word (a string); a nested block may be given whole as a JSON object. Repeatable.",
        rich_help_panel=FRAMEWORK,
        show_default=False,
    ),
]
AS_FLAGS = FlagGroup(
    "framework",
    (Flag("as_name", AsOpt), Flag("as_options", AsOptionOpt)),
    lambda values: _framework(values["as_name"], values["as_options"] or []),
)
"""``--as NAME`` and its ``--as-option``s -> the chosen framework (``rcdiag.frameworks.registry.Chosen``), checked
before any file is read; ``None`` without them."""


def _framework(name: str | None, options: list[str]) -> Any:
    if name is None and not options:
        return None
    from rcdiag.frameworks.registry import choose

    return choose(name or "verl", options)


MICRO = "Micro-batches (how verl's actor cuts each step; analyze)"


def _count_option(flag: str, help_text: str) -> Any:
    check = MICROBATCH[flag.removeprefix("--").replace("-", "_")]
    return Annotated[
        int | None,
        typer.Option(
            flag,
            metavar="N",
            help=help_text,
            rich_help_panel=MICRO,
            **checked_option(check),
            show_default=False,
        ),
    ]


MICROBATCH_FLAGS = FlagGroup(
    "microbatch",
    (
        Flag("micro_batch_size", _count_option("--micro-batch-size", "Static micro-batches of N rows per GPU "
             "(`ppo_micro_batch_size_per_gpu`).")),
        Flag("mini_batch_size", _count_option("--mini-batch-size", "Rows per GPU mini-batch. Default: the whole "
             "step on each rank.")),
        Flag("dp_size", _count_option("--dp-size", "Data-parallel ranks the step is split over. Default: 1.")),
        Flag("max_token_len", _count_option("--max-token-len", "Dynamic batch size: verl's rearrange_micro_batches "
             "with this token budget per micro-batch (`ppo_max_token_len_per_gpu`); needs --prompt-len.")),
        Flag("prompt_len", Annotated[int | None, typer.Option("--prompt-len", metavar="P", rich_help_panel=MICRO,
             **checked_option(MICROBATCH["prompt_len"]),
             show_default=False, help="Prompt tokens per row (dumps hold none): sequence length = P + response "
             "length, for --max-token-len and --balance-batch.")]),
        Flag("balance_batch", Annotated[bool, typer.Option("--balance-batch", rich_help_panel=MICRO,
             help="verl's trainer.balance_batch reorder before the DP split.")], False),
        Flag("sync_micro_num", Annotated[bool, typer.Option("--sync-micro-num", rich_help_panel=MICRO,
             help="Equal dynamic micro-batch counts across ranks under verl 0.7.1 (always so from 0.8.0).")], False),
    ),
    lambda values: _microbatch(values),
)  # fmt: skip
"""The actor's batching -> ``rcdiag.MicroBatchSettings``, or ``None`` when no micro-batch flag is given."""


def _microbatch(values: dict[str, Any]) -> Any:
    if not any(value not in (None, False) for value in values.values()):
        return None
    from rcdiag.microbatch import MicroBatchSettings

    fields = {k: v for k, v in values.items() if v is not None}
    return MicroBatchSettings(**fields)


INPUT = "Input"

COLUMN_ROLES = {
    "old": "the trainer's log-probs (old_log_prob)",
    "rollout": "the rollout engine's log-probs",
    "mask": "the response mask (1 = valid token)",
    "step": "the training step",
    "seq": "the sequence id of a one-row-per-token dump",
    "id": "an id naming each response in --explain's worst responses and --sequences (default: uid, sample_id or "
    "prompt_id; the long layout's sequence id)",
    "token": "the token id of each position, for --explain's by-token breakdown (default: responses, response_ids, "
    "token_ids, output_ids)",
    "advantages": "each token's advantage (a list per response, or one number per response), read for the --as "
    "framework keys that need it (default: advantages, advantage, token_advantages)",
    "current": "the current policy's per-token log-probs, read for the --as framework keys that compare it with the "
    "old policy or the rollout (default: log_prob, current_log_prob(s), current_logprobs, per_token_logps)",
}
"""``ColumnMap`` field -> what its column holds; each gives ``--<field>-col`` (and ``--<field>-col-a/-b`` in
compare)."""


def _column_flag(role: str, side: str = "") -> Flag:
    suffix = f"-{side}" if side else ""
    default = "Default: recognised by its common names." if not side else f"Default: --{role}-col."
    what = COLUMN_ROLES[role] + (f", in dump {side.upper()} only" if side else "")
    option = typer.Option(
        f"--{role}-col{suffix}",
        metavar="NAME",
        help=f"Column (or JSON/tensor key) holding {what}. {default}",
        rich_help_panel=INPUT,
        show_default=False,
    )
    return Flag(f"{role}_col{suffix.replace('-', '_')}", Annotated[str | None, option])


def _columns(values: dict[str, Any], side: str = "") -> dict[str, str]:
    suffix = f"_{side}" if side else ""
    return {role: values[f"{role}_col{suffix}"] for role in COLUMN_ROLES if values[f"{role}_col{suffix}"] is not None}


def side_columns(side: str) -> FlagGroup:
    """``--old-col-a`` ... for one side of ``compare``: the column names that differ from the shared ones."""
    flags = tuple(_column_flag(role, side) for role in COLUMN_ROLES)
    return FlagGroup(f"columns_{side}", flags, lambda values: _columns(values, side))


OnBadRowOpt = Annotated[
    str,
    typer.Option(
        "--on-bad-row",
        metavar="|".join(BAD_ROW_POLICIES),
        **checked_option(ON_BAD_ROW),
        help="Rows with NaN, +inf, a log-prob above +1e-3 or a mask value other than 0/1 at a valid position: "
        "`error` stops with exit 2 naming the first; `skip` leaves them out and reports how many, by reason.",
        rich_help_panel=INPUT,
    ),
]
DeviceOpt = Annotated[
    str,
    typer.Option(
        "--device",
        metavar="|".join(DEVICES),
        help="`cpu` (numpy), `cuda`/`cuda:N` (PyTorch), `auto` (a GPU when one is visible) or `torch-cpu` "
        "(PyTorch on the CPU, for parity checks).",
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
        **checked_option(CHUNK_TOKENS),
    ),
]
WorkersOpt = Annotated[
    str,
    typer.Option(
        "--workers",
        metavar="N|auto",
        **checked_option(WORKERS),
        help="Split the dump (a Parquet file's row groups, or the files of a directory of shards) among N "
        "processes (CPU); the report is the same as with one. `auto`: as many as can beat one process here "
        "(one per two cores, each with at least 512 MiB of the dump; often one).",
        rich_help_panel=RUN,
    ),
]
RayOpt = Annotated[
    bool,
    typer.Option(
        "--ray",
        help="Read each part (a Parquet row group, a shard file) as a Ray task, on the cluster at `RAY_ADDRESS` (or "
        "`--ray-address`), else on a local Ray instance; the report is the same as with one process. Needs "
        "`pip install 'rcdiag[ray]'`.",
        rich_help_panel=RUN,
    ),
]
RayAddressOpt = Annotated[
    str | None,
    typer.Option(
        "--ray-address",
        metavar="ADDRESS",
        **checked_option(RAY_ADDRESS),
        help="The Ray cluster for `--ray` (`host:6379`, `ray://host:10001`, `auto`); implies `--ray`. Default: "
        "`RAY_ADDRESS`, else a local instance.",
        rich_help_panel=RUN,
        show_default=False,
    ),
]
VocabOpt = Annotated[
    int | None,
    typer.Option(
        "--vocab-size",
        metavar="N",
        **checked_option(VOCAB_SIZE),
        help="Token ids (read with --explain) must be below N; a larger one stops with exit 2 naming it.",
        rich_help_panel=INPUT,
        show_default=False,
    ),
]
ByOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--by",
        metavar="COLUMN",
        help="Break the mismatch down by this per-row column (an environment, data source, task, rank, replica, "
        "worker or policy version; repeatable): per value its rows, tokens, kl, k3_kl, mean |log-ratio|, share of "
        "k3_kl and own status, and the slice_concentrated test over its values. A missing column stops with exit 2.",
        rich_help_panel=INPUT,
        show_default=False,
    ),
]
QUIET = Flag(
    "quiet",
    Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar on stderr.", rich_help_panel=RUN)],
    False,
)

READ_FLAGS = FlagGroup(
    "read",
    (
        *(_column_flag(role) for role in COLUMN_ROLES),
        Flag("by", ByOpt),
        Flag("on_bad_row", OnBadRowOpt, "error"),
        Flag("device", DeviceOpt, "cpu"),
        Flag("chunk_tokens", ChunkOpt, DEFAULT_CHUNK_TOKENS),
        Flag("workers", WorkersOpt, 1),
        Flag("ray", RayOpt, False),
        Flag("ray_address", RayAddressOpt),
        Flag("vocab_size", VocabOpt),
        QUIET,
    ),
    lambda values: _read_options(values),
)
"""Every flag that says how to read a dump -> ``rcdiag.ReadOptions`` (a new field: one ``Flag`` here)."""

QUIET_FLAGS = FlagGroup("quiet", (QUIET,), lambda values: values["quiet"])
"""``-q`` alone, for commands that read no dump (``merge``): accepted everywhere, so scripts can pass it."""


def _read_options(values: dict[str, Any]) -> Any:
    from rcdiag.io.base import ColumnMap
    from rcdiag.settings.reading import ReadOptions

    fields = {k: v for k, v in values.items() if not k.endswith("_col") and k != "by"}
    columns = ColumnMap(**_columns(values), by=tuple(dict.fromkeys(values["by"] or ())))
    return ReadOptions(columns=columns, **fields)


def given_path(value: Any) -> Any:
    """A path argument (PATH, A, B, DIR, STATE) or ``--baseline`` that was given empty (``rcdiag check "$DUMP"``
    with ``DUMP`` unset), refused as a usage error naming it: read as a path it would be the current directory."""
    from rcdiag.io.paths import EMPTY_PATH

    if any(isinstance(text, str) and not text.strip() for text in (value if isinstance(value, list) else [value])):
        raise typer.BadParameter(EMPTY_PATH)
    return value


def path_argument(metavar: str, help_text: str) -> Any:
    """A command's input PATH (``metavar``: ``PATH``, ``A``, ``DIR``, ``STATE``), never empty (``given_path``)."""
    return typer.Argument(help=help_text, metavar=metavar, show_default=False, callback=given_path)


def path_option(flag: str, help_text: str, panel: str, short: str | None = None) -> Any:
    """A FILE option kept as text, so that an empty value (an unset variable) can be refused by name."""
    names = (flag, short) if short else (flag,)
    return Annotated[
        str | None, typer.Option(*names, metavar="FILE", help=help_text, rich_help_panel=panel, show_default=False)
    ]


SaveStateOpt = path_option(
    "--save-state",
    "Also write the accumulated state here (a path or URL); `rcdiag merge` combines states of shards into one report.",
    RUN,
)
EXPLAIN = "Explain (where the mismatch sits)"
ExplainOpt = Annotated[
    bool,
    typer.Option(
        "--explain",
        help="Also break the mismatch down by token position, rollout probability and response length, list the "
        f"worst responses and, with token ids, run {', '.join(EXPLAIN_ONLY)} on the by-token table (the other bias "
        f"detectors, {', '.join(s.code for s in detectors() if s.code not in EXPLAIN_ONLY)}, run on every analyze).",
        rich_help_panel=EXPLAIN,
    ),
]
WorstOpt = Annotated[
    int | None,
    typer.Option(
        "--worst",
        metavar="N",
        **checked_option(WORST),
        help="Responses in --explain's worst-responses list (largest |sum of log-ratios|; default 10); implies "
        "--explain (given as 10 too).",
        rich_help_panel=EXPLAIN,
        show_default=False,
    ),
]
SequencesOpt = path_option(
    "--sequences",
    "Write one row per response (log-ratio sum, mean and max, the sequence IS weight, each RS option's statistic "
    "and verdict) to this Parquet file; implies --explain.",
    EXPLAIN,
)
TokensOpt = path_option(
    "--tokens",
    "Write the by-token table (one row per token id: tokens, kl, k3_kl, chi2_token, mean |log-ratio|, share of k3, "
    "significance) to this Parquet file; needs token ids in the dump; implies --explain.",
    EXPLAIN,
)
TokenizerOpt = Annotated[
    str | None,
    typer.Option(
        "--tokenizer",
        metavar="PATH",
        help="A tokenizer.json (or a directory holding one), read offline, to show the text of token ids in the "
        'by-token table and the worst responses; implies --explain. Needs `pip install "rcdiag[tokens]"`.',
        rich_help_panel=EXPLAIN,
        show_default=False,
    ),
]
OUTPUT = "Output"
DetailsOpt = Annotated[
    bool,
    typer.Option(
        "--details",
        help="Terminal view: also print every metric table, the per-step table, the findings checklist and each "
        "finding's full message (the default shows the verdict, the off-policy table, a row per IS/RS option and the "
        "health warnings; JSON always has everything).",
        rich_help_panel=OUTPUT,
    ),
]
FormatName = enum.Enum("FormatName", {name: name for name in format_names()}, type=str)  # type: ignore[misc]
"""``--format`` choices: every format in the renderer registry that has no flag of its own."""
FORMAT_HELP = "; ".join(f"`{name}`: {FORMATS[name].description}" for name in format_names()) + "."


def output_flags(kind: ResultKind, command: str) -> FlagGroup:
    """``--format`` and ``-o`` for a command whose result is ``kind``, and the flag of every picture format that
    can render it (``--html FILE``); a format without a renderer for it, or a picture whose extra is missing, is a
    configuration error, raised before anything is read."""
    fmt = Flag(
        "output_format",
        Annotated[
            FormatName, typer.Option("--format", **choice_flag(FormatName), help=FORMAT_HELP, rich_help_panel=OUTPUT)
        ],
        FormatName("table"),
    )
    out = Flag("output", path_option("--output", "Write the result here instead of stdout.", OUTPUT, "-o"))
    extra = {
        name: Flag(
            name,
            path_option(
                picture.flag or "",
                f'Also write {picture.description} to FILE. Needs `pip install "rcdiag[{picture.extra}]"`.',
                OUTPUT,
            ),
        )
        for name, picture in pictures(kind).items()
    }

    def build(values: dict[str, Any]) -> Any:
        from rcdiag.cli.output import Output

        files = {name: values[name] for name in extra if values[name] is not None}
        return Output.of(values["output_format"].value, values["output"], kind, command, files)

    return FlagGroup("out", (fmt, out, *extra.values()), build)
