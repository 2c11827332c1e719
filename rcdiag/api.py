"""Library entry points. Nothing here imports typer or rich."""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from rcdiag._version import __version__
from rcdiag.backend import Backend, NumpyBackend, get_backend
from rcdiag.catalogue.checklist import checklist
from rcdiag.catalogue.emit import ordered
from rcdiag.config import CorrectionConfig, preset
from rcdiag.engine import Engine, EngineState, StepStates, number_rows
from rcdiag.errors import ConfigError, InputError
from rcdiag.explain.detector_section import DetectorSection
from rcdiag.explain.section import ExplainSection
from rcdiag.explain.sequences import cleanup, temporary_directory
from rcdiag.explain.sequences import finish as finish_sequences
from rcdiag.explain.worst import DEFAULT_WORST
from rcdiag.frameworks.section import FrameworkSection
from rcdiag.frameworks.speak import chosen as spoken_chosen
from rcdiag.frameworks.speak import measured as spoken_effect
from rcdiag.health import StepHits, batch_hits, evaluate
from rcdiag.interrupts import checked
from rcdiag.io import Chunk, open_dump, prefetch
from rcdiag.io.base import SourceInfo
from rcdiag.metrics.signatures import HISTORY_KEYS
from rcdiag.options import ReadOptions
from rcdiag.outputs import ledger, reads, refuse_inputs, writes
from rcdiag.parallel import (
    RAY_MAX_PARTS,
    Job,
    PartResult,
    StateFactory,
    choose_workers,
    in_processes,
    merge_parts,
    new_wholes,
    observe,
    on_ray,
    too_many_workers,
)
from rcdiag.prescribe import SEQ_IS_PRESET, effect_of, seq_is_measured, seq_is_unmeasured
from rcdiag.report import Finding, InputFacts, MicroBatchReport, Report, StepReport
from rcdiag.sections import RunFacts, Section
from rcdiag.sections.base import Values, ValuesRecord
from rcdiag.sections.exact import ExactSection
from rcdiag.sections.slices import SlicesSection
from rcdiag.sections.token_ids import TokenIdsSection
from rcdiag.signature_rules import repeats, signature_findings
from rcdiag.validate import Screen, ScreenStats, as_chunk
from rcdiag.verdict import history_untested, judge

if TYPE_CHECKING:  # features a plain analyze does not run are imported when used (start-up time)
    from rcdiag.frameworks.registry import Chosen
    from rcdiag.microbatch import MicroBatchSettings
    from rcdiag.microbatch.rows import RowCollector


@dataclass(frozen=True)
class ReadProgress:
    """Reading so far, for a progress display: rows and list values read, and the dump's rows if known."""

    rows: int
    tokens: int
    total_rows: int | None
    parts: int | None = None
    """Parts finished, when parts are read in parallel (``--workers``, ``--ray``); ``None``: one process."""
    total_parts: int | None = None


ProgressCallback = Callable[[ReadProgress], None]


def analyze(
    path: str | Path,
    config: CorrectionConfig | None = None,
    read: ReadOptions | None = None,
    *,
    on_chunk: ProgressCallback | None = None,
    save_state: str | Path | None = None,
    explain: bool = False,
    worst: int = DEFAULT_WORST,
    sequences: str | Path | None = None,
    microbatch: MicroBatchSettings | None = None,
    tokenizer: str | Path | None = None,
    tokens: str | Path | None = None,
    sections: Sequence[Section] = (),
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
        save_state: also write the accumulated state here, for ``merge_states`` (scale-out over shards).
        explain: also say where the mismatch sits: breakdowns by position, rollout probability and length, the
            ``worst`` most extreme responses and the bias detectors (``report.explain``, docs/explain.md).
        worst: how many responses the worst-responses list keeps (a value other than 10 implies ``explain``).
        sequences: write one row per response to this Parquet file (implies ``explain``; read it back with
            ``report.sequences_frame()``).
        tokenizer: a ``tokenizer.json`` (or a directory holding one) giving the text of the token ids in the
            by-token breakdown and the worst responses (``rcdiag[tokens]``; implies ``explain``).
        tokens: write the by-token table (one row per token id) to this Parquet file (implies ``explain``).
        sections: more features riding on the run (``rcdiag.sections``), after ``--explain``'s and those every
            analyze runs (``with_defaults``: the exact match, the bias detectors and the slices, ``read.columns.by``'s
            tables and the ``slice_concentrated`` test); each record in ``report.sections[KEY]``. One given replaces a
            default.
        framework: also compute this framework's own correction and logged keys (``"trl"``, ``"openrlhf"``,
            ``"areal"``; docs/frameworks.md), merged into ``metrics`` and each step's, its release and options in
            ``report.sections["framework"]``; ``"verl"`` (the default) changes nothing but takes
            ``framework_options`` as ``algorithm.rollout_correction`` fields on top of ``config``.
        framework_options: the framework's own options (``{"vllm_importance_sampling_mode": "token_mask"}`` or
            ``["vllm_importance_sampling_mode=token_mask"]``), on top of its release's defaults.
        microbatch: also split each step as verl's actor does (``rcdiag.MicroBatchSettings``) and report what
            verl computes and where it crashes per micro-batch (``report.microbatch``). Keeps every valid token
            in memory.
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
    config, riding = _framework(framework, framework_options, config)
    explained = explain or tokenizer is not None or tokens is not None or worst != DEFAULT_WORST
    explained = explained or sequences is not None
    explaining = [ExplainSection(worst, sequences, tokenizer, tokens)] if explained else []
    with ledger():  # every output against every input, the tokenizer's file included, before any is read
        for section in explaining:
            section.check_outputs()
        for name, output in (("save_state", save_state), ("sequences", sequences), ("tokens", tokens)):
            writes(output, name)
        reads(path)
        for section in explaining:
            section.vocabulary()
    read = ReadOptions.of(read, options)
    by = read.columns.by if read.columns is not None else ()
    wanted: list[Any] = [*explaining, *with_defaults([*sections, *riding], by, explained=bool(explaining))]
    collector = None
    if microbatch is not None:
        from rcdiag.microbatch.rows import RowCollector

        collector = RowCollector()
    if collector is not None and read.workers == "auto":
        read = read.replace(workers=1)  # micro-batches need one process
    if collector is not None and (read.workers != 1 or read.ray):
        raise ConfigError(
            "micro-batch options need the rows of each step in order, in one process: use them without --workers "
            "or --ray."
        )
    accumulated = accumulate(
        path, config, read, on_chunk=on_chunk, save_state=save_state, sections=wanted, collector=collector
    )
    micro = None
    if collector is not None and microbatch is not None:
        from rcdiag.microbatch.section import simulate as simulate_microbatches

        micro = simulate_microbatches(collector.steps(), accumulated.state.resolved, microbatch)
    state = analyze_state(accumulated.state)
    report = build_report(
        state, accumulated.info, accumulated.device, accumulated.screen, microbatch=micro, sections=wanted
    )
    write_sections(state, report, wanted)
    return complete_verdict(report, path, read)


def _framework(
    framework: str | Chosen | None, options: Mapping[str, Any] | Sequence[str], config: CorrectionConfig | None
) -> tuple[CorrectionConfig | None, list[Section]]:
    """``config`` as ``--as verl``'s options set it, or the section computing another framework's keys."""
    if framework is None and not options:
        return config, []
    from rcdiag.frameworks.registry import Chosen, choose

    chosen = framework if isinstance(framework, Chosen) else choose(framework or "verl", options)
    config, riding = chosen.split(config)
    return config, [] if riding is None else [FrameworkSection(riding)]


def with_defaults(sections: Sequence[Section], by: tuple[str, ...] = (), *, explained: bool = False) -> list[Section]:
    """The sections every analyze runs before those given, unless given: the exact match (``rcdiag.sections.exact``),
    the bias detectors (``rcdiag.explain.detector_section``; ``explained``: ``--explain``'s section runs them on its
    own sums, so theirs is left out) and the slices (``rcdiag.sections.slices``; ``by``: the ``--by`` columns)."""
    given = [s for s in sections if not (explained and s.KEY == DetectorSection.KEY)]
    keys = {section.KEY for section in given}
    defaults: list[Section] = [ExactSection(), *([] if explained else [DetectorSection()]), SlicesSection(by)]
    return [*(section for section in defaults if section.KEY not in keys), *given]


def write_sections(state: StepStates[Any], report: Report, sections: Sequence[Section]) -> None:
    """Each section's files, from its state and record, once the report is built (never inside building it)."""
    for section in sections:
        record = report.explain if section.KEY == ExplainSection.KEY else report.sections.get(section.KEY)
        section.write(state.whole_dump.get(section.KEY), record)


def complete_verdict(report: Report, path: str | Path, read: ReadOptions | None = None) -> Report:
    """``report`` with what its verdict left open answered on the dump, in one more pass (two where sequence-level
    IS is offered):

    * the history test (``repeated_tokens_lowered``), where the verdict names ``noise`` or ``unexplained`` and the
      dump has token ids the first pass did not read (``rcdiag.verdict.history_untested``): a penalty on repeated
      tokens would explain the mismatch, and reading the ids on every run would cost every analyze their decode;
    * a ``correct`` verdict's prescription: its effect (rejected shares, IS ESS and truncated share) is what analyze
      computes under the prescribed setting, and a setting that raises one of analyze's own findings is flagged;
      where a next step offers sequence-level IS, its ESS measured under that preset (another pass).

    No pass when neither is open, or when the report was already computed with the prescribed setting and no
    history test is due (docs/performance.md)."""
    history = history_untested(report)
    setting = _prescribed(report)
    if not history and setting is None:
        return report
    config = setting or CorrectionConfig(**report.config)
    riding, record = _spoken_run(report) if setting is not None else ([], None)
    under = report
    same = config.resolve().same_computation(CorrectionConfig(**report.config).resolve())
    if history:
        try:
            under = _again(path, config, read, True, riding)
        except InputError as exc:  # the ids were read only for this test: a bad id column skips it, said once
            from rcdiag.notices import notify

            notify(f"the repeated-token test did not run: the dump's token ids cannot be read ({exc})")
            history = False
    if not history and (riding or not same):
        under = _again(path, config, read, False, riding)
    if history:  # a history finding turns the verdict to fix (no prescription) or leaves it as it was
        report = with_history(report, under)
    verdict = report.verdict
    if verdict is None or verdict.recommendation is None or setting is None:
        return report
    measured, steps, remedy = effect_of(verdict.recommendation, under)
    if measured.framework is not None:  # under --as NAME: its setting's effect under its own semantics
        ran = under.sections.get(FrameworkSection.KEY) if riding else record
        measured = dataclasses.replace(measured, framework=spoken_effect(measured.framework, ran))
    headline = verdict.headline if remedy else f"{verdict.headline} (not a remedy on this dump: see next steps)"
    offered = seq_is_unmeasured(report)
    later = verdict.next_steps
    if offered in later:  # the offer is worth a pass only with a prescription: measured, never guessed
        seq_is = seq_is_measured(_again(path, preset(SEQ_IS_PRESET, report.config["verl_version"]), read, False))
        later = tuple(seq_is if step == offered else step for step in later)
    return dataclasses.replace(
        report,
        verdict=dataclasses.replace(verdict, headline=headline, recommendation=measured, next_steps=(*steps, *later)),
    )


def _prescribed(report: Report) -> CorrectionConfig | None:
    """The setting the verdict prescribes, while its effect is still to be measured."""
    prescription = report.verdict.recommendation if report.verdict is not None else None
    if prescription is None or prescription.effect is not None:
        return None
    return CorrectionConfig(**prescription.config, verl_version=report.config["verl_version"])


def _spoken_run(report: Report) -> tuple[list[Section], Any]:
    """Under ``--as NAME``, what measures the prescription in that framework's settings: the section running them
    on the dump (none when the first pass already ran exactly them, whose record is returned, or when the framework
    has nothing alike)."""
    verdict = report.verdict
    spoken = verdict.recommendation.framework if verdict and verdict.recommendation else None
    chosen = None if spoken is None else spoken_chosen(spoken)
    if chosen is None:
        return [], None
    first = report.sections.get(FrameworkSection.KEY)
    if first is not None and first.name == chosen.name and first.options == chosen.settings.to_dict():
        return [], first
    return [FrameworkSection(chosen)], None


def _again(
    path: str | Path,
    config: CorrectionConfig,
    read: ReadOptions | None,
    token_ids: bool,
    sections: Sequence[Section] = (),
) -> Report:
    """The dump's report under ``config`` (its token ids read too, with ``token_ids``; ``sections`` riding, such as
    a framework's setting), quietly: the first pass told the user everything about the dump."""
    riding = [*([TokenIdsSection()] if token_ids else []), *sections]
    with warnings.catch_warnings(record=True):
        again = accumulate(path, config, read, sections=riding)
    return build_report(analyze_state(again.state), again.info, again.device, again.screen, sections=riding)


def with_history(report: Report, read_ids: Report) -> Report:
    """``report`` with the history statistics of ``read_ids`` (the same dump with its token ids read), their finding,
    the token column it read, and the verdict judged again."""
    extras = {**report.extras, **{key: read_ids.extras.get(key) for key in HISTORY_KEYS}}
    found = repeats(extras, report.input.valid_tokens)
    findings = ordered([*report.findings, *([found] if found else [])])
    column = read_ids.input.columns.get("token_ids")
    facts = dataclasses.replace(
        report.input,
        columns={**report.input.columns, "token_ids": column},
        dtypes={**report.input.dtypes, **({column: read_ids.input.dtypes[column]} if column else {})},
    )
    not_run = report.detectors_not_run
    updated = dataclasses.replace(
        report,
        extras=extras,
        findings=tuple(findings),
        input=facts,
        checklist=checklist(findings, report.metrics, not_run),
    )
    return dataclasses.replace(updated, verdict=judge(updated))


@dataclass(frozen=True)
class Accumulated:
    """A dump read into mergeable accumulators, before the report is computed."""

    state: StepStates[Any]
    info: SourceInfo
    device: str
    screen: ScreenStats


def accumulate(
    path: str | Path,
    config: CorrectionConfig | None = None,
    read: ReadOptions | None = None,
    *,
    on_chunk: ProgressCallback | None = None,
    save_state: str | Path | None = None,
    sections: Sequence[Section] = (),
    new_state: StateFactory | None = None,
    collector: RowCollector | None = None,
    **options: Any,
) -> Accumulated:
    """Read a dump into an ``EngineState`` (the mergeable accumulators), without computing the report.

    With ``workers > 1`` the dump's parts (runs of Parquet row groups, or of a directory's shards) are read by
    that many processes; with ``ray`` each row group or shard is a Ray task. Their states are merged: the result is
    the same as one process reading everything. ``sections`` (``rcdiag.sections``: ``--explain``'s and each
    feature's) add their accumulators, each checked against the dump first (``Section.prepare``; ``--explain``
    writes its ``sequences`` file here). ``new_state`` builds the empty state blocks are folded into instead of the
    analyze accumulators of ``config`` (the sweep passes its own); it must pickle, for the worker processes and Ray
    tasks.
    A ``collector`` keeps every screened row by step (micro-batch simulation; one process only).
    """
    resolved = (config or CorrectionConfig()).resolve()
    read = ReadOptions.of(read, options)
    named = (getattr(section, "sequences", None) for section in sections)
    sequences = next((name for name in named if name is not None), None)
    refuse_inputs([("save_state", save_state), ("sequences", sequences)], [path])  # never over the dump
    backend = _backend(read.device)
    source = open_dump(path, read.columns)
    backend = _for_size(backend, read.device, source.info)
    source.want_tokens(any(section.wants_tokens for section in sections))
    source.want_loss_inputs(any(section.wants_loss_inputs for section in sections))
    for section in sections:
        section.prepare(source.info, read)
    asked = read.workers
    if asked == "auto":  # processes only on CPU, and never for micro-batches (rows in order, one process)
        cpu = isinstance(backend, NumpyBackend) and collector is None
        read = read.replace(workers=choose_workers(source) if cpu else 1)
    parts = source.partitions(RAY_MAX_PARTS if read.ray else cast(int, read.workers))  # "auto" is a number now
    if asked != "auto" and not read.ray and len(parts) > 1:
        _say_once(too_many_workers(parts, cast(int, asked)))
    scratch = temporary_directory(sequences) if sequences is not None else None
    try:
        if read.ray or len(parts) > 1:
            if not isinstance(backend, NumpyBackend):
                raise ConfigError(f"{'ray' if read.ray else 'workers > 1'} reads on CPUs; use it with device 'cpu'.")
            job = Job.of(resolved.config, read, sections, scratch, new_state, backend.compiled)
            on_part = _PartProgress(on_chunk, len(parts), source.info.total_rows) if on_chunk is not None else None
            on_rows = on_part.rows if on_part is not None else None
            run_parts = (
                functools.partial(on_ray, address=read.ray_address)
                if read.ray
                else functools.partial(in_processes, on_rows=on_rows)
            )
            state, stats = merge_parts(source, run_parts(parts, job, on_part), job)
        else:
            screen = Screen(read.on_bad_row, vocab_size=read.vocab_size, compiled=backend.compiled)
            wholes = new_wholes(sections)
            flushes = observe(sections, wholes, resolved, scratch, 0)
            chunks = checked(number_rows(prefetch(source.chunks(read.chunk_tokens)), wholes))
            if on_chunk is not None:
                chunks = _report_progress(chunks, on_chunk, source.info.total_rows)
            engine = Engine(resolved, backend, wholes, state=new_state() if new_state else None)
            screened = screen(chunks)
            state = engine.run(collector.tee(screened) if collector is not None else screened)
            stats = screen.stats
            for flush in flushes:
                flush()
        if scratch is not None and sequences is not None:
            finish_sequences(_part_offsets(scratch, state), sequences)
    finally:
        if scratch is not None:
            cleanup(scratch)
    if save_state is not None:
        from rcdiag.state import save_state as write_state

        write_state(save_state, state, [source.info], stats)
    return Accumulated(state, source.info, backend.name, stats)


_SAID: set[str] = set()
"""Notes this process has given already (``_say_once``): a watch reads each file with its own ``accumulate``."""


def _say_once(note: str | None) -> None:
    """``note`` as a notice, the first time this process meets it."""
    if note is not None and note not in _SAID:
        from rcdiag.notices import notify

        _SAID.add(note)
        notify(note)


def _part_offsets(scratch: Path, state: StepStates[Any]) -> list[tuple[Path, int]]:
    """Each part's directory of ``--sequences`` files with the rows read before it (parts in reading order)."""
    directories = sorted(p for p in scratch.iterdir() if p.is_dir())
    rows = state.explain.part_rows if state.explain is not None and state.explain.part_rows else [0]
    return [(directory, sum(rows[:i])) for i, directory in enumerate(directories)]


def merge_states(paths: list[str | Path], *, tokenizer: str | Path | None = None) -> Report:
    """The report of one run over every shard whose state files are given (``analyze --save-state``);
    ``tokenizer`` gives the token ids' text (``analyze(tokenizer=...)``)."""
    from rcdiag.sections.registry import load_kinds
    from rcdiag.state import STATE_INPUT, combined_info, merge_state_files

    reads(*paths, what=STATE_INPUT)  # the command line's outputs are refused over them before the tokenizer is read
    explain = ExplainSection(tokenizer=tokenizer)
    explain.vocabulary()
    load_kinds()
    state, sources, stats = merge_state_files(paths, "analyze")
    given: list[Any] = [explain] if ExplainSection.KEY in state.whole_dump else []
    return build_report(analyze_state(state), combined_info(sources), "merged", stats, sections=given)


class _PartProgress:
    """Progress over parts: each worker's rows and tokens as it reads them (``rows``), each finished part's final
    counts (called as a ``PartCallback``)."""

    def __init__(self, on_chunk: ProgressCallback, total: int, total_rows: int | None) -> None:
        self.on_chunk, self.total, self.total_rows = on_chunk, total, total_rows
        self.counts: dict[int, tuple[int, int]] = {}
        self.finished: set[int] = set()
        self.done = 0
        self.final = [0, 0]

    def rows(self, part: int, rows: int, tokens: int) -> None:
        if part not in self.finished:
            self.counts[part] = (rows, tokens)
            self._show()

    def __call__(self, done: int, _: int, result: PartResult) -> None:
        self.done = done
        self.finished.add(done - 1)  # parts finish in order
        self.counts.pop(done - 1, None)
        self.final[0] += result.rows
        self.final[1] += result.tokens
        self._show()

    def _show(self) -> None:
        rows = self.final[0] + sum(r for r, _ in self.counts.values())
        tokens = self.final[1] + sum(t for _, t in self.counts.values())
        self.on_chunk(ReadProgress(rows, tokens, self.total_rows, parts=self.done, total_parts=self.total))


def _report_progress(chunks: Iterable[Chunk], on_chunk: ProgressCallback, total_rows: int | None) -> Iterator[Chunk]:
    rows = tokens = 0
    for chunk in chunks:
        rows += chunk.n_rows
        tokens += chunk.n_tokens
        on_chunk(ReadProgress(rows, tokens, total_rows))
        yield chunk


def analyze_chunks(
    chunks: Iterable[Chunk], config: CorrectionConfig | None = None, read: ReadOptions | None = None, **options: Any
) -> Report:
    """Like ``analyze`` but over chunks you built yourself (e.g. from tensors in a training loop); of ``read``,
    ``device`` and ``on_bad_row`` apply.

    A chunk's arrays may be numpy arrays or torch tensors (any device; converted to float32 numpy), flat with
    ``offsets``, or 2-D (rows x positions) with ``offsets=None``; a malformed chunk is an ``InputError`` naming
    it (``chunk 0``, ...). Example in docs/index.md.
    """
    resolved = (config or CorrectionConfig()).resolve()
    read = ReadOptions.of(read, options)
    backend = _backend(read.device)
    screen = Screen(read.on_bad_row)
    sections = with_defaults(())
    engine = Engine(resolved, backend, new_wholes(sections))
    state = engine.run(screen(as_chunk(chunk, index) for index, chunk in enumerate(chunks)))
    info = SourceInfo(path="<memory>", format="chunks")
    return build_report(analyze_state(state), info, backend.name, screen.stats, sections=sections)


def _backend(device: str | Backend) -> Backend:
    return device if isinstance(device, Backend) else get_backend(device)


def analyze_state(state: StepStates[Any]) -> EngineState:
    """``state`` as analyze's (a sweep's state makes a sweep report, not this one: ``rcdiag.sweep.run``)."""
    if not isinstance(state, EngineState):
        raise ConfigError(
            "these are states of `rcdiag sweep --save-state`: merge them with `rcdiag merge` (a sweep report)"
        )
    return state


def _for_size(backend: Backend, device: str | Backend, info: SourceInfo) -> Backend:
    """The numpy backend without numba for a dump whose files are small (``rcdiag.kernels.small``): decided once,
    here, from the files' sizes, before the first block. A backend the caller built is kept as it is."""
    if isinstance(device, Backend) or not isinstance(backend, NumpyBackend):
        return backend
    from rcdiag.kernels.small import compiled_for

    return backend if compiled_for(read.get("size") for read in info.reads) else NumpyBackend(compiled=False)


def build_report(
    state: EngineState,
    info: SourceInfo,
    device: str,
    screen: ScreenStats | None = None,
    *,
    microbatch: MicroBatchReport | None = None,
    sections: Sequence[Section] = (),
    step_hits: StepHits = batch_hits,
) -> Report:
    """Compute every batch, the all-steps view, each section's record and every finding (and the micro-batch
    section, when simulated). ``sections``: the run's (``rcdiag.sections``); a state it holds that no section given
    reads (a merged state file's) is read by its registered kind's defaults (``rcdiag.sections.registry``). Writes
    nothing (``write_sections``). ``step_hits``: ``health.evaluate``'s (``rcdiag watch`` keeps steps' hits)."""
    has_steps = any(step is not None for step in state.batches)
    per_step = sorted(
        ((step, batch.compute()) for step, batch in state.batches.items()),
        key=lambda item: (item[0] is None, item[0] or 0),
    )
    pooled = per_step[0][1] if not has_steps and per_step else state.pooled().compute()
    steps = tuple(
        StepReport(int(step), result.rows, result.valid_tokens, result.metrics, result.extras)
        for step, result in per_step
        if step is not None
    )
    facts = input_facts(state, info, screen)
    findings: list[Finding] = evaluate(
        per_step if per_step else [(None, pooled)], state.resolved, facts, step_hits=step_hits
    )
    findings.extend(signature_findings(pooled.metrics, pooled.extras, state.valid_tokens))
    stepped = [(step, result.metrics) for step, result in per_step if step is not None]
    run = RunFacts(state.resolved, pooled.metrics, pooled.extras, stepped, facts)
    from rcdiag.sections.registry import sections_for

    records: dict[str, Any] = {}
    for section in sections_for(state.whole_dump, sections):
        whole = state.whole_dump.get(section.KEY)
        record = section.record(whole, run)
        if record is not None:
            records[section.KEY] = record
        findings.extend(section.findings(whole, run))
    if not {ExplainSection.KEY, DetectorSection.KEY} & set(state.whole_dump):  # a state without the detectors'
        from rcdiag.explain.detectors import mismatch_trend  # sums: the trend reads only the per-step metrics

        trend = mismatch_trend(stepped)
        findings.extend([] if trend is None else [trend])
    if microbatch is not None:
        from rcdiag.microbatch.section import findings as microbatch_findings

        findings.extend(microbatch_findings(microbatch))
    findings = ordered(findings)
    explain = records.pop(ExplainSection.KEY, None)
    metrics, extras = pooled.metrics, pooled.extras
    for record in records.values():
        if isinstance(record, ValuesRecord):  # a framework's own keys (--as NAME) first, per step and pooled
            metrics, extras = {**record.pooled.metrics, **metrics}, {**extras, **record.pooled.extras}
            steps = tuple(_with_values(step, record.step_metrics(step.step)) for step in steps)
    detectors = records.pop(DetectorSection.KEY, None)
    not_run = explain.not_run if explain is not None else None if detectors is None else detectors.not_run
    report = Report(
        config=state.resolved.config.to_dict(),
        input=facts,
        metrics=metrics,
        extras=extras,
        steps=steps,
        findings=tuple(findings),
        device=device,
        version=__version__,
        log_ratio=pooled.log_ratio,
        explain=explain,
        detectors=detectors,
        microbatch=microbatch,
        sections=records,
        checklist=checklist(findings, pooled.metrics, not_run),
    )
    return dataclasses.replace(report, verdict=judge(report))


def _with_values(step: StepReport, values: Values) -> StepReport:
    """A step with a section's values beside verl's (its keys first) and rcdiag's."""
    return dataclasses.replace(
        step, metrics={**values.metrics, **step.metrics}, extras={**step.extras, **values.extras}
    )


def input_facts(state: StepStates[Any], info: SourceInfo, screen: ScreenStats | None = None) -> InputFacts:
    """What was read: the dump's description and the counts the state holds."""
    steps = sum(step is not None for step in state.batches)
    return InputFacts(
        path=info.path,
        format=info.format,
        rows=state.rows,
        tokens=state.tokens,
        valid_tokens=state.valid_tokens,
        empty_rows=sum(batch.empty_rows for batch in state.batches.values()),
        steps=steps,
        skipped_rows=screen.skipped_rows if screen else 0,
        columns=dict(info.columns),
        dtypes=dict(info.dtypes),
        metadata=dict(info.metadata),
        skipped_by_reason=dict(screen.skipped_by_reason) if screen else {},
        neg_inf_tokens=dict(screen.neg_inf_tokens) if screen else {},
        files=info.files,
        step_source=info.step_source if steps else "",
        neg_inf_first=dict(screen.neg_inf_first) if screen else {},
    )
