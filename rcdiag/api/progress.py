"""Reading progress for a display: rows and list values read so far, in one process or over parallel parts."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from rcdiag.engine.parallel import PartResult
from rcdiag.io import Chunk


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


class PartProgress:
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


def report_progress(chunks: Iterable[Chunk], on_chunk: ProgressCallback, total_rows: int | None) -> Iterator[Chunk]:
    """``chunks`` unchanged, the rows and tokens read so far given to ``on_chunk`` after each."""
    rows = tokens = 0
    for chunk in chunks:
        rows += chunk.n_rows
        tokens += chunk.n_tokens
        on_chunk(ReadProgress(rows, tokens, total_rows))
        yield chunk
