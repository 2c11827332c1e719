"""The accumulator protocol: declared state, update, merge, compute.

Each metric group declares its state as named float64 sums, maxima, minima and moments, or int64 bin counts
(``STATES``; a ``counts`` state has ``BINS`` bins). ``update``
folds one block of whole sequences into that state, ``merge`` combines two states (chunks, files, workers, steps:
it is the only way results combine), and ``compute`` turns the state into metric values. A finished mean is
never stored on its own: sums and counts, or (count, mean, M2) moments merged with Chan et al.'s pairwise
formula, so a merge is exact up to float64 rounding and every metric is independent of chunk size and row order.
Moments are centred per block, so a spread far smaller than the mean (IS weights near 1, a statistic clamped
to one bound) is not lost to cancellation in E[x^2] - E[x]^2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

import numpy as np

from rcdiag.catalogue.findings import finding
from rcdiag.core.formulas import chan_merge
from rcdiag.core.limits import F32_MAX
from rcdiag.fields import FieldError, counts, real, shown

if TYPE_CHECKING:
    from rcdiag.metrics.block import Block

Reduce = Literal["sum", "max", "min", "moments", "counts"]
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
            counts = tuple(name for name, how in self.STATES.items() if how == "counts")
            template = {name: None if how == "counts" else self._empty(how) for name, how in self.STATES.items()}
            empty = (template, counts)  # (the declared order kept: counts are filled in below)
            self._empty_states[key] = empty
        template, counts = empty
        self.state: dict[str, Any] = dict(template)
        for name in counts:  # arrays: a new one for every accumulator
            self.state[name] = self._empty("counts")

    def _empty(self, how: Reduce) -> Any:
        return np.zeros(self.BINS, dtype=np.int64) if how == "counts" else _DEFAULTS[how]

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
            else:
                state[name] = state[name].merge(value if isinstance(value, Moments) else Moments(*value))

    def merge(self: A, other: A) -> A:
        """Fold another accumulator of the same kind and configuration into this one; returns ``self``."""
        if type(other) is not type(self) or self.signature() != other.signature():
            raise ValueError(f"cannot merge {other.signature()} into {self.signature()}")
        self.add(**other.state)
        return self

    def signature(self) -> tuple:
        """What must match for two states to merge (the kind and its configuration)."""
        return (type(self).__name__,)

    def state_dict(self) -> dict[str, Any]:
        """A copy of the raw state: floats, moments as ``[n, mean, m2]``, counts as lists (JSON-serializable)."""
        return {k: _plain(v) for k, v in self.state.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the state with a saved one (from a file: anything), each value checked against its declaration:
        the names exactly, a number for a sum or extreme (>= 0 for a ``COUNTED`` one), ``[n >= 0, mean, m2]`` for
        moments, ``BINS`` integers >= 0 for counts."""
        owner = type(self).__name__
        if not isinstance(state, dict):
            raise FieldError(f"{owner} must be a table of its states, got {shown(state)}")
        missing = set(self.STATES) - set(state)
        unexpected = set(state) - set(self.STATES)
        if missing or unexpected:
            raise ValueError(f"state mismatch: missing {sorted(missing)}, unexpected {sorted(map(repr, unexpected))}")
        self.state = {name: self._loaded(how, state[name], f"{owner}.{name}") for name, how in self.STATES.items()}

    def _loaded(self, how: Reduce, value: Any, field: str) -> Any:
        if how == "moments":
            if not isinstance(value, list) or len(value) != 3:
                raise FieldError(f"{field} must be [n, mean, m2], got {shown(value)}")
            n, mean, m2 = value
            return Moments(
                real(n, f"{field} n", nonnegative=True), real(mean, f"{field} mean"), real(m2, f"{field} m2")
            )
        if how == "counts":
            return counts(value, field, (self.BINS,))
        return real(value, field, nonnegative=field.rsplit(".", 1)[1] in self.COUNTED)

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
