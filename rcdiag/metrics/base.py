"""The accumulator protocol: declared state, update, merge, compute.

Each metric group declares its state as named float64 sums, maxima, minima, moments and co-moments (pairs of values,
for a correlation), or int64 bin counts (``STATES``; a ``counts`` state has ``BINS`` bins). Arrays over thresholds
or cells (``rcdiag sweep``) are states too, each as long as the instance says (``sizes``): float64 ``sums`` and
``maxima`` added or maxed element by element, per-cell ``cells`` (``MomentArrays``: count, moments and extremes,
merged cell by cell), ``sparse`` counts (saved as their non-zero bins) and ``values`` (one value per response,
concatenated; float64, or float32 where the value given is). The whole-dump accumulators of ``--explain`` also keep
``sums`` of a declared ``SHAPES`` shape, float64 sums per int64 id (``table``, rows of a declared ``SHAPES`` width)
and bounded heaps of the largest items (``top``). ``update`` folds one block of whole sequences into that state,
``merge`` combines two states (chunks, files, workers, steps: it is the only way results combine), and ``compute``
turns the state into metric values. A finished mean is never stored on its own: sums and counts, or (count, mean,
M2) moments merged with Chan et al.'s pairwise formula, so a merge is exact up to float64 rounding and every metric
is independent of chunk size and row order. Moments are centred per block, so a spread far smaller than the mean (IS
weights near 1, a statistic clamped to one bound) is not lost to cancellation in E[x^2] - E[x]^2.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

import numpy as np

from rcdiag.catalogue.findings import finding
from rcdiag.core.formulas import chan_merge, chan_merge_comoment, chan_merge_share
from rcdiag.core.limits import F32_MAX
from rcdiag.runtime.fields import FieldError, checked, counts, dataclass_from, real, reals, shown

if TYPE_CHECKING:
    from rcdiag.metrics.block import Block

Reduce = Literal[
    "sum", "max", "min", "moments", "comoments", "counts", "sums", "maxima", "cells", "sparse", "values", "table", "top"
]
ARRAYS: frozenset[str] = frozenset({"counts", "sums", "maxima", "cells", "sparse", "values"})
"""The reductions whose state is an array (a new one for every accumulator)."""
_FRESH = ARRAYS | {"table", "top"}
"""Reductions whose empty value is a mutable object: arrays, id tables and heaps (a new one for every
accumulator)."""
MetricValue = float | None
"""A metric value; ``None`` where verl would crash or the value does not exist for this batch."""


@dataclass(frozen=True)
class Moments:
    """Weighted count, mean and sum of squared deviations (M2) of some values, in float64."""

    n: float = 0.0
    mean: float = 0.0
    m2: float = 0.0

    def merge(self, other: Moments) -> Moments:
        """Chan, Golub & LeVeque's pairwise update."""
        if other.n == 0:
            return self
        if self.n == 0:
            return other
        return Moments(*chan_merge(self.n, self.mean, self.m2, other.n, other.mean, other.m2))

    @property
    def variance(self) -> float:
        """Population (weighted) variance; 0 without weight."""
        return max(self.m2 / self.n, 0.0) if self.n > 0 else 0.0

    @property
    def unbiased_variance(self) -> float:
        """Sample variance with Bessel's correction (as ``torch.std``); 0 for fewer than two values."""
        return max(self.m2 / (self.n - 1), 0.0) if self.n > 1 else 0.0

    @property
    def second_moment(self) -> float:
        """E[x^2] = variance + mean^2."""
        return self.variance + self.mean * self.mean


@dataclass(frozen=True)
class CoMoments:
    """Count, means, M2s and co-moment ``C = sum (x - mean_x)(y - mean_y)`` of value pairs, in float64: what a
    correlation needs, merged exactly (Chan's update for each moment, ``chan_merge_comoment`` for C)."""

    n: float = 0.0
    mean_x: float = 0.0
    mean_y: float = 0.0
    m2_x: float = 0.0
    m2_y: float = 0.0
    c: float = 0.0

    def merge(self, other: CoMoments) -> CoMoments:
        if other.n == 0:
            return self
        if self.n == 0:
            return other
        n, mean_x, m2_x = chan_merge(self.n, self.mean_x, self.m2_x, other.n, other.mean_x, other.m2_x)
        _, mean_y, m2_y = chan_merge(self.n, self.mean_y, self.m2_y, other.n, other.mean_y, other.m2_y)
        c = chan_merge_comoment(self.n, self.mean_x, self.mean_y, self.c, other.n, other.mean_x, other.mean_y, other.c)
        return CoMoments(n, mean_x, mean_y, m2_x, m2_y, c)


def cluster_std_error(rows: Moments, mean: float, n: float) -> float:
    """Standard error of a token mean with responses as the units, sqrt(sum_i (S_i - mean n_i)^2) / N, from the
    moments of the row means x_i = S_i / n_i weighted by n_i^2: M2 + W (mu - mean)^2, a sum of non-negative terms
    (raw moments would cancel when the spread is small). NaN propagates."""
    spread = rows.m2 + rows.n * (rows.mean - mean) ** 2
    return math.sqrt(max(spread, 0.0)) / n if spread == spread else math.nan


class IdSums:
    """A ``table`` state: rows of float64 sums per int64 id, merged by adding the rows of equal ids.

    Ids below ``dense_ids`` sit in a dense table that grows to the largest id seen (an accumulator may scatter into
    ``dense`` directly); larger ids in a sorted sparse table. Saved as ascending ids and their rows."""

    def __init__(self, width: int, dense_ids: int) -> None:
        self.width = width
        self.dense_ids = dense_ids
        self.dense = np.zeros((0, width))
        self.sparse_ids = np.zeros(0, dtype=np.int64)
        self.sparse = np.zeros((0, width))

    def grow(self, size: int) -> None:
        """Make the dense table hold ids below ``size`` (at least doubling, at most ``dense_ids``). Its pages are
        written in order here: left to the scatter, a fresh table's pages fault in the ids' random order, which cost
        10-60 ms per 7 MB table on this machine (benchmarks/explain_tokens.py)."""
        grown = np.empty((min(self.dense_ids, max(size, 2 * self.dense.shape[0], 1024)), self.width))
        kept = self.dense.shape[0]
        grown[:kept] = self.dense
        grown[kept:] = 0.0
        self.dense = grown

    def add_sparse(self, ids: np.ndarray, sums: np.ndarray) -> None:
        """Add rows of sums for (unique) ids beyond the dense table."""
        both = np.concatenate([self.sparse_ids, ids])
        unique, where = np.unique(both, return_inverse=True)
        merged = np.zeros((unique.shape[0], self.width))
        np.add.at(merged, where, np.concatenate([self.sparse, sums]))
        self.sparse_ids, self.sparse = unique, merged

    def merge(self, other: IdSums) -> None:
        if other.dense.shape[0] > self.dense.shape[0]:
            self.grow(other.dense.shape[0])
        self.dense[: other.dense.shape[0]] += other.dense
        if other.sparse_ids.size:
            self.add_sparse(other.sparse_ids, other.sparse)

    def rows(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, sums)`` of every id with a row (a first sum, the count, above 0), ids ascending."""
        present = np.flatnonzero(self.dense[:, 0])
        if not self.sparse_ids.size:  # one copy of the rows, not two (a vocabulary's table is megabytes)
            return present.astype(np.int64), self.dense[present]
        ids = np.concatenate([present.astype(np.int64), self.sparse_ids])
        return ids, np.concatenate([self.dense[present], self.sparse])

    def load(self, ids: np.ndarray, sums: np.ndarray) -> None:
        """Fill an empty table with saved rows (ids ascending)."""
        small = ids < self.dense_ids
        if small.any():
            self.grow(int(ids[small].max()) + 1)
            self.dense[ids[small]] = sums[small]
        self.sparse_ids, self.sparse = ids[~small], sums[~small]


class Top:
    """A ``top`` state: the ``n`` items with the largest ``key`` (a min-heap; every key distinct), merged by
    offering the other heap's items. Items are dataclasses with a ``key`` property (``Accumulator.ITEMS``)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.heap: list[tuple[Any, Any]] = []

    def floor(self) -> Any:
        """The smallest key kept while the heap is full (``None``: not full, any item enters)."""
        return self.heap[0][0] if len(self.heap) >= self.n else None

    def offer(self, item: Any) -> tuple[bool, Any]:
        """Offer an item: ``(kept, the item it pushed out or None)``."""
        entry = (item.key, item)
        if len(self.heap) < self.n:
            heapq.heappush(self.heap, entry)
            return True, None
        if self.n and entry[0] > self.heap[0][0]:
            return True, heapq.heapreplace(self.heap, entry)[1]
        return False, None

    def items(self) -> list[Any]:
        """Largest key first."""
        return [item for _, item in sorted(self.heap, key=lambda entry: entry[0], reverse=True)]


@dataclass
class MomentArrays:
    """Count, moments and extremes of many groups at once (cells of a statistic, thresholds): float64 arrays."""

    n: np.ndarray
    mean: np.ndarray
    m2: np.ndarray
    max: np.ndarray
    min: np.ndarray

    FIELDS: ClassVar[tuple[str, ...]] = ("n", "mean", "m2", "max", "min")

    @classmethod
    def empty(cls, size: int) -> MomentArrays:
        zeros = np.zeros(size)
        return cls(zeros, zeros.copy(), zeros.copy(), np.full(size, -np.inf), np.full(size, np.inf))

    def merge(self, other: MomentArrays) -> None:
        """Chan et al.'s pairwise update (``rcdiag.core.formulas.chan_merge_share``), group by group, where both
        parts hold values (a NaN cell only counts); new arrays, never ``other``'s."""
        with np.errstate(invalid="ignore", divide="ignore"):
            n, merged_mean, merged_m2 = chan_merge_share(self.n, self.mean, self.m2, other.n, other.mean, other.m2)
        mean = np.where(self.n == 0, other.mean, np.where(other.n == 0, self.mean, merged_mean))
        m2 = np.where((self.n > 0) & (other.n > 0), merged_m2, self.m2 + other.m2)
        self.n, self.mean, self.m2 = n, mean, m2
        self.max = np.maximum(self.max, other.max)  # NaN propagates (a NaN cell must keep it)
        self.min = np.minimum(self.min, other.min)

    def moments(self, index: int) -> Moments:
        """One group's moments."""
        return Moments(float(self.n[index]), float(self.mean[index]), float(self.m2[index]))

    def state_dict(self) -> dict[str, list[float]]:
        return {name: getattr(self, name).tolist() for name in self.FIELDS}

    @classmethod
    def from_state_dict(cls, state: Any, field: str, size: int) -> MomentArrays:
        """Saved arrays, each checked: ``size`` numbers, counts ``n`` >= 0."""
        if not isinstance(state, dict) or set(state) != set(cls.FIELDS):
            raise FieldError(f"{field} must be a table of {', '.join(cls.FIELDS)}, got {shown(state)}")
        return cls(*(reals(state[name], f"{field}.{name}", (size,), nonnegative=name == "n") for name in cls.FIELDS))


_DEFAULTS: dict[str, Any] = {
    "sum": 0.0,
    "max": -math.inf,
    "min": math.inf,
    "moments": Moments(),
    "comoments": CoMoments(),
}

A = TypeVar("A", bound="Accumulator")


@dataclass(frozen=True)
class VerlCrash:
    """A condition under which verl v0.9.0 raises instead of logging metrics for this batch."""

    code: str
    """A code of the finding catalogue (``rcdiag.catalogue.findings``), which gives its severity and docs."""
    metric: str | None
    message: str

    def __post_init__(self) -> None:
        finding(self.code)  # KeyError for a code the catalogue lacks: a bug, caught by the first test that crashes


class Accumulator:
    """Base class: subclasses declare ``STATES`` and implement ``update`` and ``compute``.

    Every accumulator has the same protocol: ``update(block)`` folds a block in and returns nothing, ``merge``
    folds another accumulator in, ``compute()`` gives the metrics. What several accumulators share within a block
    (a statistic, what an RS option rejects) is memoized on the block, never passed between them.
    """

    STATES: ClassVar[dict[str, Reduce]] = {}
    BINS: ClassVar[int] = 0
    """Length of every ``counts`` state."""
    SHAPES: ClassVar[dict[str, tuple[int, ...]]] = {}
    """The shape of each ``sums`` state, the row shape ``(width,)`` of each ``table`` state."""
    ITEMS: ClassVar[dict[str, type]] = {}
    """The item dataclass of each ``top`` state."""
    DENSE_IDS: ClassVar[int] = 1 << 21
    """``table`` states keep ids below this in a dense table."""
    OWNER: ClassVar[str | None] = None
    """The whole-dump accumulator whose part this is (``--explain``'s: ``"explain"``), whose layout declares it;
    ``None``: a per-step accumulator of the engine (``rcdiag.metrics.batch.declared_states``)."""
    COUNTED: ClassVar[frozenset[str]] = frozenset(
        {"rows", "tokens", "valid_rows", "masked_rows", "masked_tokens", "oob_tokens", "nan", "v_hi", "v_lo"}
        | {"rawmean_hi", "rawmean_lo"}
    )
    """``sum`` and ``sums`` states (of any accumulator that declares them) that count rows or tokens: a saved one is
    >= 0."""

    _empty_states: ClassVar[dict[tuple, tuple[dict[str, Any], tuple[str, ...]]]] = {}
    """Empty states built so far, by class, declared states and bins (the sweep makes thousands of accumulators):
    a class whose ``STATES`` or ``BINS`` change (a subclass, a patched declaration) gets a template of its own."""

    def __init__(self, sizes: Mapping[str, int] | None = None) -> None:
        self.sizes = dict(sizes or {})
        """The length of each array state other than ``BINS`` (``rcdiag sweep``: thresholds, cells)."""
        key = (type(self), tuple(self.STATES.items()), self.BINS)
        empty = self._empty_states.get(key)
        if empty is None:
            fresh = tuple(name for name, how in self.STATES.items() if how in _FRESH)
            template = {name: None if how in _FRESH else _DEFAULTS[how] for name, how in self.STATES.items()}
            empty = (template, fresh)  # (the declared order kept: arrays, tables and heaps are filled in below)
            self._empty_states[key] = empty
        self._template = empty
        self._filled: frozenset[str] | None = None
        self.state: dict[str, Any] = self._fresh()

    def _fresh(self) -> dict[str, Any]:
        """An empty state (a copy of the declaration's template; arrays, tables and heaps new)."""
        template, fresh = self._template
        state = dict(template)
        for name in fresh:
            state[name] = self._empty(self.STATES[name], name)
        return state

    def size(self, name: str) -> int:
        """The length of an array state."""
        return self.sizes.get(name, self.BINS)

    def shape(self, name: str) -> tuple[int, ...]:
        """The shape of a ``sums`` state: declared (``SHAPES``) or as long as the instance says (``size``)."""
        return self.SHAPES.get(name) or (self.size(name),)

    def capacity(self, name: str) -> int:
        """How many items the ``top`` state ``name`` keeps (configuration: part of ``signature``)."""
        raise NotImplementedError

    def _empty(self, how: Reduce, name: str) -> Any:
        if how in ("counts", "sparse"):
            return np.zeros(self.size(name), dtype=np.int64)
        if how == "sums":
            return np.zeros(self.shape(name))
        if how == "maxima":
            return np.full(self.size(name), -np.inf)
        if how == "cells":
            return MomentArrays.empty(self.size(name))
        if how == "values":
            return []
        if how == "table":
            return IdSums(self.SHAPES[name][0], self.DENSE_IDS)
        if how == "top":
            return Top(self.capacity(name))
        return _DEFAULTS[how]

    def add(self, **values: Any) -> None:
        """Fold values into the state by each state's declared reduction (moments: a ``Moments`` or a tuple;
        comoments: a ``CoMoments`` or a tuple)."""
        state = self.state
        for name, value in values.items():
            how = self.STATES[name]
            if how == "sum":
                state[name] += value
            elif how == "max":
                state[name] = _nanmax(state[name], value)
            elif how == "min":
                state[name] = _nanmin(state[name], value)
            elif how in ("counts", "sparse"):
                state[name] = state[name] + np.asarray(value, dtype=np.int64)  # a new array: never alias `value`
            elif how == "sums":
                state[name] = state[name] + np.asarray(value, dtype=np.float64)  # a new array: never alias `value`
            elif how == "maxima":
                state[name] = np.maximum(state[name], value)  # NaN propagates, as in torch's max
            elif how == "cells" or how == "table":
                state[name].merge(value)
            elif how == "values":  # one block's array, or another state's list of them
                state[name].extend(value if isinstance(value, list) else [value])
            elif how == "top":
                for item in value.items():
                    self.offered(name, item)
            elif how == "comoments":
                state[name] = state[name].merge(value if isinstance(value, CoMoments) else CoMoments(*value))
            else:
                state[name] = state[name].merge(value if isinstance(value, Moments) else Moments(*value))

    def merge(self: A, other: A) -> A:
        """Fold another accumulator of the same kind and configuration into this one; returns ``self``."""
        if type(other) is not type(self) or self.signature() != other.signature():
            raise ValueError(f"cannot merge {other.signature()} into {self.signature()}")
        self.add(**other.state)
        return self

    def offered(self, name: str, item: Any) -> None:
        """Offer an item to the ``top`` state ``name`` (a subclass may drop what an evicted item held)."""
        self.state[name].offer(item)

    def signature(self) -> tuple:
        """What must match for two states to merge (the kind and its configuration)."""
        return (type(self).__name__,)

    def filled_states(self) -> frozenset[str]:
        """The states this accumulator's configuration fills (``update``); the others stay empty."""
        return frozenset(self.STATES)

    def set_states(self, values: Mapping[str, Any]) -> None:
        """Replace the state with values computed elsewhere (``rcdiag sweep`` computes every threshold at once): each
        state ``filled_states`` names must be given, and only declared ones (the rest start empty), so a state
        added to the declaration is never read as an unfilled 0."""
        if self._filled is None:
            self._filled = self.filled_states()
        if not (values.keys() >= self._filled and values.keys() <= self.STATES.keys()):
            unknown, missing = set(values) - set(self.STATES), self._filled - set(values)
            raise ValueError(f"{type(self).__name__}: states missing {sorted(missing)}, unknown {sorted(unknown)}")
        state = self._fresh()
        state.update(values)
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        """A copy of the raw state: floats, moments as ``[n, mean, m2]``, arrays as flat lists, per-cell arrays as a
        table of lists, sparse counts as ``[bins, counts]``, an id table as ``{"ids", "sums"}``, a heap as its items'
        fields, largest first (JSON-serializable)."""
        return {k: self._saved(self.STATES[k], k, v) for k, v in self.state.items()}

    def _saved(self, how: Reduce, name: str, value: Any) -> Any:
        if how == "sums":
            return value.ravel().tolist()
        if how == "table":
            ids, sums = value.rows()
            return {"ids": ids.tolist(), "sums": sums.ravel().tolist()}
        if how == "top":
            return {"n": value.n, "items": [self.save_item(name, item) for item in value.items()]}
        return _plain(how, value)

    def save_item(self, name: str, item: Any) -> Any:
        """An item of the ``top`` state ``name`` as a state file holds it (its fields)."""
        return _plain_fields(asdict(item))

    def load_item(self, name: str, data: Any, field: str) -> Any:
        """A saved item of the ``top`` state ``name``, every field checked against its dataclass."""
        return dataclass_from(self.ITEMS[name], data, field + ".")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the state with a saved one (from a file: anything), each value checked against its declaration:
        the names exactly, a number for a sum or extreme (>= 0 for a ``COUNTED`` one), ``[n >= 0, mean, m2]`` for
        moments, ``size`` integers >= 0 for counts (sparse: ``[bins, counts]``, each bin below ``size``), as many
        numbers as the shape for sums (>= 0 for a ``COUNTED`` one) and ``size`` for maxima, a table of ``size`` numbers
        each for cells, a list of numbers for values, ascending ids with a row of numbers each (the first a count >= 1)
        for a table, at most ``capacity`` checked items for a heap."""
        owner = type(self).__name__
        if not isinstance(state, dict):
            raise FieldError(f"{owner} must be a table of its states, got {shown(state)}")
        missing = set(self.STATES) - set(state)
        unexpected = set(state) - set(self.STATES)
        if missing or unexpected:
            raise ValueError(f"state mismatch: missing {sorted(missing)}, unexpected {sorted(map(repr, unexpected))}")
        self.state = {name: self._loaded(how, state[name], f"{owner}.{name}") for name, how in self.STATES.items()}

    def _loaded(self, how: Reduce, value: Any, field: str) -> Any:
        name = field.rsplit(".", 1)[1]
        if how == "sums":
            return reals(value, field, self.shape(name), nonnegative=name in self.COUNTED)
        if how == "maxima":
            return reals(value, field, (self.size(name),))
        if how == "cells":
            return MomentArrays.from_state_dict(value, field, self.size(name))
        if how == "values":
            return [reals(value, field)]
        if how == "sparse":
            return _dense(value, field, self.size(name))
        if how == "table":
            return self._loaded_table(value, field, name)
        if how == "top":
            saved = checked(value, dict[str, Any], field)
            if set(saved) != {"n", "items"}:
                raise FieldError(f"{field} must be a table of n and items, got {shown(value)}")
            if checked(saved["n"], int, f"{field}.n") != self.capacity(name):
                raise FieldError(f"{field}.n must be {self.capacity(name)} here, got {shown(saved['n'])}")
            items = checked(saved["items"], list[Any], f"{field}.items")
            if len(items) > self.capacity(name):
                raise FieldError(f"{field} must hold at most {self.capacity(name)} items, holds {len(items)}")
            top = self._empty("top", name)
            for i, data in enumerate(items):
                top.offer(self.load_item(name, data, f"{field}.items[{i}]"))
            return top
        if how == "comoments":
            if not isinstance(value, list) or len(value) != 6:
                raise FieldError(f"{field} must be [n, mean_x, mean_y, m2_x, m2_y, c], got {shown(value)}")
            n, *rest = value
            return CoMoments(real(n, f"{field} n", nonnegative=True), *(real(v, field) for v in rest))
        if how == "moments":
            if not isinstance(value, list) or len(value) != 3:
                raise FieldError(f"{field} must be [n, mean, m2], got {shown(value)}")
            n, mean, m2 = value
            return Moments(
                real(n, f"{field} n", nonnegative=True), real(mean, f"{field} mean"), real(m2, f"{field} m2")
            )
        if how == "counts":
            return counts(value, field, (self.size(name),))
        return real(value, field, nonnegative=name in self.COUNTED)

    def _loaded_table(self, value: Any, field: str, name: str) -> IdSums:
        table = self._empty("table", name)
        if not isinstance(value, dict) or set(value) != {"ids", "sums"}:
            raise FieldError(f"{field} must be a table of ids and sums, got {shown(value)}")
        ids = counts(value["ids"], f"{field}.ids")
        sums = reals(value["sums"], f"{field}.sums", (ids.shape[0], table.width))
        if ids.size and not (np.diff(ids) > 0).all():
            raise FieldError(f"{field}.ids must be ascending without repeats")
        if ids.size and not (sums[:, 0] >= 1).all():
            raise FieldError(f"{field}.sums must count at least one token per id")
        table.load(ids, sums)
        return table

    def update(self, block: Block) -> None:
        """Fold one block of whole rows into the state."""
        raise NotImplementedError

    def keys(self) -> list[str]:
        """Metric keys in verl's order (unprefixed)."""
        raise NotImplementedError

    def compute(self) -> tuple[dict[str, MetricValue], list[VerlCrash]]:
        """Metric values in verl's key order, plus any conditions under which verl would crash."""
        raise NotImplementedError


def _plain(how: Reduce, value: Any) -> Any:
    if how == "moments":
        return [value.n, value.mean, value.m2]
    if how == "comoments":
        return [value.n, value.mean_x, value.mean_y, value.m2_x, value.m2_y, value.c]
    if how == "cells":
        return value.state_dict()
    if how == "values":
        return np.concatenate(value).tolist() if value else []
    if how == "sparse":
        bins = np.flatnonzero(value)
        return [bins.tolist(), value[bins].tolist()]
    return value.tolist() if isinstance(value, np.ndarray) else value


def _plain_fields(value: Any) -> Any:
    """A dataclass's fields as plain Python values (numpy scalars as numbers, tuples as lists)."""
    if isinstance(value, dict):
        return {k: _plain_fields(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain_fields(v) for v in value]
    return value.item() if isinstance(value, np.generic) else value


def _dense(sparse: Any, field: str, size: int) -> np.ndarray:
    """``[bins, counts]`` as ``size`` int64 counts."""
    if not isinstance(sparse, list) or len(sparse) != 2:
        raise FieldError(f"{field} must be [bins, counts], got {shown(sparse)}")
    bins, values = counts(sparse[0], f"{field} bins"), counts(sparse[1], f"{field} counts")
    if bins.shape != values.shape or (bins.size and bins.max() >= size):
        raise FieldError(f"{field} must list as many counts as bins, each bin below {size}")
    out = np.zeros(size, dtype=np.int64)
    out[bins] = values
    return out


def _nanmax(a: float, b: float) -> float:
    # NaN propagates, as in torch's max.
    if a != a or b != b:
        return math.nan
    return a if a >= b else b


def _nanmin(a: float, b: float) -> float:
    if a != a or b != b:
        return math.nan
    return a if a <= b else b


def verl_float(x: MetricValue) -> MetricValue:
    """Keep float64 precision, but give a value beyond float32's range as verl's float32 ``.item()`` would (inf)."""
    if x is None or x != x or abs(x) <= F32_MAX:
        return x
    return math.copysign(math.inf, x)
