"""The streaming engine: chunks in, one ``BatchMetrics`` per training step out.

For each chunk it groups rows by step and feeds blocks of whole rows (about 512k tokens on CPU,
``CPU_BLOCK_TOKENS``; 16M on a GPU) to the step's accumulators, with their padding and mask: a block drops its
padding only when a metric needs the valid tokens one by one. Chunks come checked by a ``rcdiag.io.screen.Screen``;
one that did not (built by hand) is checked here the same way. Merging is the only way results combine, so the
result does not depend on chunk size, row order or how steps interleave in the file.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypedDict, TypeVar

import numpy as np

from rcdiag.io.base import Chunk, split_rows
from rcdiag.io.ragged import take_rows
from rcdiag.io.screen import screen_one
from rcdiag.metrics.backend import Backend, NumpyBackend
from rcdiag.metrics.batch import BatchMetrics
from rcdiag.metrics.block import Block, RowContext
from rcdiag.metrics.rejection import bounds
from rcdiag.runtime.fields import FieldError, integer, shown
from rcdiag.runtime.fields import step as saved_step
from rcdiag.settings.correction import ResolvedConfig

if TYPE_CHECKING:
    from typing_extensions import Self

CPU_BLOCK_TOKENS = 1 << 19
GPU_BLOCK_TOKENS = 1 << 24

StepKey = int | None


class WholeDump(Protocol):
    """An accumulator of the whole dump beside the per-step ones (``--explain``'s): the protocol of
    ``rcdiag.metrics.base.Accumulator`` (its parts are such accumulators), fed every block on the host with its
    rows' context (``Block.rows``), and numbering rows in reading order (``number``) so that merged parts keep
    global row numbers. The engine and the state files know it only by its ``KEY``; a saved state's kinds are given
    to them (``WholeDumpKinds``), the one table of them being ``rcdiag.sections.registry``."""

    KEY: str
    rows_read: int
    """Rows numbered so far (the next row's number)."""
    part_rows: list[int]
    """Rows read by each worker part, in order (set on a merged state: ``rcdiag.engine.parallel.merge_parts``)."""

    def update(self, block: Block) -> None: ...
    def merge(self, other: Any) -> Any: ...
    def number(self, chunk: Chunk) -> Chunk: ...
    def signature(self) -> tuple: ...
    def state_dict(self) -> dict[str, Any]: ...


class WholeDumpKinds(Protocol):
    """Where a saved state finds the kind of each whole-dump accumulator it holds, by key: the table of section kinds
    (``rcdiag.sections.registry.KNOWN``) for a state file, a run's own sections for its worker parts
    (``KindsOf``). The engine imports no feature: it is given the kinds."""

    def whole_dump(self, key: str) -> Any:
        """The class saved under ``key``, with ``from_state_dict`` and ``layout``; a ``FieldError`` for an unknown
        key."""
        ...


@dataclass(frozen=True)
class KindsOf:
    """The kinds of the whole-dump accumulators a run keeps (each section's), by key: its worker parts' saved
    states are read back with them."""

    kinds: dict[str, Any]

    @classmethod
    def of(cls, wholes: Sequence[WholeDump]) -> KindsOf:
        return cls({whole.KEY: type(whole) for whole in wholes})

    def whole_dump(self, key: str) -> Any:
        kind = self.kinds.get(key)
        if kind is None:
            raise FieldError(f"state.whole_dump.{key} is a state this run does not keep ({', '.join(self.kinds)})")
        return kind


def number_rows(chunks: Iterable[Chunk], wholes: Sequence[WholeDump] = ()) -> Iterator[Chunk]:
    """Number rows in reading order as they are read, before any can be skipped (a no-op without whole-dump
    accumulators): the first numbers them, every other counts the same rows (each merges by its own count)."""
    if not wholes:
        yield from chunks
        return
    for chunk in chunks:
        yield number_chunk(chunk, wholes)


def number_chunk(chunk: Chunk, wholes: Sequence[WholeDump]) -> Chunk:
    """Number one chunk's rows by the first whole-dump accumulator; every other counts the same rows."""
    chunk = wholes[0].number(chunk)
    for other in wholes[1:]:
        other.rows_read = wholes[0].rows_read
    return chunk


class StepBatch(Protocol):
    """What a state keeps per training step: accumulators fed blocks, merged, saved (``BatchMetrics``, the sweep's
    ``SweepBatch``)."""

    rows: int
    valid_tokens: int
    empty_rows: int

    def update(self, block: Block) -> None: ...

    def merge(self, other: Self) -> Self: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def counts_contradiction(self) -> str | None: ...


B = TypeVar("B", bound=StepBatch)
S = TypeVar("S", bound="StepStates[Any]")


@dataclass
class StepStates(Generic[B]):
    """Accumulated state of a whole dump: one batch of accumulators per step (``new_batch``), plus input counters.
    ``EngineState`` keeps ``rcdiag analyze``'s (``BatchMetrics``), ``rcdiag.sweep.state.SweepState`` the sweep's;
    the engine's streaming, step grouping, state files, workers and merging serve both."""

    KIND: ClassVar[str]
    """Its declared kind (``analyze``, ``sweep``): a state file's ``kind``, and the report its merge gives."""

    resolved: ResolvedConfig
    batches: dict[StepKey, B] = field(default_factory=dict)
    rows: int = 0
    tokens: int = 0
    valid_tokens: int = 0
    whole_dump: dict[str, WholeDump] = field(default_factory=dict)
    """Whole-dump accumulators by ``KEY`` (the bias detectors' sums; ``--explain``'s breakdowns, worst responses and
    detector sums; each section's)."""

    def new_batch(self) -> B:
        """An empty batch of this state's accumulators."""
        raise NotImplementedError

    def batch(self, step: StepKey) -> B:
        """The accumulators of one step (created on first use)."""
        batch = self.batches.get(step)
        if batch is None:
            batch = self.batches[step] = self.new_batch()
        return batch

    def merge(self, other: Self) -> Self:
        """Fold another state (same configuration) into this one; returns ``self``."""
        if not self.resolved.same_computation(other.resolved):
            raise ValueError("cannot merge states computed with different configurations")
        if set(self.whole_dump) != set(other.whole_dump):
            raise ValueError(
                f"cannot merge a state with sections {sorted(self.whole_dump)} and one with {sorted(other.whole_dump)}"
            )
        for step, batch in other.batches.items():
            self.batch(step).merge(batch)
        for key, extra in self.whole_dump.items():
            extra.merge(other.whole_dump[key])
        self.rows += other.rows
        self.tokens += other.tokens
        self.valid_tokens += other.valid_tokens
        return self

    def counts_contradiction(self) -> str | None:
        """Where this state's counts contradict each other, else ``None``: what ``_update`` adds to the state's
        ``rows`` and ``valid_tokens`` it adds to one step's batch (their sums agree), a valid token is a token
        (``valid_tokens <= tokens``), and each batch's own counts agree (``GroupedBatch.counts_contradiction``).
        A state file read back is checked with it (``rcdiag.engine.state_files``), so an edited or damaged one is
        refused instead of merged into a report of counts that cannot be."""
        if self.valid_tokens > self.tokens:
            return f"valid_tokens is {self.valid_tokens} but tokens is {self.tokens}"
        for name in ("rows", "valid_tokens"):
            total, summed = getattr(self, name), sum(getattr(batch, name) for batch in self.batches.values())
            if total != summed:
                return f"{name} is {total} but its steps' batches hold {summed}"
        for step, batch in self.batches.items():
            found = batch.counts_contradiction()
            if found is not None:
                return f"{'the batch' if step is None else f'step {step}'}: {found}"
        return None

    def pooled(self) -> B:
        """Every step merged into one batch (the all-steps view)."""
        pooled = self.new_batch()
        for batch in self.batches.values():
            pooled.merge(batch)
        return pooled

    def state_dict(self) -> dict[str, Any]:
        """Serializable state (``from_state_dict`` with the same configuration restores it)."""
        out = {
            "rows": self.rows,
            "tokens": self.tokens,
            "valid_tokens": self.valid_tokens,
            "batches": [[step, batch.state_dict()] for step, batch in self.batches.items()],
        }
        if self.whole_dump:
            out["whole_dump"] = {key: extra.state_dict() for key, extra in self.whole_dump.items()}
        return out

    @classmethod
    def from_state_dict(cls: type[S], resolved: ResolvedConfig, state: dict[str, Any], kinds: WholeDumpKinds) -> S:
        """Rebuild a state saved by ``state_dict`` under the same configuration (``kinds``: its whole-dump
        accumulators' classes by key)."""
        out = cls(resolved, **saved_counts(state))
        load_batches(out, state)
        load_whole_dump(out, state, kinds)
        return out

    @classmethod
    def layout(cls) -> dict[str, Any] | None:
        """What this kind's own state means beyond its accumulators' declared states, for the one state layout hash
        (``rcdiag.engine.state_files.state_layout``); ``None``: nothing more."""
        return None


def load_whole_dump(out: StepStates[Any], state: dict[str, Any], kinds: WholeDumpKinds) -> None:
    """Load a saved state's whole-dump accumulators into ``out``, each by its kind in ``kinds``."""
    for key, saved in saved_whole_dump(state).items():
        out.whole_dump[key] = kinds.whole_dump(key).from_state_dict(saved)


def saved_whole_dump(state: Any) -> dict[str, Any]:
    """A saved state's whole-dump accumulators' states by ``KEY`` (none: an empty table)."""
    saved = state.get("whole_dump", {}) if isinstance(state, dict) else {}
    if not isinstance(saved, dict):
        raise FieldError(f"state.whole_dump must be a table of whole-dump states, got {shown(saved)}")
    return saved


@dataclass
class EngineState(StepStates[BatchMetrics]):
    """``rcdiag analyze``'s state: one ``BatchMetrics`` per step."""

    KIND: ClassVar[str] = "analyze"
    debug: bool = True
    """Whether its batches compute verl's ``training/*`` debug metrics (the sweep's verdict pass does not)."""

    def new_batch(self) -> BatchMetrics:
        return BatchMetrics(self.resolved, debug=self.debug)


class SavedCounts(TypedDict):
    rows: int
    tokens: int
    valid_tokens: int


def saved_counts(state: dict[str, Any]) -> SavedCounts:
    """A saved state's ``rows``, ``tokens`` and ``valid_tokens``, each checked to be a count."""
    rows, tokens, valid = (integer(state[name], f"state.{name}") for name in ("rows", "tokens", "valid_tokens"))
    return SavedCounts(rows=rows, tokens=tokens, valid_tokens=valid)


def step_pairs(pairs: Any, field: str) -> list[tuple[StepKey, Any]]:
    """A saved list of ``[step, state]`` pairs (from a file: anything), each step an int64 or null and given once."""
    if not isinstance(pairs, list) or not all(isinstance(pair, list) and len(pair) == 2 for pair in pairs):
        raise FieldError(f"{field} must be a list of [step, state] pairs, got {shown(pairs)}")
    seen: set[StepKey] = set()
    out = []
    for step, saved in pairs:
        key = saved_step(step, f"{field} step")
        if key in seen:
            raise FieldError(f"{field} holds step {key} twice")
        seen.add(key)
        out.append((key, saved))
    return out


def load_batches(out: StepStates[Any], state: dict[str, Any]) -> None:
    """Load a saved state's ``[step, batch]`` pairs into ``out``: each step an int64 or null, and given once."""
    for key, batch_state in step_pairs(state["batches"], "state.batches"):
        batch = out.batch(key)
        try:
            batch.load_state_dict(batch_state)
        except FieldError as exc:
            raise FieldError(f"state.batches step {key}: {exc}") from None


class Engine:
    """Folds chunks into an ``EngineState`` on one backend."""

    def __init__(
        self,
        resolved: ResolvedConfig,
        backend: Backend | None = None,
        wholes: Sequence[WholeDump] = (),
        *,
        state: StepStates[Any] | None = None,
    ) -> None:
        """``wholes``: the whole-dump accumulators to feed too (the run's sections', ``rcdiag.sections``)."""
        self.resolved = resolved
        self.backend = backend or NumpyBackend()
        whole_dump = {whole.KEY: whole for whole in wholes}
        self.state: StepStates[Any] = state if state is not None else EngineState(resolved, whole_dump=whole_dump)
        """What blocks are folded into: the analyze accumulators by default, or another state with the same
        interface (the sweep's, which may ask for larger CPU blocks: ``cpu_block_tokens``), ``wholes`` added to it."""
        if state is not None:
            state.whole_dump.update(whole_dump)
        cpu_block = getattr(self.state, "cpu_block_tokens", CPU_BLOCK_TOKENS)
        self.block_tokens = cpu_block if isinstance(self.backend, NumpyBackend) else GPU_BLOCK_TOKENS
        self.compiled = self.backend.compiled
        """The numba kernels, or a small dump's numpy forms of them (``rcdiag.kernels.small``)."""
        self.k1_bands = tuple(bounds(o) for o in resolved.rs_options if o.level == "token" and o.is_k1)
        """The token-level k1 RS bands, which the CPU's fused token pass takes in the same read of each row."""

    def run(self, chunks: Iterable[Chunk]) -> StepStates[Any]:
        """Consume every chunk; returns the state."""
        for chunk in chunks:
            self.update(chunk)
        return self.state

    def update(self, chunk: Chunk) -> None:
        """Fold one chunk of whole rows in."""
        # inf - inf and exp overflow are legitimate here (verl computes them too); no numpy warnings.
        with np.errstate(all="ignore"):
            self._update(chunk)

    def _update(self, chunk: Chunk) -> None:
        mask = chunk.mask
        if not (chunk.screened and isinstance(chunk.old, np.ndarray) and (mask is None or mask.dtype == np.bool_)):
            # The engine's own guard for chunks that did not pass through a Screen (built by hand): the same
            # checks, and the mask made boolean (an integer mask would index values instead of selecting them).
            chunk = screen_one(chunk)
        state = self.state
        wholes = list(state.whole_dump.values())
        if wholes and chunk.rows is None:
            number_chunk(chunk, wholes)  # rows not numbered before screening (chunks built by hand)
        state.rows += chunk.n_rows
        state.tokens += chunk.n_tokens
        steps = chunk.steps
        if steps is not None and steps.shape[0] > 1 and _run_count(steps) > 8:
            chunk = take_rows(chunk, np.argsort(steps, kind="stable"))  # each step's rows contiguous
        old, rollout, offsets, steps = chunk.old, chunk.rollout, chunk.offsets, chunk.steps
        lengths = np.diff(offsets)
        mask = chunk.mask
        if mask is not None and int(np.count_nonzero(mask)) == mask.shape[0]:
            mask = None
        valid_lengths = lengths if mask is None else _valid_lengths(mask, lengths, self.compiled)
        state.valid_tokens += int(valid_lengths.sum())
        for step, r0, r1 in _step_runs(steps, lengths.shape[0]):
            batch = state.batch(step)
            for b0, b1 in split_rows(valid_lengths[r0:r1], self.block_tokens):
                t0, t1 = int(offsets[r0 + b0]), int(offsets[r0 + b1])
                block_mask = _block_mask(mask, t0, t1)
                valid = valid_lengths[r0 + b0 : r0 + b1]
                rows = _row_context(chunk, block_mask, step, r0 + b0, r0 + b1) if wholes else None
                block = Block(
                    self.backend, old[t0:t1], rollout[t0:t1], valid, mask=block_mask,
                    raw_lengths=lengths[r0 + b0 : r0 + b1], k1_bands=self.k1_bands, rows=rows,
                    tokens=None if chunk.tokens is None else chunk.tokens[t0:t1],
                    loss_inputs=None if chunk.loss_inputs is None else
                    {key: values[t0:t1] for key, values in chunk.loss_inputs.items()},
                )  # fmt: skip
                batch.update(block)
                for whole in wholes:  # the device's block: its per-row values come to the host, its tokens are there
                    whole.update(block)
                del block  # a block kept alive into the next one's maths costs it fresh pages (1.2 ns/token)


def _row_context(chunk: Chunk, mask: np.ndarray | None, step: StepKey, a: int, b: int) -> RowContext:
    """What rows ``a:b`` of the chunk (one block) carry for the whole-dump accumulators."""
    lengths = np.diff(chunk.offsets[a : b + 1])
    ids = chunk.ids
    rows = chunk.rows
    assert rows is not None  # numbered when the chunk entered the engine
    tokens = None if chunk.tokens is None else chunk.tokens[int(chunk.offsets[a]) : int(chunk.offsets[b])]
    labels = None if chunk.labels is None else {name: values[a:b] for name, values in chunk.labels.items()}
    return RowContext(lengths, mask, rows[a:b], None if ids is None else ids[a:b], step, tokens, labels)


def _valid_lengths(mask: np.ndarray, lengths: np.ndarray, compiled: bool = True) -> np.ndarray:
    """Valid tokens per row (by the kernel, or its numpy form)."""
    if not compiled:
        from rcdiag.kernels import small

        return small.valid_lengths(mask, lengths)
    from rcdiag.kernels.metric_pass import valid_lengths

    valid = np.empty(lengths.shape[0], dtype=np.int64)
    valid_lengths(np.ascontiguousarray(mask), np.ascontiguousarray(lengths, dtype=np.int64), valid)
    return valid


def _block_mask(mask: np.ndarray | None, t0: int, t1: int) -> np.ndarray | None:
    """The block's part of the chunk's mask; ``None`` when it is all ones (a chunk's masked tokens often sit in a
    few rows), so the block's arrays are used as they are and nothing is compacted."""
    if mask is None:
        return None
    block_mask = mask[t0:t1]
    return None if int(np.count_nonzero(block_mask)) == block_mask.shape[0] else block_mask


def _run_count(steps: np.ndarray) -> int:
    return int(np.count_nonzero(steps[1:] != steps[:-1])) + 1


def _step_runs(steps: np.ndarray | None, n_rows: int) -> list[tuple[StepKey, int, int]]:
    if steps is None:
        return [(None, 0, n_rows)]
    if n_rows == 0:
        return []
    bounds = [0, *(np.flatnonzero(steps[1:] != steps[:-1]) + 1).tolist(), n_rows]
    return [(int(steps[a]), a, b) for a, b in itertools.pairwise(bounds)]
