"""The accumulator protocol: declared state, update, merge, compute.

Each metric group declares its state as named float64 sums, maxima and minima (``STATES``). ``update`` folds one
block of whole sequences into that state, ``merge`` combines two states (chunks, files, workers, steps: it is
the only way results combine), and ``compute`` turns the state into metric values. A finished mean is never
stored, only its sums and counts, so a merge is exact up to float64 rounding and every metric is independent of
chunk size and row order.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar, Literal, TypeVar

import numpy as np

Reduce = Literal["sum", "max", "min"]
MetricValue = float | None
"""A metric value; ``None`` where verl would crash or the value does not exist for this batch."""

_DEFAULTS: dict[str, float] = {"sum": 0.0, "max": -math.inf, "min": math.inf}

A = TypeVar("A", bound="Accumulator")


@dataclass(frozen=True)
class VerlCrash:
    """A condition under which verl v0.9.0 raises instead of logging metrics for this batch."""

    code: str
    metric: str | None
    message: str


class Accumulator:
    """Base class: subclasses declare ``STATES`` and implement ``update`` and ``compute``."""

    STATES: ClassVar[dict[str, Reduce]] = {}

    def __init__(self) -> None:
        self.state: dict[str, float] = {name: _DEFAULTS[how] for name, how in self.STATES.items()}

    def reset(self) -> None:
        """Back to the empty state."""
        self.state = {name: _DEFAULTS[how] for name, how in self.STATES.items()}

    def add(self, **values: float) -> None:
        """Fold values into the state by each state's declared reduction."""
        state = self.state
        for name, value in values.items():
            how = self.STATES[name]
            if how == "sum":
                state[name] += value
            elif how == "max":
                state[name] = _nanmax(state[name], value)
            else:
                state[name] = _nanmin(state[name], value)

    def merge(self: A, other: A) -> A:
        """Fold another accumulator of the same kind and configuration into this one; returns ``self``."""
        if type(other) is not type(self) or self.signature() != other.signature():
            raise ValueError(f"cannot merge {other.signature()} into {self.signature()}")
        self.add(**other.state)
        return self

    def signature(self) -> tuple:
        """What must match for two states to merge (the kind and its configuration)."""
        return (type(self).__name__,)

    def state_dict(self) -> dict[str, float]:
        """A copy of the raw state (serializable)."""
        return dict(self.state)

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Replace the state; the names must match the declaration exactly."""
        missing = set(self.STATES) - set(state)
        unexpected = set(state) - set(self.STATES)
        if missing or unexpected:
            raise ValueError(f"state mismatch: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
        self.state = {name: float(state[name]) for name in self.STATES}

    def keys(self) -> list[str]:
        """Metric keys in verl's order (unprefixed)."""
        raise NotImplementedError

    def compute(self) -> tuple[dict[str, MetricValue], list[VerlCrash]]:
        """Metric values in verl's key order, plus any conditions under which verl would crash."""
        raise NotImplementedError


def merge_all(accumulators: Iterable[A]) -> A:
    """Merge a non-empty iterable of accumulators into the first one."""
    iterator = iter(accumulators)
    first = next(iterator)
    for other in iterator:
        first.merge(other)
    return first


def _nanmax(a: float, b: float) -> float:
    # NaN propagates, as in torch's max.
    if a != a or b != b:
        return math.nan
    return a if a >= b else b


def _nanmin(a: float, b: float) -> float:
    if a != a or b != b:
        return math.nan
    return a if a <= b else b


def f32(x: float) -> float:
    """``x`` rounded to float32: verl compares float32 tensors with Python scalars in float32."""
    return float(np.float32(x))


_F32_MAX = float(np.finfo(np.float32).max)


def verl_float(x: MetricValue) -> MetricValue:
    """Keep float64 precision, but give a value beyond float32's range as verl's float32 ``.item()`` would (inf)."""
    if x is None or x != x or abs(x) <= _F32_MAX:
        return x
    return math.copysign(math.inf, x)


def variance(n: float, s1: float, s2: float, d1: float | None = None, d2: float | None = None) -> float:
    """Population variance from float64 sums, choosing the better-conditioned of two forms.

    ``s1, s2`` are the sums of x and x**2; ``d1, d2`` (optional) are the sums of (x - 1) and (x - 1)**2. For
    quantities that sit near 1 (IS weights) the shifted form avoids the cancellation in E[x^2] - E[x]^2; for
    quantities near 0 the plain form is better. Picking the form with the smaller second moment keeps the
    result accurate in both regimes.
    """
    if d1 is not None and d2 is not None and d2 < s2:
        s1, s2 = d1, d2
    mean = s1 / n
    return max(s2 / n - mean * mean, 0.0)
