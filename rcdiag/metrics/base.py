"""The accumulator protocol: declared state, update, merge, compute.

Each metric group declares its state as named float64 sums, maxima, minima and moments, or int64 bin counts
(``STATES``; a ``counts`` state has ``BINS`` bins); the whole-dump accumulators of ``--explain`` also keep float64
arrays of sums (``sums``, of a declared ``SHAPES`` shape), float64 sums per int64 id (``table``, rows of a declared
``SHAPES`` width) and bounded heaps of the largest items (``top``). ``update``
folds one block of whole sequences into that state, ``merge`` combines two states (chunks, files, workers, steps:
it is the only way results combine), and ``compute`` turns the state into metric values. A finished mean is
never stored on its own: sums and counts, or (count, mean, M2) moments merged with Chan et al.'s pairwise
formula, so a merge is exact up to float64 rounding and every metric is independent of chunk size and row order.
Moments are centred per block, so a spread far smaller than the mean (IS weights near 1, a statistic clamped
to one bound) is not lost to cancellation in E[x^2] - E[x]^2.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

import numpy as np

from rcdiag.catalogue.findings import finding
from rcdiag.core.formulas import chan_merge
from rcdiag.core.limits import F32_MAX
from rcdiag.fields import FieldError, checked, counts, dataclass_from, real, reals, shown

if TYPE_CHECKING:
    from rcdiag.metrics.block import Block

Reduce = Literal["sum", "max", "min", "moments", "counts", "sums", "table", "top"]
_FRESH = frozenset({"counts", "sums", "table", "top"})
"""Reductions whose empty value is a mutable object: a new one for every accumulator."""
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
        """Make the dense table hold ids below ``size`` (at least doubling, at most ``dense_ids``)."""
        grown = np.zeros((min(self.dense_ids, max(size, 2 * self.dense.shape[0], 1024)), self.width))
        grown[: self.dense.shape[0]] = self.dense
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


_DEFAULTS: dict[str, Any] = {"sum": 0.0, "max": -math.inf, "min": math.inf, "moments": Moments()}

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
        {"rows", "tokens", "valid_rows", "masked_rows", "masked_tokens", "oob_tokens", "nan"}
    )
    """``sum`` states (of any accumulator that declares them) that count rows or tokens: a saved one is >= 0."""

    _empty_states: ClassVar[dict[tuple, tuple[dict[str, Any], tuple[str, ...]]]] = {}
    """Empty states built so far, by class, declared states and bins (the sweep makes thousands of accumulators):
    a class whose ``STATES`` or ``BINS`` change (a subclass, a patched declaration) gets a template of its own."""

    def __init__(self) -> None:
        key = (type(self), tuple(self.STATES.items()), self.BINS)
        empty = self._empty_states.get(key)
        if empty is None:
            fresh = tuple(name for name, how in self.STATES.items() if how in _FRESH)
            template = {name: None if how in _FRESH else self._empty(how) for name, how in self.STATES.items()}
            empty = (template, fresh)  # (the declared order kept: arrays, tables and heaps are filled in below)
            self._empty_states[key] = empty
        template, fresh = empty
        self.state: dict[str, Any] = dict(template)
        for name in fresh:  # arrays, tables, heaps: a new one for every accumulator
            self.state[name] = self._empty(self.STATES[name], name)

    def capacity(self, name: str) -> int:
        """How many items the ``top`` state ``name`` keeps (configuration: part of ``signature``)."""
        raise NotImplementedError

    def _empty(self, how: Reduce, name: str = "") -> Any:
        if how == "counts":
            return np.zeros(self.BINS, dtype=np.int64)
        if how == "sums":
            return np.zeros(self.SHAPES[name])
        if how == "table":
            return IdSums(self.SHAPES[name][0], self.DENSE_IDS)
        if how == "top":
            return Top(self.capacity(name))
        return _DEFAULTS[how]

    def add(self, **values: Any) -> None:
        """Fold values into the state by each state's declared reduction (moments: a ``Moments`` or a tuple)."""
        state = self.state
        for name, value in values.items():
            how = self.STATES[name]
            if how == "sum":
                state[name] += value
            elif how == "max":
                state[name] = _nanmax(state[name], value)
            elif how == "min":
                state[name] = _nanmin(state[name], value)
            elif how == "counts":
                state[name] = state[name] + np.asarray(value, dtype=np.int64)  # a new array: never alias `value`
            elif how == "sums":
                state[name] = state[name] + np.asarray(value, dtype=np.float64)  # a new array: never alias `value`
            elif how == "table":
                state[name].merge(value)
            elif how == "top":
                for item in value.items():
                    self.offered(name, item)
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

    def state_dict(self) -> dict[str, Any]:
        """A copy of the raw state: floats, moments as ``[n, mean, m2]``, counts and sums as flat lists, a table as
        ``{"ids", "sums"}``, a heap as its items' fields, largest first (JSON-serializable)."""
        return {k: self._saved(self.STATES[k], k, v) for k, v in self.state.items()}

    def _saved(self, how: Reduce, name: str, value: Any) -> Any:
        if how == "sums":
            return value.ravel().tolist()
        if how == "table":
            ids, sums = value.rows()
            return {"ids": ids.tolist(), "sums": sums.ravel().tolist()}
        if how == "top":
            return {"n": value.n, "items": [self.save_item(name, item) for item in value.items()]}
        return _plain(value)

    def save_item(self, name: str, item: Any) -> Any:
        """An item of the ``top`` state ``name`` as a state file holds it (its fields)."""
        return _plain_fields(asdict(item))

    def load_item(self, name: str, data: Any, field: str) -> Any:
        """A saved item of the ``top`` state ``name``, every field checked against its dataclass."""
        return dataclass_from(self.ITEMS[name], data, field + ".")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the state with a saved one (from a file: anything), each value checked against its declaration:
        the names exactly, a number for a sum or extreme (>= 0 for a ``COUNTED`` one), ``[n >= 0, mean, m2]`` for
        moments, ``BINS`` integers >= 0 for counts, as many numbers as the shape for sums, ascending ids with a row
        of numbers each (the first a count >= 1) for a table, at most ``capacity`` checked items for a heap."""
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
            return reals(value, field, self.SHAPES[name])
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
        if how == "moments":
            if not isinstance(value, list) or len(value) != 3:
                raise FieldError(f"{field} must be [n, mean, m2], got {shown(value)}")
            n, mean, m2 = value
            return Moments(
                real(n, f"{field} n", nonnegative=True), real(mean, f"{field} mean"), real(m2, f"{field} m2")
            )
        if how == "counts":
            return counts(value, field, (self.BINS,))
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


def _plain(value: Any) -> Any:
    if isinstance(value, Moments):
        return [value.n, value.mean, value.m2]
    return value.tolist() if isinstance(value, np.ndarray) else value


def _plain_fields(value: Any) -> Any:
    """A dataclass's fields as plain Python values (numpy scalars as numbers, tuples as lists)."""
    if isinstance(value, dict):
        return {k: _plain_fields(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain_fields(v) for v in value]
    return value.item() if isinstance(value, np.generic) else value


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
