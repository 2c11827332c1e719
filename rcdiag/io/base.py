"""What every reader produces: chunks of whole sequences as flat arrays plus offsets.

A reader (one module per input format) turns a dump into ``Chunk`` objects. A chunk holds whole rows only,
so every per-row quantity can be computed inside it; how rows are grouped into chunks never changes a metric.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rcdiag.settings.constants import DEFAULT_CHUNK_TOKENS


@dataclass(frozen=True)
class ColumnMap:
    """Column names given by the user; ``None`` = recognise the role by its common names (``rcdiag.io.columns``).

    ``seq`` is the sequence-id column of a long (one row per token) dump.
    """

    old: str | None = None
    rollout: str | None = None
    mask: str | None = None
    step: str | None = None
    seq: str | None = None
    id: str | None = None
    """A per-response id column (``--id-col``) for reports that name responses; default: ``ID_ALIASES``."""
    token: str | None = None
    """The per-token id column (``--token-col``), read with ``--explain``; default: ``ALIASES["token"]``."""
    advantages: str | None = None
    """The advantages column (``--advantages-col``; per token, or one per row): read when present, for the
    framework keys that need them (``--as``); default: ``ALIASES["advantages"]``."""
    current: str | None = None
    """The current policy's per-token log-probs (``--current-col``), read when present, for the framework keys that
    compare it with the old policy (PPO clip fractions) or the rollout; default: ``ALIASES["current"]``."""
    by: tuple[str, ...] = ()
    """Per-row scalar columns to break the mismatch down by (``--by``): each must exist. Columns named like a
    replica or a policy version (``rcdiag.io.columns.LABEL_ALIASES``) are read too, without it."""


class RowNumbering:
    """A whole-dump state that numbers each chunk's rows in reading order, before any row can be skipped
    (``rcdiag.engine.stream.WholeDump.number``): the row numbers its findings and merges name."""

    rows_read: int

    def number(self, chunk: Chunk) -> Chunk:
        chunk.rows = np.arange(self.rows_read, self.rows_read + chunk.n_rows, dtype=np.int64)
        self.rows_read += chunk.n_rows
        return chunk


@dataclass
class Chunk:
    """Whole rows as flat values: row ``i`` is ``values[offsets[i]:offsets[i+1]]``.

    ``old`` and ``rollout`` are float32; ``mask`` is a bool array (``None`` = every position valid). Readers
    may leave the mask in its stored numeric type; ``rcdiag.io.screen.Screen`` checks it is 0/1 and makes it
    bool before the engine sees it. ``steps`` gives each row's step (``None`` = no step column).
    ``first_row`` is the index of the first row in ``source``, and ``seq_ids`` (long layout) the sequence id of
    each row, both for error messages. ``screened`` marks a chunk whose values were already checked.
    ``ids`` holds each row's value of the dump's id column, if it has one, and ``rows`` each row's 0-based
    index in reading order (set by ``rcdiag.explain.number_rows`` before rows can be skipped).
    ``tokens`` holds each position's token id (int32 or int64) when the dump has them and they are read.
    ``nulls`` marks, per log-prob column (old, rollout; ``None`` for one without), the positions the file held as
    JSON null and the reader gave as NaN (prime-rl's non-finite values): set only when the chunk has one, and read
    only by the screen, to name such a value as the file holds it.
    ``loss_inputs`` holds, per position like ``old``, the optional loss inputs the dump has (``"advantages"``,
    ``"log_prob"``: the current policy's log-probs), float32, a per-row advantage repeated over its row's positions;
    read only by the framework sections (``--as``).
    ``labels`` holds each row's value of every per-row label column read (``ColumnMap.by`` and the columns named like
    a replica or a policy version), by column name.
    """

    old: np.ndarray
    rollout: np.ndarray
    offsets: np.ndarray
    mask: np.ndarray | None = None
    steps: np.ndarray | None = None
    first_row: int = 0
    source: str = ""
    column_names: tuple[str, str] = ("old_log_prob", "rollout_log_prob")
    mask_name: str = "response_mask"
    seq_ids: np.ndarray | None = None
    screened: bool = False
    ids: np.ndarray | None = None
    rows: np.ndarray | None = None
    tokens: np.ndarray | None = None
    token_name: str = "token_ids"
    nulls: tuple[np.ndarray | None, np.ndarray | None] | None = None
    labels: dict[str, np.ndarray] | None = None
    loss_inputs: dict[str, np.ndarray] | None = None

    PER_ROW = ("steps", "seq_ids", "ids", "rows")
    """Optional per-row arrays: selecting rows selects these too."""

    def where(self, row: int) -> dict:
        """``InputError`` location keywords of local row ``row``."""
        if self.seq_ids is not None:
            seq = self.seq_ids[row]
            return {"path": self.source or None, "sequence": seq.item() if isinstance(seq, np.generic) else seq}
        return {"path": self.source or None, "row": self.first_row + row}

    @property
    def n_rows(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def n_tokens(self) -> int:
        return int(self.offsets[-1] - self.offsets[0])


@dataclass
class SourceInfo:
    """Facts about a dump known before (``format``, ``columns``) or after (the rest) reading it."""

    path: str
    format: str
    columns: dict[str, str | None] = field(default_factory=dict)
    dtypes: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    total_rows: int | None = None
    """Rows in the dump when known before reading (for a progress bar)."""
    files: int = 1
    step_source: str = ""
    """Where the steps come from: "column 'NAME'", "file name", "directory name", "key 'NAME'"; "" without."""
    reads: list[dict[str, Any]] = field(default_factory=list)
    """What was read, one entry per file: ``path`` (absolute), ``size``, ``mtime_ns`` and ``part`` (``None``:
    the whole file). ``rcdiag merge`` refuses two states that read the same part."""


@dataclass(frozen=True)
class Part:
    """A piece of a dump that a worker (a process, a Ray task) opens and reads on its own: its files as
    ``(format name, path or URL)`` and, for a single file that splits, which piece of it (``within``: a Parquet
    file's row groups). Small and picklable; ``rcdiag.io.open_part`` opens it without listing the whole dump."""

    label: str
    files: tuple[tuple[str, str], ...]
    within: tuple[int, ...] | None = None

    def describe(self) -> str:
        """The part in one phrase, for progress and errors: a file, a file's row groups, or a run of files."""
        first = self.files[0][1]
        if self.within is not None:
            groups = self.within
            span = f"{groups[0]}" if len(groups) == 1 else f"{groups[0]}-{groups[-1]}"
            return f"{first} row group{'s' if len(groups) > 1 else ''} {span}"
        if len(self.files) == 1:
            return first
        return f"{first} .. {self.files[-1][1]} ({len(self.files)} files)"


class Source(ABC):
    """An opened dump: what every reader gives the engine.

    ``info`` is known once the dump is opened; ``chunks`` streams whole rows; ``partitions`` splits the dump for
    parallel workers, each of which opens its ``Part`` (``rcdiag.io.open_part``) and reads it."""

    info: SourceInfo

    @abstractmethod
    def chunks(self, chunk_tokens: int = DEFAULT_CHUNK_TOKENS, part: Any = None) -> Iterator[Chunk]:
        """Yield chunks of whole rows holding at most ``chunk_tokens`` list values each, except that a row
        longer than that forms its own chunk. ``part`` (a ``Part.within``) restricts a single file to a piece."""

    @abstractmethod
    def partitions(self, n: int) -> list[Part]:
        """Up to ``n`` disjoint parts that together cover the dump, for parallel workers (``--workers``,
        ``--ray``); one part when the dump cannot be split."""

    def want_tokens(self, wanted: bool) -> None:  # noqa: B027 (optional: a source without token ids ignores it)
        """Read the token-id column too (``--explain``), when the dump has one."""

    def want_loss_inputs(self, wanted: bool) -> None:  # noqa: B027 (optional: a source without them ignores it)
        """Read the optional loss inputs too (``--as``), when the dump has them."""

    @abstractmethod
    def seen_metadata(self) -> dict[str, list[str]]:
        """Run facts collected from columns while reading (``temperature`` ...), for a driver to combine."""

    @abstractmethod
    def add_metadata(self, seen: dict[str, list[str]]) -> None:
        """Fold in what workers' sources saw (``seen_metadata``, all parts together, once), as if this source had
        read their rows."""


def balanced_runs(sizes: list[int], n: int) -> list[tuple[int, ...]]:
    """Split items ``0..len(sizes)-1`` into at most ``n`` runs of consecutive items of about equal total size."""
    total = sum(sizes) or 1
    parts: list[list[int]] = [[]]
    done = 0
    for index, size in enumerate(sizes):
        if parts[-1] and done >= total * len(parts) / n and len(parts) < n:
            parts.append([])
        parts[-1].append(index)
        done += size
    return [tuple(part) for part in parts if part]


def split_rows(lengths: np.ndarray, max_tokens: int) -> list[tuple[int, int]]:
    """Split rows into consecutive ``[start, stop)`` ranges of at most ``max_tokens`` tokens (a longer row
    forms its own range)."""
    n = int(lengths.shape[0])
    if n == 0:
        return []
    ends = np.cumsum(lengths)
    if int(ends[-1]) <= max_tokens:
        return [(0, n)]
    ranges = []
    start, base = 0, 0
    while start < n:
        stop = int(np.searchsorted(ends, base + max_tokens, side="right"))
        stop = max(stop, start + 1)
        ranges.append((start, stop))
        base = int(ends[stop - 1])
        start = stop
    return ranges


_DONE = object()


def prefetch(iterator: Iterator[Chunk], depth: int = 2) -> Iterator[Chunk]:
    """Run ``iterator`` in a background thread, ``depth`` items ahead: decoding overlaps the maths (+15-25%
    on 2 cores). Exceptions are re-raised in the consumer; abandoning the generator stops the thread."""
    items: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in iterator:
                while not stop.is_set():
                    try:
                        items.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            items.put(_DONE)
        except BaseException as exc:
            items.put(exc)

    thread = threading.Thread(target=produce, name="rcdiag-reader", daemon=True)
    thread.start()
    try:
        while True:
            item = items.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while thread.is_alive():
            _drain(items)
            thread.join(timeout=0.05)


def _drain(items: queue.Queue) -> None:
    """Empty the queue so a producer blocked on ``put`` can see the stop flag."""
    with contextlib.suppress(queue.Empty):
        while True:
            items.get_nowait()
