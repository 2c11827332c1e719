"""Reading a dump's parts in parallel: local processes (``--workers``) or Ray tasks (``--ray``).

Both run the same function on each ``Part``: open just that part (from disk or object storage), run the engine,
and return the engine state, the screen's counts, the first bad row and the run facts seen in columns. The driver
merges them in part order (the mergeable accumulators), so the report equals one process reading everything,
skipped rows included. Ray is imported only when ``--ray`` is used.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rcdiag.runtime.interrupts as interrupts
from rcdiag.engine.stream import Engine, EngineState, KindsOf, StepStates, WholeDump, number_rows
from rcdiag.io import open_part, prefetch
from rcdiag.io.base import Part, Source
from rcdiag.io.screen import Problem, Screen, ScreenStats, raise_for_bad_rows
from rcdiag.metrics.backend import NumpyBackend
from rcdiag.runtime.errors import ConfigError, RcdiagError
from rcdiag.settings.correction import CorrectionConfig
from rcdiag.settings.reading import ReadOptions

RAY_RETRIES = 3
"""Ray re-runs a task this many times after its worker died or it raised something other than an rcdiag error
(a storage hiccup); an rcdiag error (a bad file) is deterministic and stops the run at once."""
RAY_MAX_PARTS = 4096
"""At most this many tasks: beyond it, consecutive row groups or files share a task."""


@dataclass(frozen=True)
class PartResult:
    """What a worker sends back for one part: plain data, cheap to pickle."""

    state: dict
    stats: dict
    problem: Problem | None
    metadata: dict[str, list[str]]
    rows: int
    tokens: int


PartCallback = Callable[[int, int, PartResult], None]
"""Called as each part finishes: ``(parts done, parts in all, that part's result)``."""
RowsCallback = Callable[[int, int, int], None]
"""Called while a worker process reads: ``(part index, its rows so far, its tokens so far)``."""
PROGRESS_INTERVAL = 0.2
"""Seconds between looks at the workers' progress messages while waiting for a part."""
_CHANNEL: Any = None
"""In a worker process: the queue its progress and notices go to (``None`` elsewhere)."""


StateFactory = Callable[[], StepStates[Any]]
"""Builds the empty state a read folds blocks into (picklable: worker processes and Ray tasks call it too)."""


@dataclass(frozen=True)
class Job:
    """What every part of one run is read with: the configuration, how to read (CPU), the run's sections
    (``rcdiag.sections``: each builds its part's whole-dump accumulator), for ``--sequences`` the local scratch
    directory each part writes its rows under, and the state to fold into (``new_state``: the sweep's; default the
    analyze accumulators)."""

    config: CorrectionConfig
    read: ReadOptions
    sections: tuple[Any, ...] = ()
    scratch: Path | None = None
    new_state: StateFactory | None = None
    compiled: bool = True
    """The numba kernels, or the numpy path the run chose for a small dump (``rcdiag.kernels.small``): every part
    takes the same, so the result does not depend on how the dump was split."""

    @classmethod
    def of(
        cls,
        config: CorrectionConfig,
        read: ReadOptions,
        sections: Sequence[Any],
        scratch: Path | None,
        new_state: StateFactory | None = None,
        compiled: bool = True,
    ) -> Job:
        read = read.replace(device="cpu", ray=False, ray_address=None)
        return cls(config, read, tuple(sections), scratch, new_state, compiled)

    def wholes(self) -> list[WholeDump]:
        """A fresh whole-dump accumulator of each section that keeps one."""
        return new_wholes(self.sections)

    def empty_state(self) -> StepStates[Any] | None:
        """The state to fold a part into (``None``: the engine's default)."""
        return self.new_state() if self.new_state is not None else None


def read_part(part: Part, job: Job, index: int = 0) -> PartResult:
    """Read one part with the numpy engine; bad rows are counted (the driver judges them over the whole dump).
    With ``job.sections``, their accumulators too, and with ``job.scratch`` the part's ``--sequences`` rows go there
    (``index`` names the part's directory)."""
    read = job.read
    source = open_part(part, read.columns)
    source.want_tokens(any(section.wants_tokens for section in job.sections))
    source.want_loss_inputs(any(section.wants_loss_inputs for section in job.sections))
    screen = Screen(read.on_bad_row, verdict_at_end=False, vocab_size=read.vocab_size, compiled=job.compiled)
    resolved = job.config.resolve()
    wholes = job.wholes()
    flushes = observe(job.sections, wholes, resolved, job.scratch, index)
    chunks = number_rows(prefetch(source.chunks(read.chunk_tokens, part=part.within)), wholes)
    if _CHANNEL is not None:
        chunks = _reporting(chunks, index)
    engine = Engine(resolved, NumpyBackend(job.compiled), wholes=wholes, state=job.empty_state())
    state = engine.run(screen(chunks))
    for flush in flushes:
        flush()
    return PartResult(
        state.state_dict(), screen.stats.to_dict(), screen.first, source.seen_metadata(), state.rows, state.tokens
    )


def merge_parts(source: Source, results: list[PartResult], job: Job) -> tuple[StepStates[Any], ScreenStats]:
    """The merged state and counts of every part, in part order (the first bad row is the earliest)."""
    resolved = job.config.resolve()
    wholes = job.wholes()
    kinds = KindsOf.of(wholes)
    merged: StepStates[Any] = job.new_state() if job.new_state else EngineState(resolved)
    merged.whole_dump.update({whole.KEY: whole for whole in wholes})
    stats = ScreenStats()
    part_rows = []
    first: Problem | None = None
    seen: dict[str, set[str]] = {}
    for result in results:
        part = type(merged).from_state_dict(resolved, result.state, kinds)
        part_rows.append(next((saved.rows_read for saved in part.whole_dump.values()), 0))
        merged.merge(part)
        stats = stats.merge(ScreenStats.from_dict(result.stats))
        first = first or result.problem
        for key, values in result.metadata.items():
            seen.setdefault(key, set()).update(values)
    source.add_metadata({key: sorted(values) for key, values in seen.items()})
    raise_for_bad_rows(first, stats)  # counted over the whole dump, not one part
    for kept in merged.whole_dump.values():
        kept.part_rows = part_rows
    return merged, stats


def new_wholes(sections: Sequence[Any]) -> list[WholeDump]:
    """A fresh whole-dump accumulator of each section that keeps one (``Section.new_state``), in section order."""
    return [state for state in (section.new_state() for section in sections) if state is not None]


def observe(
    sections: Sequence[Any], wholes: Sequence[WholeDump], resolved: Any, scratch: Path | None, part: int
) -> list[Callable[[], None]]:
    """Attach each section's per-row consumers to its state; the flushes of those that attached one."""
    by_key = {whole.KEY: whole for whole in wholes}
    flushes = (section.observe(by_key.get(section.KEY), resolved, scratch, part) for section in sections)
    return [flush for flush in flushes if flush is not None]


CPUS_PER_PROCESS = 2
"""Cores one process keeps busy: pyarrow decodes two row groups at a time on its threads while the calling thread
runs the maths (docs/performance.md). A second process on the same two cores only competes with the first."""
MIN_BYTES_PER_WORKER = 512 * 2**20
"""Dump bytes (on disk) a worker must have for ``--workers auto`` to start it: each worker pays a fresh interpreter,
rcdiag's imports and loading the kernels (about 0.5-0.7 s), about what one process needs to read 400-500 MB of
zstd Parquet (docs/performance.md#workers)."""


def auto_workers(dump_bytes: int, parts: int, cpus: int) -> int:
    """``--workers auto``: one process per ``CPUS_PER_PROCESS`` cores, no more than the dump's parts, and only as
    many as the dump has ``MIN_BYTES_PER_WORKER`` for; 1 whenever a second process cannot win (two cores, a small
    dump, a dump that does not split)."""
    return max(1, min(cpus // CPUS_PER_PROCESS, parts, dump_bytes // MIN_BYTES_PER_WORKER))


def usable_cpus() -> int:
    """The cores this process may run on (its affinity mask, e.g. a container's or ``taskset``'s), else all."""
    with contextlib.suppress(AttributeError, OSError):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def choose_workers(source: Source, cpus: int | None = None) -> int:
    """``auto_workers`` for this dump: its parts and the size of its files (a file whose size is unknown, such as
    a remote one, counts as ``MIN_BYTES_PER_WORKER``)."""
    cpus = usable_cpus() if cpus is None else cpus
    most = cpus // CPUS_PER_PROCESS
    if most < 2:
        return 1
    parts = source.partitions(most)
    return auto_workers(dump_bytes(parts), len(parts), cpus)


def dump_bytes(parts: list[Part]) -> int:
    """The size of the parts' files, each once (unknown: ``MIN_BYTES_PER_WORKER``)."""
    sizes: dict[str, int] = {}
    for part in parts:
        for _, where in part.files:
            if where not in sizes:
                try:
                    sizes[where] = os.path.getsize(where)
                except (OSError, ValueError):
                    sizes[where] = MIN_BYTES_PER_WORKER
    return sum(sizes.values())


def too_many_workers(parts: list[Part], asked: int, cpus: int | None = None) -> str | None:
    """Why ``len(parts)`` processes (``--workers asked``, split into these parts) are more than help, by the rule
    ``--workers auto`` follows (``auto_workers``); ``None`` when they are not. The run still starts them: the
    number was the user's choice, this only says it may cost time."""
    cpus = usable_cpus() if cpus is None else cpus
    started = len(parts)
    size = dump_bytes(parts)
    helpful = auto_workers(size, started, cpus)
    if started <= helpful:
        return None
    reasons = []
    if cpus // CPUS_PER_PROCESS < started:
        reasons.append(
            f"{cpus} core(s) here keep {max(1, cpus // CPUS_PER_PROCESS)} process(es) busy (each decodes on "
            f"{CPUS_PER_PROCESS} threads while it computes)"
        )
    if size // MIN_BYTES_PER_WORKER < started:
        reasons.append(
            f"the dump's {size / 2**20:.3g} MiB give each worker less than {MIN_BYTES_PER_WORKER >> 20} MiB to "
            "pay for its start (a fresh interpreter and the kernels, about 0.5-0.7 s)"
        )
    return (
        f"note: --workers {asked} starts {started} processes, more than help: {'; and '.join(reasons)}; "
        f"`--workers auto` would use {helpful}, which is likely faster (docs/scale-out.md)"
    )


def in_processes(
    parts: list[Part], job: Job, on_part: PartCallback | None = None, on_rows: RowsCallback | None = None
) -> list[PartResult]:
    """Each part in its own local process (``--workers``). Workers report their rows as they read them
    (``on_rows``) and pass their notices (kernels compiling) to this process, which emits each once. Workers ignore
    Ctrl-C (it reaches the whole process group); on any way out but success (an abort, a bad part) the parent stops
    them and waits for them to end, so none outlives the run or writes into a scratch directory being removed."""
    context = multiprocessing.get_context("spawn")  # the parent holds Arrow threads: fork is not safe
    channel = context.SimpleQueue()
    said: set[str] = set()

    def drain() -> None:
        while not channel.empty():
            message = channel.get()
            if message[0] == "rows" and on_rows is not None:
                on_rows(*message[1:])
            elif message[0] == "notice" and message[2] not in said:
                said.add(message[2])
                from rcdiag.runtime.notices import Busy, Notice, notify

                notify(message[2], Busy if message[1] else Notice)

    pool = ProcessPoolExecutor(
        max_workers=len(parts), mp_context=context, initializer=_worker_start, initargs=(channel,)
    )
    try:
        futures = [pool.submit(read_part, part, job, i) for i, part in enumerate(parts)]
        results = []
        for done, future in enumerate(futures, start=1):
            results.append(_result(future, drain))
            drain()
            if on_part is not None:
                on_part(done, len(parts), results[-1])
    except BaseException:
        _stop(pool)
        raise
    pool.shutdown()
    drain()
    return results


def _result(future: Future, drain: Callable[[], None]) -> Any:
    """The future's result, passing the workers' messages on while waiting."""
    while not future.done():
        wait([future], timeout=PROGRESS_INTERVAL)
        drain()
    return future.result()


def _worker_start(channel: Any) -> None:
    """A worker process's start: Ctrl-C ignored (the parent decides), progress and notices go to ``channel`` (the
    driver shows them), not stderr."""
    interrupts.ignore_in_worker()
    global _CHANNEL
    _CHANNEL = channel
    from rcdiag.runtime.notices import Busy, Notice

    shown = warnings.showwarning

    def show(message: Any, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        if issubclass(category, Notice):
            channel.put(("notice", issubclass(category, Busy), str(message)))
        else:
            shown(message, category, *args, **kwargs)

    warnings.showwarning = show


def _reporting(chunks: Iterable[Any], index: int) -> Iterator[Any]:
    """``chunks`` unchanged, each one's rows and tokens added to this part's count on the channel."""
    rows = tokens = 0
    for chunk in chunks:
        rows += chunk.n_rows
        tokens += chunk.n_tokens
        _CHANNEL.put(("rows", index, rows, tokens))
        yield chunk


def _stop(pool: ProcessPoolExecutor) -> None:
    """End a pool's workers now (terminate, then wait for them), without waiting for their parts."""
    workers = list((getattr(pool, "_processes", None) or {}).values()) or multiprocessing.active_children()
    pool.shutdown(wait=False, cancel_futures=True)
    for worker in workers:
        with contextlib.suppress(Exception):
            worker.terminate()
    for worker in workers:
        with contextlib.suppress(Exception):
            worker.join(timeout=5)


def on_ray(
    parts: list[Part], job: Job, on_part: PartCallback | None = None, address: str | None = None
) -> list[PartResult]:
    """Each part as a Ray task on the cluster at ``address`` (else ``RAY_ADDRESS``, else a local Ray instance). A
    task reads its part directly from where the dump lives, with the worker's own credentials; ``job.scratch``
    (``--sequences``) must be ``None``: a task elsewhere cannot write to this machine."""
    if job.scratch is not None:
        raise ConfigError("--sequences cannot be written by Ray tasks; use it without --ray.")
    ray = _import_ray()
    _connect(ray, address)
    task = ray.remote(_ray_task).options(
        num_cpus=1, max_retries=RAY_RETRIES, retry_exceptions=True, name="rcdiag-read-part"
    )
    refs = [task.remote(part, job) for part in parts]
    index = {ref: i for i, ref in enumerate(refs)}
    results: list[Any] = [None] * len(parts)
    pending, done = list(refs), 0
    while pending:
        try:
            ready, pending = ray.wait(pending, num_returns=1)
        except BaseException:  # an abort: no task keeps running for a run that has ended
            _cancel(ray, pending)
            raise
        i = index[ready[0]]
        try:
            outcome = ray.get(ready[0])
        except Exception as exc:  # the task failed RAY_RETRIES + 1 times
            _cancel(ray, pending)
            raise PartFailedError(parts[i], i, len(parts), exc) from None
        if isinstance(outcome, RcdiagError):  # a bad file: the same on every try
            _cancel(ray, pending)
            raise outcome
        results[i] = outcome
        done += 1
        if on_part is not None:
            on_part(done, len(parts), outcome)
    return results


class PartFailedError(RcdiagError):
    """A part that failed on every try (its worker died, or its storage kept failing)."""

    def __init__(self, part: Part, index: int, total: int, cause: BaseException) -> None:
        reason = _first_line(cause)
        super().__init__(
            f"part {index + 1} of {total} ({part.describe()}) failed {RAY_RETRIES + 1} times; the last error: {reason}"
        )
        self.part = part


def _ray_task(part: Part, job: Job) -> PartResult | RcdiagError:
    """The Ray task: an rcdiag error (bad data) is returned, not raised, so that Ray does not retry it."""
    try:
        return read_part(part, job)
    except RcdiagError as exc:
        return exc


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("--ray needs Ray, which is not installed: pip install 'rcdiag[ray]'") from None
    return ray


def _connect(ray: Any, address: str | None) -> None:
    """Join the cluster (``address``, else ``RAY_ADDRESS``), or start a local Ray instance when none is set."""
    if ray.is_initialized():
        return
    import logging
    import os

    target = address or os.environ.get("RAY_ADDRESS") or None
    local = {} if target else {"include_dashboard": False}
    try:
        ray.init(address=target, logging_level=logging.ERROR, log_to_driver=False, **local)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError(f"cannot connect to the Ray cluster at {target}: {_first_line(exc)}") from None
    except SystemExit as exc:  # ray.init's own SIGTERM handler (sys.exit) ran before ours was back
        if exc.code == signal.SIGTERM or "SIGTERM" in str(exc):
            interrupts.record(signal.SIGTERM)
        raise
    finally:
        interrupts.reinstall()  # ray.init sets its own SIGTERM handler


def _cancel(ray: Any, refs: list[Any]) -> None:
    for ref in refs:
        with contextlib.suppress(Exception):  # already finished or gone: nothing to stop
            ray.cancel(ref, force=True)


def _first_line(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None) or exc
    text = str(cause).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return f"{type(cause).__name__}: {lines[-1].strip()[:200]}" if lines else type(cause).__name__
