"""``rcdiag.analyze``: a dump read once with the run's sections riding on it, the typed report, the sections'
files, and what the verdict leaves open answered in one more pass. Nothing here imports typer or rich."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rcdiag.api.progress import ProgressCallback
from rcdiag.api.reading import accumulate, accumulate_chunks
from rcdiag.api.report import analyze_state, build_report, record_of
from rcdiag.api.second_pass import complete_verdict
from rcdiag.engine.stream import StepStates
from rcdiag.explain.detector_section import DetectorSection
from rcdiag.explain.section import ExplainSection
from rcdiag.explain.worst import DEFAULT_WORST
from rcdiag.io import Chunk
from rcdiag.io.outputs import ledger, reads, writes
from rcdiag.microbatch.section import MicroBatchSection
from rcdiag.records.report import Report
from rcdiag.sections import Section
from rcdiag.sections.exact import ExactSection
from rcdiag.sections.slices import SlicesSection
from rcdiag.settings.correction import CorrectionConfig
from rcdiag.settings.reading import ReadOptions

if TYPE_CHECKING:  # features a plain analyze does not run are imported when used (start-up time)
    from rcdiag.frameworks.registry import Chosen
    from rcdiag.microbatch import MicroBatchSettings


def analyze(
    path: str | Path,
    config: CorrectionConfig | None = None,
    read: ReadOptions | None = None,
    *,
    sections: Sequence[Section] = (),
    on_chunk: ProgressCallback | None = None,
    save_state: str | Path | None = None,
    explain: bool = False,
    worst: int | None = None,
    sequences: str | Path | None = None,
    tokenizer: str | Path | None = None,
    tokens: str | Path | None = None,
    microbatch: MicroBatchSettings | None = None,
    framework: str | Chosen | None = None,
    framework_options: Mapping[str, Any] | Sequence[str] = (),
    **options: Any,
) -> Report:
    """Run verl's rollout correction over a dump and return the report.

    Args:
        path: the dump: a Parquet, Arrow IPC, JSONL (NeMo-RL, prime-rl), ``.pt`` or ``.npz`` file, a
            directory of shards or a glob (docs/formats.md); a local path or an ``s3://``, ``gs://``,
            ``hdfs://`` or ``file://`` URL (docs/storage.md).
        config: verl's ``rollout_correction`` fields; default: metrics only (verl's YAML default).
        read: how to read the dump (``rcdiag.ReadOptions``: columns, bad-row policy, device, chunk size, Ray,
            workers); default: recognise the columns, stop at a bad row, one CPU process.
        on_chunk: called after each chunk is read with a ``ReadProgress`` (for a progress bar); with
            ``workers > 1`` or ``ray``, after each part instead.
        sections: the features riding on the run (``rcdiag.sections``; the one way to add one): ``--explain``'s
            (``rcdiag.explain.section.ExplainSection``), the micro-batches' (``rcdiag.microbatch.section``), a
            framework's (``rcdiag.frameworks.section``), ``compare``'s units, each its record in
            ``report.sections[KEY]`` (``--explain``'s in ``report.explain``, the micro-batches' in
            ``report.microbatch``), after those every analyze runs (``with_defaults``: the exact match, the bias
            detectors and the slices, ``read.columns.by``'s tables and the ``slice_concentrated`` test). One given
            replaces a default.
        save_state: also write the accumulated state here, for ``merge_states`` (scale-out over shards).
        explain, worst, sequences, tokenizer, tokens: a shim that builds ``--explain``'s section (any of them given
            turns it on, ``worst=10`` too): ``explain`` says where the mismatch sits (breakdowns by position,
            rollout probability and length, the ``worst`` most extreme responses (default 10) and the bias
            detectors; ``report.explain``, docs/explain.md); ``sequences`` writes one row per response to this
            Parquet file (read it back with ``report.sequences_frame()``); ``tokenizer`` (a ``tokenizer.json`` or a
            directory holding one) gives the text of the token ids in the by-token breakdown and the worst
            responses (``rcdiag[tokens]``); ``tokens`` writes the by-token table (one row per token id) to this
            Parquet file.
        framework, framework_options: a shim that builds the framework's section: also compute this framework's
            own correction and logged keys (``"trl"``, ``"openrlhf"``, ``"areal"``; docs/frameworks.md), merged into
            ``metrics`` and each step's, its release and options in ``report.sections["framework"]``; ``"verl"``
            (the default) changes nothing but takes ``framework_options`` as ``algorithm.rollout_correction``
            fields on top of ``config``. ``framework_options``: the framework's own options
            (``{"vllm_importance_sampling_mode": "token_mask"}`` or ``["vllm_importance_sampling_mode=token_mask"]``),
            on top of its release's defaults.
        microbatch: a shim that builds the micro-batch section: also split each step as verl's actor does
            (``rcdiag.MicroBatchSettings``) and report what verl computes and where it crashes per micro-batch
            (``report.microbatch``). Keeps every valid token in memory, in one process.
        options: ``ReadOptions`` fields as keywords (``device="cuda"``, ``columns=ColumnMap(...)``), applied
            on top of ``read``.

    The report's ``verdict`` (docs/verdict.md) is judged from its findings and metrics; a ``correct`` verdict's
    prescription is measured on the dump by a second pass under the prescribed setting (none when ``config`` is
    already that setting; docs/performance.md).

    Raises:
        ConfigError: invalid configuration (the message is verl's, where verl has one).
        InputError: unreadable file or invalid values (the message names file, row and column).

    Example:
        >>> from rcdiag import analyze, preset
        >>> report = analyze("sample_data/healthy.parquet", preset("decoupled_geo_rs"))  # doctest: +SKIP
        >>> report.metrics["rollout_corr/kl"]  # doctest: +SKIP
    """
    config, riding = framework_sections(framework, framework_options, config)
    micro = [] if microbatch is None else [MicroBatchSection(microbatch)]
    given = [*_explain(explain, worst, sequences, tokenizer, tokens), *sections, *riding, *micro]
    with ledger():  # every output against every input, the tokenizer's file included, before any is read
        for section in given:
            section.check_outputs()
        writes(save_state, "save_state")
        for name, output in (named for section in given for named in section.outputs()):
            writes(output, name)
        reads(path)
        for section in given:
            section.read_inputs()
    read = ReadOptions.of(read, options)
    wanted = with_defaults(given, read.columns.by if read.columns is not None else ())
    accumulated = accumulate(path, config, read, on_chunk=on_chunk, save_state=save_state, sections=wanted)
    state = analyze_state(accumulated.state)
    report = build_report(state, accumulated.info, accumulated.device, accumulated.screen, sections=wanted)
    write_sections(state, report, wanted)
    return complete_verdict(report, path, read)


def _explain(
    explain: bool,
    worst: int | None,
    sequences: str | Path | None,
    tokenizer: str | Path | None,
    tokens: str | Path | None,
) -> list[Section]:
    """``analyze``'s ``--explain`` keywords as its section: any of them given turns it on (``worst=10`` too)."""
    if not explain and all(value is None for value in (worst, sequences, tokenizer, tokens)):
        return []
    return [ExplainSection(DEFAULT_WORST if worst is None else worst, sequences, tokenizer, tokens)]


def framework_sections(
    framework: str | Chosen | None, options: Mapping[str, Any] | Sequence[str], config: CorrectionConfig | None
) -> tuple[CorrectionConfig | None, list[Section]]:
    """``config`` as ``--as verl``'s options set it, or the section computing another framework's keys."""
    if framework is None and not options:
        return config, []
    from rcdiag.frameworks.registry import Chosen, choose
    from rcdiag.frameworks.section import FrameworkSection

    chosen = framework if isinstance(framework, Chosen) else choose(framework or "verl", options)
    config, riding = chosen.split(config)
    return config, [] if riding is None else [FrameworkSection(riding)]


def with_defaults(sections: Sequence[Section], by: tuple[str, ...] = ()) -> list[Section]:
    """The sections of a run: ``--explain``'s first if given, then those every analyze runs unless given (the exact
    match, ``rcdiag.sections.exact``; the bias detectors, ``rcdiag.explain.detector_section``, left out beside
    ``--explain``, whose section runs them on its own sums; the slices, ``rcdiag.sections.slices``, with ``by``: the
    ``--by`` columns), then the others given."""
    explaining = [s for s in sections if s.KEY == ExplainSection.KEY]
    given = [s for s in sections if s.KEY != ExplainSection.KEY and not (explaining and s.KEY == DetectorSection.KEY)]
    keys = {section.KEY for section in given}
    defaults: list[Section] = [ExactSection(), *([] if explaining else [DetectorSection()]), SlicesSection(by)]
    return [*explaining, *(section for section in defaults if section.KEY not in keys), *given]


def write_sections(state: StepStates[Any], report: Report, sections: Sequence[Section]) -> None:
    """Each section's files, from its state and record, once the report is built (never inside building it)."""
    for section in sections:
        section.write(state.whole_dump.get(section.KEY), record_of(report, section.KEY))


def analyze_chunks(
    chunks: Iterable[Chunk], config: CorrectionConfig | None = None, read: ReadOptions | None = None, **options: Any
) -> Report:
    """Like ``analyze`` but over chunks you built yourself (e.g. from tensors in a training loop); of ``read``,
    ``device`` and ``on_bad_row`` apply.

    A chunk's arrays may be numpy arrays or torch tensors (any device; converted to float32 numpy), flat with
    ``offsets``, or 2-D (rows x positions) with ``offsets=None``; a malformed chunk is an ``InputError`` naming
    it (``chunk 0``, ...). Example in docs/index.md.
    """
    sections = with_defaults(())
    got = accumulate_chunks(chunks, config, read, sections=sections, **options)
    return build_report(analyze_state(got.state), got.info, got.device, got.screen, sections=sections)
