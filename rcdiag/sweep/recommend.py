"""Recommended thresholds: per option, the one whose rejected share comes closest to a target without exceeding it.

A second pass over the dump collects, per option, the statistic that decides rejection:

* per response (``seq_*`` options, sequence IS, and each response's worst token for token options): every
  value, exactly (a few bytes per response), so the threshold is an exact order statistic;
* per token (``token_*`` options, token IS): a histogram over the float32 value with 256 buckets per power of
  two (bucket width 0.39% of the value). Counts are exact at bucket edges, so the threshold is taken just
  below an edge: the share it rejects is exact and never above the target, and the threshold lies within 0.4%
  of the exact order statistic.

k1 bands are symmetric in log space, ``[1/U, U]``, written as ``L_U`` with ``log L = -log U`` exactly in float32,
so the band rejects exactly the values whose ``|log ratio|`` exceeds ``log U``. IS recommendations truncate (TIS).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rcdiag.config import CorrectionConfig
from rcdiag.engine import EngineState, StepKey
from rcdiag.metrics.block import Block
from rcdiag.metrics.rejection import row_statistic
from rcdiag.sweep.batch import SweepState
from rcdiag.sweep.grid import IS_OPTIONS, resolve
from rcdiag.sweep.report import Recommendation

BUCKET_BITS = 8
"""Mantissa bits per bucket: 256 buckets per power of two, 0.39% wide (the target is <= 0.5%)."""
_SHIFT = 23 - BUCKET_BITS
_BUCKETS = 1 << (31 - _SHIFT)  # sign bit dropped: every statistic here is >= 0 (or NaN, always rejected)


def _bucket(values: np.ndarray) -> np.ndarray:
    """Bucket index of non-negative float32 values (negative ones count as 0; NaN lands in the top buckets)."""
    bits = np.maximum(values, np.float32(0.0)).view(np.uint32) & np.uint32(0x7FFFFFFF)
    return bits >> np.uint32(_SHIFT)


def _edge(bucket: int) -> np.float32:
    """The smallest float32 in a bucket."""
    return np.uint32(bucket << _SHIFT).view(np.float32)


@dataclass
class OptionCollector:
    """What one option's recommendation needs, mergeable."""

    option: str
    token_level: bool
    histogram: np.ndarray | None = None
    """Token options: valid tokens per bucket of the token statistic (NaN buckets at the top)."""
    rows: list[np.ndarray] = field(default_factory=list)
    """Per response: the statistic (token options: the row's worst token), float64."""
    lengths: list[np.ndarray] = field(default_factory=list)

    def merge(self, other: OptionCollector) -> None:
        if other.histogram is not None:
            self.histogram = other.histogram if self.histogram is None else self.histogram + other.histogram
        self.rows += other.rows
        self.lengths += other.lengths


class Collector:
    """Every option's collector; one for the whole dump (steps do not matter here)."""

    def __init__(self, options: list[str]) -> None:
        self.options = options
        self.collectors = {
            o: OptionCollector(o, token_level=o == "is_token" or o.startswith("token_")) for o in options
        }
        self.tokens = 0
        self.rows = 0
        self.valid_rows = 0
        self.empty_rows = 0

    def update(self, block: Block) -> None:
        b = block.b
        self.tokens += block.n_tokens
        self.rows += block.n_rows
        self.valid_rows += block.n_valid_rows
        lengths = b.to_numpy(block.row_len)
        valid = lengths > 0
        for option, collector in self.collectors.items():
            if option == "is_sequence":
                value = b.to_numpy(block.seq_log_ratio).astype(np.float64)
                collector.rows.append(value)
                collector.lengths.append(lengths)
                continue
            if collector.token_level:
                stat = block.ratio if option == "is_token" else block.k(_estimator(option))
                if option.endswith("k1"):
                    stat = b.abs(stat)
                x = b.to_numpy(stat)
                counts = np.bincount(_bucket(x), minlength=_BUCKETS).astype(np.int64)
                collector.histogram = counts if collector.histogram is None else collector.histogram + counts
                worst = b.to_numpy(block.seg.max(stat, -np.inf)).astype(np.float64)
            else:
                option_spec = resolve(option, "1.0").rs_option
                assert option_spec is not None
                worst = b.to_numpy(row_statistic(block, option_spec)).astype(np.float64)
                if option.endswith("k1"):
                    worst = np.abs(worst)
            collector.rows.append(worst[valid])
            collector.lengths.append(lengths[valid])

    def merge(self, other: Collector) -> Collector:
        for option, collector in self.collectors.items():
            collector.merge(other.collectors[option])
        self.tokens += other.tokens
        self.rows += other.rows
        self.valid_rows += other.valid_rows
        return self

    def state_dict(self) -> dict[str, Any]:
        return {
            "counts": [self.tokens, self.rows, self.valid_rows],
            "options": {
                o: {
                    "histogram": None if c.histogram is None else c.histogram.tolist(),
                    "rows": np.concatenate(c.rows).tolist() if c.rows else [],
                    "lengths": np.concatenate(c.lengths).tolist() if c.lengths else [],
                }
                for o, c in self.collectors.items()
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tokens, self.rows, self.valid_rows = (int(v) for v in state["counts"])
        for option, saved in state["options"].items():
            collector = self.collectors[option]
            hist = saved["histogram"]
            collector.histogram = None if hist is None else np.asarray(hist, dtype=np.int64)
            collector.rows = [np.asarray(saved["rows"], dtype=np.float64)]
            collector.lengths = [np.asarray(saved["lengths"], dtype=np.float64)]


@dataclass
class CollectorState(EngineState):
    """An engine state with one collector for all steps (recommendations pool the dump)."""

    options: list[str] = field(default_factory=list)
    collector: Collector | None = None

    def batch(self, step: StepKey) -> Collector:  # type: ignore[override]
        if self.collector is None:
            self.collector = Collector(self.options)
            self.batches[None] = self.collector  # type: ignore[assignment]
        return self.collector

    def merge(self, other: EngineState) -> CollectorState:
        assert isinstance(other, CollectorState)
        if other.collector is not None:
            self.batch(None).merge(other.collector)
        return self

    def state_dict(self) -> dict[str, Any]:
        return {"options": self.options, "collector": None if self.collector is None else self.collector.state_dict()}

    @classmethod
    def from_state_dict(cls, resolved: Any, state: dict[str, Any]) -> CollectorState:
        out = cls(resolved, options=list(state["options"]))
        if state["collector"] is not None:
            out.batch(None).load_state_dict(state["collector"])
        return out


def new_collector_state(options: list[str]) -> CollectorState:
    return CollectorState(CorrectionConfig().resolve(), options=options)


def _estimator(option: str) -> str:
    return option.rsplit("_", 1)[1]


# ------------------------------------------------------------------------------------------------ choosing


def choose(collector: Collector, option: str, target: float) -> Recommendation | None:
    """The recommendation of one option; ``None`` if the dump has no valid token."""
    c = collector.collectors[option]
    if collector.tokens == 0:
        return None
    rows = np.concatenate(c.rows) if c.rows else np.zeros(0)
    lengths = np.concatenate(c.lengths) if c.lengths else np.zeros(0)
    if option == "is_sequence":
        return _sequence_is(rows, lengths, collector, target)
    if c.token_level:
        assert c.histogram is not None
        histogram = c.histogram
        if option == "is_token":  # IS counts ratios above U; NaN is not above anything (verl's fraction_high)
            histogram = histogram.copy()
            histogram[int(_bucket(np.asarray([np.inf], dtype=np.float32))[0]) :] = 0
            rows = np.where(np.isnan(rows), -np.inf, rows)
        threshold = _from_histogram(histogram, target * collector.tokens)
        token_reject = float(_rejected_tokens(histogram, threshold)) / collector.tokens
    else:
        threshold = _order_statistic(rows, math.floor(target * collector.valid_rows + 1e-9))
        token_reject = float(lengths[_rejected(rows, threshold)].sum()) / collector.tokens
    seq_reject = float(np.count_nonzero(_rejected(rows, threshold))) / max(collector.valid_rows, 1)
    spec = _spec(option, threshold)
    share = "token" if c.token_level else "response"
    return Recommendation(option, spec, token_reject, seq_reject, share, verl_yaml(option, spec))


def _rejected(values: np.ndarray, threshold: float) -> np.ndarray:
    return (values > threshold) | np.isnan(values)


def _from_histogram(histogram: np.ndarray, allowed: float) -> float:
    """Just below the lowest bucket edge above which at most ``allowed`` tokens lie."""
    above = np.cumsum(histogram[::-1])[::-1]  # tokens in this bucket or higher
    fits = np.flatnonzero(above <= allowed + 1e-9)
    bucket = int(fits[0]) if fits.size else _BUCKETS - 1
    bucket = max(bucket, 1)
    return float(np.nextafter(_edge(bucket), np.float32(-np.inf)))


def _rejected_tokens(histogram: np.ndarray, threshold: float) -> int:
    bucket = int(_bucket(np.asarray([np.nextafter(np.float32(threshold), np.float32(np.inf))]))[0])
    return int(histogram[bucket:].sum())


def _order_statistic(values: np.ndarray, allowed: int) -> float:
    """The smallest float32 threshold ``t`` with at most ``allowed`` values above it (NaN always counts)."""
    nan = int(np.count_nonzero(np.isnan(values)))
    finite = np.sort(values[~np.isnan(values)])[::-1]
    keep_above = allowed - nan
    if keep_above < 0 or finite.size == 0:
        return float(np.float32(finite[0])) if finite.size else 1.0
    if keep_above >= finite.size:
        return float(np.nextafter(np.float32(0.0), np.float32(1.0)))
    return _round_up(float(finite[keep_above]))


def _round_up(value: float) -> float:
    """The smallest positive float32 >= value."""
    f = np.float32(value)
    if float(f) < value:
        f = np.nextafter(f, np.float32(np.inf))
    return float(max(f, np.nextafter(np.float32(0.0), np.float32(1.0))))


def _sequence_is(rows: np.ndarray, lengths: np.ndarray, collector: Collector, target: float) -> Recommendation:
    """Sequence TIS: rows with ``S > log(U)`` (log taken in float32, as verl), over all rows."""
    allowed = math.floor(target * collector.rows + 1e-9)
    rows = np.where(np.isnan(rows), -np.inf, rows)  # NaN is never above the bound (verl's fraction_high)
    finite = np.sort(rows)[::-1]
    s = float(finite[allowed]) if allowed < finite.size else float(finite[-1]) - 1.0
    upper = _smallest_with_log_at_least(s)
    spec = _float_spec(float(upper))
    log_upper = float(np.log(np.float32(float(spec))))
    hit = _rejected(rows, log_upper)
    return Recommendation(
        "is_sequence",
        spec,
        float(lengths[hit].sum()) / max(collector.tokens, 1),
        float(np.count_nonzero(hit)) / max(collector.rows, 1),
        "response",
        verl_yaml("is_sequence", spec),
    )


def _smallest_with_log_at_least(s: float) -> np.float32:
    """The smallest positive float32 ``u`` whose float32 log (verl's IS log-threshold) is ``>= s``: a bisection
    over the bit patterns of positive float32 values, on which ``log`` is monotone."""
    lo, hi = 1, 0x7F800000  # smallest subnormal .. +inf
    with np.errstate(divide="ignore"):
        while lo < hi:
            mid = (lo + hi) // 2
            if float(np.log(np.uint32(mid).view(np.float32))) >= s:
                hi = mid
            else:
                lo = mid + 1
    return np.uint32(lo).view(np.float32)


def _spec(option: str, threshold: float) -> str:
    """A spec ``rcdiag analyze`` (and verl) parse back to exactly this threshold on the statistic."""
    if option == "is_token" or not option.endswith("k1"):
        return _float_spec(threshold)
    # k1: keep -t <= log-ratio statistic <= t, i.e. the band [exp(-t), exp(t)], exact in float32.
    t = float(np.float32(threshold))
    for digits in range(4, 18):  # the shortest decimals that still give exactly +-t
        spec = f"{math.exp(-t):.{digits}g}_{math.exp(t):.{digits}g}"
        option_spec = resolve(option, spec).rs_option
        assert option_spec is not None
        if float(np.float32(option_spec.thr_hi)) == t and float(np.float32(option_spec.thr_lo)) == -t:
            return spec
    raise AssertionError(f"no k1 band gives +-{t} exactly")


def _float_spec(value: float) -> str:
    """The shortest decimal that verl's float() then float32 rounding turn back into this float32 value."""
    f = np.float32(value)
    short = np.format_float_positional(f, unique=True, trim="-")
    return short if np.float32(float(short)) == f else repr(float(f))


def verl_yaml(option: str, spec: str) -> str:
    """The lines to paste into verl's config for this option alone."""
    if option in IS_OPTIONS.values():
        level = option.removeprefix("is_")
        body = f"rollout_is: {level}\n    rollout_is_threshold: {_yaml_value(spec)}"
    else:
        body = f"rollout_rs: {option}\n    rollout_rs_threshold: {_yaml_value(spec)}"
    return f"algorithm:\n  rollout_correction:\n    {body}\n"


def _yaml_value(spec: str) -> str:
    return f'"{spec}"' if "_" in spec else spec


def recommend(state: SweepState, target: float, read: Callable[..., Any], *, workers: int = 1) -> list[Recommendation]:
    """Read the dump a second time and recommend a threshold for every option of the sweep."""
    import functools

    options = [option for option, _ in state.grid.options]
    accumulated = read(workers=workers, new_state=functools.partial(new_collector_state, options))
    collector = accumulated.state.collector
    if collector is None:
        return []
    out = [choose(collector, option, target) for option in options]
    return [r for r in out if r is not None]
