"""The N responses with the largest |sum of log-ratios|, kept in a bounded heap (never every response).

A response's log-ratio sum S = sum over valid tokens of (old_log_prob - rollout_log_prob) is verl's sequence
log-ratio (the log of the sequence IS ratio). Ties are broken by the earlier row, so the list does not depend on
how rows were split into chunks or workers; merging keeps the N largest of both lists.

Each listed response also keeps its per-token log-ratios as a ``TokenTrace`` of at most ``TRACE_POINTS`` points
(a longer response keeps the lowest and highest value of each run of tokens), for the HTML report's per-token plot
of the ``PLOTTED`` worst; a response that leaves the list drops its trace, so memory stays bounded.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np

from rcdiag.metrics.base import Accumulator, Reduce, Top
from rcdiag.metrics.block import Block, on_host
from rcdiag.records.report import TokenText, TokenTrace, WorstRow
from rcdiag.runtime.fields import FieldError, checked, counts, dataclass_from, integer, reals, shown

DEFAULT_WORST = 10
PLOTTED = 5
"""Worst responses whose per-token trace the report carries (and a state file saves)."""
TRACE_POINTS = 512
TEXT_TOKENS = 2048
"""Valid tokens of a plotted response whose ids (and text) the report keeps: a window around its largest
|log-ratio|, when the dump has token ids."""


def token_trace(row: int, lr: np.ndarray, mask: np.ndarray | None) -> TokenTrace:
    """One response's trace: its valid tokens' positions and log-ratios, thinned to ``TRACE_POINTS`` points."""
    positions = np.arange(lr.shape[0]) if mask is None else np.flatnonzero(mask)
    if lr.shape[0] > TRACE_POINTS:
        index = _thinned(lr, TRACE_POINTS // 2)
        positions, lr = positions[index], lr[index]
    return TokenTrace(row, tuple(int(p) for p in positions), tuple(float(v) for v in lr))


@dataclass(frozen=True)
class _RawTrace:
    """A listed response's log-ratios and mask as read, thinned into a ``TokenTrace`` only if it is plotted (most
    entries of the list are pushed below the plotted ones before the end)."""

    row: int
    lr: np.ndarray
    mask: np.ndarray | None
    tokens: np.ndarray | None = None
    """The valid tokens' ids, when the dump has them."""

    def shifted(self, offset: int) -> _RawTrace:
        return _RawTrace(self.row + offset, self.lr, self.mask, self.tokens)

    def thinned(self) -> TokenTrace:
        return token_trace(self.row, self.lr, self.mask)

    def text(self) -> TokenText | None:
        return None if self.tokens is None else token_text(self.row, self.lr, self.tokens)


def token_text(row: int, lr: np.ndarray, tokens: np.ndarray) -> TokenText:
    """A response's ids and log-ratios, at most ``TEXT_TOKENS`` of them around its largest |log-ratio|."""
    start = 0
    if lr.shape[0] > TEXT_TOKENS:
        peak = int(np.nanargmax(np.abs(lr))) if np.isfinite(lr).any() else 0
        start = min(max(peak - TEXT_TOKENS // 2, 0), lr.shape[0] - TEXT_TOKENS)
    stop = start + TEXT_TOKENS
    values = tuple(float(v) for v in lr[start:stop])
    return TokenText(row, start, tuple(int(t) for t in tokens[start:stop]), values)


@dataclass(frozen=True)
class WorstResponse:
    """One response of the worst-responses list (the JSON ``worst_sequences`` entry)."""

    row: int
    step: int | None
    id: Any
    length: int
    """Valid tokens."""
    log_ratio_sum: float
    max_abs_log_ratio: float | None
    position_of_max: int | None
    old_log_prob_at_max: float | None
    rollout_log_prob_at_max: float | None

    @property
    def key(self) -> tuple[float, int]:
        """Heap order: larger |S| first, then the earlier row (NaN counts as the most extreme)."""
        size = abs(self.log_ratio_sum)
        return (math.inf if size != size else size, -self.row)

    def reported(self) -> WorstRow:
        """The report's row: the same fields, a non-finite value ``None``."""
        fields: dict[str, Any] = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                                  for k, v in asdict(self).items()}  # fmt: skip
        return WorstRow(**fields)


@dataclass
class Listed:
    """An item of the worst list: a response's entry and what it carries while listed (its trace and token ids, for
    the few that may be plotted), dropped with it when it leaves the list."""

    entry: WorstResponse
    trace: TokenTrace | _RawTrace | None = None
    text: TokenText | None = None

    @property
    def key(self) -> tuple[float, int]:
        return self.entry.key

    def shifted(self, offset: int) -> Listed:
        """The same response with its row number ``offset`` later (its state's rows follow another's)."""
        text = self.text
        if text is not None and offset:
            text = dataclasses.replace(text, row=text.row + offset)
        trace = None if self.trace is None else self.trace.shifted(offset)
        return Listed(_shifted(self.entry, offset), trace, text)


class WorstResponses(Accumulator):
    """The ``n`` most extreme responses: a ``top`` state (bounded min-heap) of ``Listed`` items."""

    STATES: ClassVar[dict[str, Reduce]] = {"entries": "top"}
    OWNER: ClassVar[str | None] = "explain"
    ITEMS: ClassVar[dict[str, type]] = {"entries": Listed}

    def __init__(self, n: int = DEFAULT_WORST) -> None:
        self.n = n
        super().__init__()

    def capacity(self, name: str) -> int:
        return self.n

    def signature(self) -> tuple:
        return (type(self).__name__, self.n)

    @property
    def top(self) -> Top:
        return self.state["entries"]

    @property
    def traces(self) -> dict[int, TokenTrace | _RawTrace]:
        """Row -> its trace, for the rows in the list that may be plotted."""
        return {item.entry.row: item.trace for _, item in self.top.heap if item.trace is not None}

    @property
    def texts(self) -> dict[int, TokenText]:
        """Row -> its token ids (a loaded or merged state's; a ``_RawTrace`` holds them until then)."""
        return {item.entry.row: item.text for _, item in self.top.heap if item.text is not None}

    def _floor(self) -> float:
        floor = self.top.floor()
        return -math.inf if floor is None else floor[0]

    def update(self, block: Block) -> None:
        """Offer a (numpy) block's responses (``block.rows``: their numbers, lengths, ids and tokens); only those
        that could enter the heap are looked at closely."""
        context = block.rows
        if self.n == 0 or block.n_rows == 0 or context is None:
            return
        block = on_host(block)  # the row sums a device adds in another order: the same list on every device
        size = np.abs(block.row_sum_lr)
        size = np.where(np.isnan(size), np.inf, size)
        candidates = np.flatnonzero(size >= self._floor())
        if candidates.size > self.n:
            top = np.argpartition(-size[candidates], self.n - 1)[: self.n]
            cut = size[candidates[top]].min()
            candidates = candidates[size[candidates] >= cut]  # keep ties: the row order decides them
        if not candidates.size:
            return
        row_sum_lr = block.row_sum_lr
        raw_old, raw_rollout, raw_mask, _ = block.raw  # rows as read: only the candidates drop their padding
        list_starts = np.zeros(block.n_rows + 1, dtype=np.int64)
        np.cumsum(context.lengths, out=list_starts[1:])
        ids = context.ids
        tokens = context.tokens
        plot_floor = self._plot_floor([(float(size[i]), -int(context.rows[i])) for i in candidates.tolist()])
        for i in candidates.tolist():
            a, b = int(list_starts[i]), int(list_starts[i + 1])
            old, rollout = raw_old[a:b], raw_rollout[a:b]
            mask = None if raw_mask is None else raw_mask[a:b]
            if mask is not None:
                old, rollout = old[mask], rollout[mask]
            identifier = None if ids is None else ids[i]
            row = int(context.rows[i])
            lr = old - rollout
            entry = _describe(float(row_sum_lr[i]), old, rollout, lr, mask, row, identifier, context.step)
            # a response below the PLOTTED-th largest of the list and this block's candidates can never be
            # plotted (entries only move down the list), so its trace is not kept
            keep = lr.shape[0] > 0 and entry.key >= plot_floor
            row_tokens = None
            if keep and tokens is not None:
                row_tokens = tokens[a:b] if mask is None else tokens[a:b][mask]
            trace = _RawTrace(row, lr, None if mask is None else mask.copy(), row_tokens) if keep else None
            self.offer(entry, trace)
        if sum(item.trace is not None for _, item in self.top.heap) > 2 * PLOTTED:
            plotted = {entry.row for entry in self.entries()[:PLOTTED]}
            for _, item in self.top.heap:
                if item.entry.row not in plotted:
                    item.trace = item.text = None

    def _plot_floor(self, keys: list[tuple[float, int]]) -> tuple[float, int]:
        """The ``PLOTTED``-th largest key of the list and ``keys`` (the lowest one that may still be plotted)."""
        everything = [key for key, _ in self.top.heap] + keys
        if len(everything) < PLOTTED:
            return (-math.inf, -(2**63))
        return heapq.nlargest(PLOTTED, everything)[-1]

    def offer(
        self, entry: WorstResponse, trace: TokenTrace | _RawTrace | None = None, text: TokenText | None = None
    ) -> None:
        self.top.offer(Listed(entry, trace, text))

    def offered(self, name: str, item: Listed) -> None:
        self.top.offer(dataclasses.replace(item))  # a copy: ``plotted`` thins its own items' traces

    def shifted(self, offset: int) -> WorstResponses:
        """A copy whose rows are numbered ``offset`` later (to merge into the state of the rows read before)."""
        out = WorstResponses(self.n)
        for item in self.top.items():
            out.top.offer(item.shifted(offset))
        return out

    def plotted(self) -> list[TokenTrace]:
        """The traces of the ``PLOTTED`` worst responses, most extreme first."""
        out = []
        for item in self.top.items()[:PLOTTED]:
            if isinstance(item.trace, _RawTrace):
                text = item.trace.text()
                if text is not None:
                    item.text = text
                item.trace = item.trace.thinned()
            if item.trace is not None:
                out.append(item.trace)
        return out

    def token_texts(self) -> list[TokenText]:
        """The token ids of the ``PLOTTED`` worst responses (when the dump has them), most extreme first."""
        self.plotted()
        return [item.text for item in self.top.items()[:PLOTTED] if item.text is not None]

    def entries(self) -> list[WorstResponse]:
        """Most extreme first."""
        return [item.entry for item in self.top.items()]

    def compute(self) -> tuple[dict[str, Any], list]:
        """The list is read by the report (``entries``, ``plotted``, ``token_texts``)."""
        return {}, []

    def state_dict(self) -> dict[str, Any]:
        """The list, with the traces of its ``PLOTTED`` worst (no later merge can lift another entry above them)."""
        self.plotted()
        for item in self.top.items()[PLOTTED:]:
            item.trace = item.text = None
        return super().state_dict()

    def save_item(self, name: str, item: Listed) -> Any:
        trace = item.trace.to_dict() if isinstance(item.trace, TokenTrace) else None
        text = item.text.to_dict() if item.text is not None else None
        return {"entry": _plain(asdict(item.entry)), "trace": trace, "text": text}

    def load_item(self, name: str, data: Any, field: str) -> Listed:
        """A saved item, every field checked against ``WorstResponse``, ``TokenTrace`` and ``TokenText``."""
        saved = checked(data, dict[str, Any], field)
        if set(saved) != {"entry", "trace", "text"}:
            raise FieldError(f"{field} must be a table of entry, trace and text, got {shown(data)}")
        entry = dataclass_from(WorstResponse, saved["entry"], f"{field}.entry.", signed=_SIGNED)
        trace = text = None
        if saved["trace"] is not None:
            trace = _saved_trace(checked(saved["trace"], dict[str, Any], f"{field}.trace"), f"{field}.trace")
        if saved["text"] is not None:
            text = _saved_text(checked(saved["text"], dict[str, Any], f"{field}.text"), f"{field}.text")
        for attached in (trace, text):
            if attached is not None and attached.row != entry.row:
                raise FieldError(f"{field} carries row {attached.row} for the entry of row {entry.row}")
        return Listed(entry, trace, text)


def _saved_trace(saved: dict[str, Any], where: str) -> TokenTrace:
    values = _saved_log_ratios(saved, where)
    positions = counts(saved["positions"], f"{where} positions")
    if len(values) != len(positions) or len(values) > TRACE_POINTS:
        raise FieldError(f"{where} must hold as many positions as values, at most {TRACE_POINTS}")
    row = integer(saved["row"], f"{where} row")
    return TokenTrace(row, tuple(positions.tolist()), tuple(values.tolist()))


def _saved_text(saved: dict[str, Any], where: str) -> TokenText:
    values = _saved_log_ratios(saved, where)
    ids = counts(saved["ids"], f"{where} ids")
    if len(values) != len(ids) or len(values) > TEXT_TOKENS:
        raise FieldError(f"{where} must hold as many ids as values, at most {TEXT_TOKENS}")
    row = integer(saved["row"], f"{where} row")
    start = integer(saved["start"], f"{where} start")
    return TokenText(row, start, tuple(ids.tolist()), tuple(values.tolist()))


def _describe(
    s: float,
    old: np.ndarray,
    rollout: np.ndarray,
    lr: np.ndarray,
    mask: np.ndarray | None,
    row: int,
    identifier: Any,
    step: int | None,
) -> WorstResponse:
    """The entry of a response: its log-ratio sum ``s``, its valid tokens' log-probs and log-ratios, its list's
    mask."""
    if lr.shape[0] == 0:
        return WorstResponse(row, step, _plain(identifier), 0, s, None, None, None, None)
    at = int(np.argmax(np.abs(lr)))
    return WorstResponse(
        row=row,
        step=step,
        id=_plain(identifier),
        length=int(lr.shape[0]),
        log_ratio_sum=s,
        max_abs_log_ratio=float(abs(lr[at])),
        position_of_max=at if mask is None else int(np.flatnonzero(mask)[at]),
        old_log_prob_at_max=float(old[at]),
        rollout_log_prob_at_max=float(rollout[at]),
    )


def _thinned(lr: np.ndarray, runs: int) -> np.ndarray:
    """Sorted indices that keep, of each of ``runs`` consecutive runs (split as ``np.array_split`` does), the
    first lowest and first highest value ignoring NaN, or the run's first index when it holds no finite value.
    Whole-array passes (``reduceat``), not a Python loop over the runs."""
    n = lr.shape[0]
    size, extra = divmod(n, runs)
    sizes = np.full(runs, size, dtype=np.int64)
    sizes[:extra] += 1
    starts = np.zeros(runs, dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    has_finite = np.logical_or.reduceat(np.isfinite(lr), starts)
    kept = [starts[~has_finite]]
    run_of = np.repeat(np.arange(runs), sizes)
    with np.errstate(invalid="ignore"):
        for extreme in (np.fmin, np.fmax):  # ignore NaN, as nanargmin / nanargmax do
            hits = np.flatnonzero(lr == np.repeat(extreme.reduceat(lr, starts), sizes))
            hits = hits[has_finite[run_of[hits]]]
            _, first = np.unique(run_of[hits], return_index=True)
            kept.append(hits[first])
    return np.unique(np.concatenate(kept))


def _shifted(entry: WorstResponse, offset: int) -> WorstResponse:
    if not offset:
        return entry
    return WorstResponse(**{**asdict(entry), "row": entry.row + offset})


_SIGNED = ("step",)
"""``WorstResponse`` int fields that may be negative."""


def _plain(value: Any) -> Any:
    """numpy scalars as Python values (JSON and state files)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value.item() if isinstance(value, np.generic) else value


def _saved_log_ratios(saved: dict[str, Any], where: str) -> Any:
    """A saved trace's or text's ``log_ratios`` (JSON ``null`` for a non-finite value), checked as reals."""
    values = checked(saved["log_ratios"], list[Any], f"{where} log_ratios")
    return reals([math.nan if v is None else v for v in values], f"{where} log_ratios")
