"""The one engine entry of every library command: a dump (a path), chunks in memory or saved states read into
mergeable accumulators (``Accumulated``), with the run's sections riding on it. ``analyze``, ``check``, ``compare``,
the sweep and ``merge`` build their reports from it; ``watch`` reads each file with it."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from rcdiag.api.progress import PartProgress, ProgressCallback, report_progress
from rcdiag.engine.parallel import (
    RAY_MAX_PARTS,
    Job,
    StateFactory,
    choose_workers,
    in_processes,
    merge_parts,
    new_wholes,
    observe,
    on_ray,
    too_many_workers,
)
from rcdiag.engine.stream import Engine, StepStates, number_rows
from rcdiag.io import Chunk, open_dump, prefetch
from rcdiag.io.base import SourceInfo
from rcdiag.io.outputs import refuse_inputs, remove_directory
from rcdiag.io.screen import Screen, ScreenStats, as_chunk
from rcdiag.metrics.backend import Backend, NumpyBackend, get_backend
from rcdiag.runtime.errors import ConfigError
from rcdiag.runtime.interrupts import checked
from rcdiag.sections import Section
from rcdiag.settings.correction import CorrectionConfig
from rcdiag.settings.reading import ReadOptions


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
    **options: Any,
) -> Accumulated:
    """Read a dump into an ``EngineState`` (the mergeable accumulators), without computing the report.

    With ``workers > 1`` the dump's parts (runs of Parquet row groups, or of a directory's shards) are read by
    that many processes; with ``ray`` each row group or shard is a Ray task. Their states are merged: the result is
    the same as one process reading everything. ``sections`` (``rcdiag.sections``: ``--explain``'s and each
    feature's) add their accumulators, each checked against the dump first (``Section.prepare``; a section that
    needs every row in one process, ``Section.ONE_PROCESS``, reads in one; ``--explain`` writes its ``sequences``
    file here). ``new_state`` builds the empty state blocks are folded into instead of the analyze accumulators of
    ``config`` (the sweep passes its own); it must pickle, for the worker processes and Ray tasks.
    """
    read = _one_process(ReadOptions.of(read, options), sections)
    resolved = (config or CorrectionConfig()).resolve()
    refuse_inputs([("save_state", save_state), *(named for s in sections for named in s.outputs())], [path])
    backend = _backend(read.device)
    source = open_dump(path, read.columns)
    backend = _for_size(backend, read.device, source.info)
    source.want_tokens(any(section.wants_tokens for section in sections))
    source.want_loss_inputs(any(section.wants_loss_inputs for section in sections))
    for section in sections:
        section.prepare(source.info, read)
    asked = read.workers
    if asked == "auto":  # processes only on CPU
        read = read.replace(workers=choose_workers(source) if isinstance(backend, NumpyBackend) else 1)
    parts = source.partitions(RAY_MAX_PARTS if read.ray else cast(int, read.workers))  # "auto" is a number now
    if asked != "auto" and not read.ray and len(parts) > 1:
        _say_once(too_many_workers(parts, cast(int, asked)))
    writer, scratch = _scratch(sections)
    try:
        if read.ray or len(parts) > 1:
            if not isinstance(backend, NumpyBackend):
                raise ConfigError(f"{'ray' if read.ray else 'workers > 1'} reads on CPUs; use it with device 'cpu'.")
            job = Job.of(resolved.config, read, sections, scratch, new_state, backend.compiled)
            on_part = PartProgress(on_chunk, len(parts), source.info.total_rows) if on_chunk is not None else None
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
                chunks = report_progress(chunks, on_chunk, source.info.total_rows)
            engine = Engine(resolved, backend, wholes, state=new_state() if new_state else None)
            state = engine.run(screen(chunks))
            stats = screen.stats
            for flush in flushes:
                flush()
        if writer is not None and scratch is not None:
            writer.gather(state.whole_dump.get(writer.KEY), scratch)
    finally:
        if scratch is not None:
            remove_directory(scratch)
    if save_state is not None:
        from rcdiag.engine.state_files import save_state as write_state
        from rcdiag.sections.registry import KNOWN

        write_state(save_state, _saved(state, sections), [source.info], stats, KNOWN)
    return Accumulated(state, source.info, backend.name, stats)


def accumulate_chunks(
    chunks: Iterable[Chunk],
    config: CorrectionConfig | None = None,
    read: ReadOptions | None = None,
    *,
    sections: Sequence[Section] = (),
    new_state: StateFactory | None = None,
    **options: Any,
) -> Accumulated:
    """``accumulate`` over chunks built in memory (``rcdiag.analyze_chunks``, ``rcdiag.sweep.sweep_chunks``): one
    process, no file; of ``read``, ``device`` and ``on_bad_row`` apply."""
    resolved = (config or CorrectionConfig()).resolve()
    read = ReadOptions.of(read, options)
    backend = _backend(read.device)
    screen = Screen(read.on_bad_row)
    engine = Engine(resolved, backend, new_wholes(sections), state=new_state() if new_state else None)
    state = engine.run(screen(as_chunk(chunk, index) for index, chunk in enumerate(chunks)))
    return Accumulated(state, SourceInfo(path="<memory>", format="chunks"), backend.name, screen.stats)


def merge_files(paths: list[str | Path], kind: str | None = None) -> Accumulated:
    """Saved states (``--save-state``) merged into the state of one run over every shard: of ``kind`` (``analyze``,
    ``sweep``; each file of another kind refused), else of the first file's (the state's ``KIND`` says which)."""
    from rcdiag.engine.state_files import combined_info, merge_state_files
    from rcdiag.sections.registry import KNOWN

    state, sources, stats = merge_state_files(paths, KNOWN, kind)
    return Accumulated(state, combined_info(sources), "merged", stats)


def _one_process(read: ReadOptions, sections: Sequence[Section]) -> ReadOptions:
    """``read`` in one process when a section needs every row in order there (``Section.ONE_PROCESS``: ``auto``
    becomes 1, and ``--workers N`` or ``--ray`` is refused)."""
    needs = next((section.ONE_PROCESS for section in sections if section.ONE_PROCESS), "")
    if not needs:
        return read
    if read.workers == "auto":
        read = read.replace(workers=1)
    if read.workers != 1 or read.ray:
        raise ConfigError(
            f"{needs} need the rows of each step in order, in one process: use them without --workers or --ray."
        )
    return read


def _scratch(sections: Sequence[Section]) -> tuple[Section | None, Path | None]:
    """The section writing files while the dump is read (``--sequences``) and its scratch directory, if any."""
    for section in sections:
        scratch = section.scratch()
        if scratch is not None:
            return section, scratch
    return None, None


def _saved(state: StepStates[Any], sections: Sequence[Section]) -> StepStates[Any]:
    """``state`` as ``--save-state`` writes it: without the states of sections that are not saved
    (``Section.SAVED``: the micro-batches' rows)."""
    unsaved = {section.KEY for section in sections if not section.SAVED}
    if not unsaved & set(state.whole_dump):
        return state
    return dataclasses.replace(state, whole_dump={k: v for k, v in state.whole_dump.items() if k not in unsaved})


_SAID: set[str] = set()
"""Notes this process has given already (``_say_once``): a watch reads each file with its own ``accumulate``."""


def _say_once(note: str | None) -> None:
    """``note`` as a notice, the first time this process meets it."""
    if note is not None and note not in _SAID:
        from rcdiag.runtime.notices import notify

        _SAID.add(note)
        notify(note)


def _backend(device: str | Backend) -> Backend:
    return device if isinstance(device, Backend) else get_backend(device)


def _for_size(backend: Backend, device: str | Backend, info: SourceInfo) -> Backend:
    """The numpy backend without numba for a dump whose files are small (``rcdiag.kernels.small``): decided once,
    here, from the files' sizes, before the first block. A backend the caller built is kept as it is."""
    if isinstance(device, Backend) or not isinstance(backend, NumpyBackend):
        return backend
    from rcdiag.kernels.small import compiled_for

    return backend if compiled_for(read.get("size") for read in info.reads) else NumpyBackend(compiled=False)
