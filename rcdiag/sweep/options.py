"""One option swept over its thresholds, fed block by block; each threshold's state is the state the engine's
own accumulator (``ISMetrics``, ``RSOptionMetrics``) would hold after ``rcdiag analyze`` at that threshold, so
its metrics come from that accumulator's ``compute`` (one formula, one place).

Sequence IS runs the engine's accumulator itself at each threshold (its work is per row). RS options fold their
threshold-free states in once (``base``) and decide every threshold at once from (thresholds x rows) arrays,
keeping each threshold's own counts (and, for ``seq_*``, clamped moments) as arrays over the thresholds.
Token-level options keep one set of per-cell sums for all thresholds (``rcdiag.sweep.cells``, filled by the
batch's pass over the statistic); token IS also the per-row mean weights of every threshold, as arrays.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from rcdiag.config import RSOption
from rcdiag.core.formulas import rs_keep
from rcdiag.fields import FieldError, integer, reals, shown
from rcdiag.metrics.base import Accumulator, MetricValue, Moments, VerlCrash
from rcdiag.metrics.block import Block
from rcdiag.metrics.importance import ISMetrics
from rcdiag.metrics.rejection import RSAggregateMetrics, RSOptionMetrics, bounds, row_statistic, threshold_free_states
from rcdiag.sweep.cells import CellArrays, CellMap, Cells, TokenScan, band_map, clip_map, count_above, count_below
from rcdiag.sweep.grid import Threshold
from rcdiag.versions import VerlVersion

Values = tuple[dict[str, MetricValue], list[VerlCrash]]


def _accumulator(threshold: Threshold, version: VerlVersion) -> Accumulator:
    if threshold.is_spec is not None:
        return ISMetrics(threshold.is_spec, version)
    assert threshold.rs_option is not None
    return RSOptionMetrics(threshold.rs_option)


def _host(block: Block, x: Any) -> np.ndarray:
    return block.b.to_numpy(x)


class OptionSweep:
    """Base: ``update`` with blocks, ``merge``, ``state_dict``, and per-threshold ``compute``."""

    statistic: str | None = None
    """The per-token statistic whose pass (``Cells.scan``, run by the batch) ``update`` takes: ``k1``, ``k2``,
    ``k3`` or ``ratio``; ``None`` for per-response options."""
    cells: Cells | None = None

    def __init__(self, option: str, thresholds: tuple[Threshold, ...], version: VerlVersion) -> None:
        self.option = option
        self.thresholds = thresholds
        self.version = version
        self.accumulators = [_accumulator(t, version) for t in thresholds]

    def update(self, block: Block, scan: TokenScan | None) -> None:
        raise NotImplementedError

    def merge(self, other: OptionSweep) -> None:
        for mine, theirs in zip(self.accumulators, other.accumulators, strict=True):
            mine.merge(theirs)

    def state_dict(self) -> dict[str, Any]:
        return {"thresholds": [a.state_dict() for a in self.accumulators]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for accumulator, saved in zip(self.accumulators, state["thresholds"], strict=True):
            accumulator.load_state_dict(saved)

    def compute(self, index: int, rows: float) -> Values:
        """The metrics at threshold ``index`` (``rows``: all rows of the batch, for the RS aggregate)."""
        accumulator = self._filled(index)
        values, crashes = accumulator.compute()
        if isinstance(accumulator, RSOptionMetrics):
            aggregate = self._aggregate(accumulator.option)
            st = accumulator.state
            aggregate.state = {
                "tokens": st["tokens"],
                "rows": rows,
                "masked_tokens": st["masked_tokens"],
                "masked_rows": st["masked_rows"],
            }
            values = {**values, **aggregate.compute()[0]}
        return values, crashes

    def _filled(self, index: int) -> Accumulator:
        return self.accumulators[index]

    def _aggregate(self, option: RSOption) -> RSAggregateMetrics:
        """The RS aggregate of this option alone (one object per threshold, its state replaced at each compute)."""
        made = self.__dict__.setdefault("_aggregates", {})
        found = made.get(option)
        if found is None:
            found = made[option] = RSAggregateMetrics((option,))
        return found


class SequenceSweep(OptionSweep):
    """Sequence IS (and token IS up to verl 0.7.1): the engine's accumulator at every threshold."""

    def update(self, block: Block, scan: TokenScan | None) -> None:
        for accumulator in self.accumulators:
            accumulator.update(block)


class RSSweep(OptionSweep):
    """An RS option: its threshold-free state once (``base``), and each threshold's own counts as arrays over the
    thresholds, all of them at once from (thresholds x rows) comparisons."""

    _counts: tuple[str, ...] = ("v_hi", "v_lo", "masked_rows")
    """The states each threshold counts itself (``counts``, one row each)."""

    def __init__(self, option: str, thresholds: tuple[Threshold, ...], version: VerlVersion) -> None:
        super().__init__(option, thresholds, version)
        first = self.accumulators[0]
        assert isinstance(first, RSOptionMetrics)
        self.k1 = first.option.is_k1
        self.estimator = first.option.estimator
        self.base = RSOptionMetrics(first.option)
        """Holds the option's threshold-free state (mean, extremes, per-row moments), shared by every threshold."""
        both = np.asarray([bounds(option) for option in self._options()], dtype=np.float64)
        self.lo, self.hi = both[:, :1], both[:, 1:]
        """Each threshold's bounds as verl compares them (a column: thresholds x rows)."""
        self.counts = np.zeros((len(self._counts), len(thresholds)))
        """Per state of ``_counts`` and threshold: the sum over blocks (whole numbers, exact in float64)."""

    @functools.cached_property
    def _rs(self) -> list[RSOptionMetrics]:
        return [a for a in self.accumulators if isinstance(a, RSOptionMetrics)]

    def _options(self) -> list[RSOption]:
        return [a.option for a in self._rs]

    def _value_counts(self, block: Block) -> np.ndarray:
        """Fold the threshold-free states and each threshold's counts of valid rows' values above the upper and
        below the lower bound (k1 only) in; give the per-row statistic (all rows)."""
        self.base.add(**threshold_free_states(block, self.base.option))
        value = _host(block, row_statistic(block, self.base.option))
        v = value[_host(block, block.row_valid)][None, :]
        self.counts[0] += np.count_nonzero(v > self.hi, axis=1)
        if self.k1:
            self.counts[1] += np.count_nonzero(v < self.lo, axis=1)
        return value

    def merge(self, other: OptionSweep) -> None:
        assert isinstance(other, RSSweep)
        self.base.merge(other.base)
        self.counts += other.counts

    def state_dict(self) -> dict[str, Any]:
        return {"base": self.base.state_dict(), "counts": self.counts.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.base.load_state_dict(state["base"])
        self.counts = reals(state["counts"], "counts", self.counts.shape, nonnegative=True)

    def _filled(self, index: int) -> Accumulator:
        out = self._rs[index]  # holds no state of its own here (``counts`` does): filled for this compute
        own = dict(zip(self._counts, self.counts[:, index].tolist(), strict=True))
        out.state = {**self.base.state, **own}
        return out


class SequenceRSSweep(RSSweep):
    """``seq_*`` options: what each threshold rejects, from the per-row statistic (thresholds x rows arrays)."""

    _counts = ("v_hi", "v_lo", "masked_rows", "masked_tokens")

    def __init__(self, option: str, thresholds: tuple[Threshold, ...], version: VerlVersion) -> None:
        super().__init__(option, thresholds, version)
        self.clamped = CellArrays.empty(len(thresholds))
        """Each threshold's moments of the clamped per-row values, weighted by the rows' tokens (``n``, ``mean``,
        ``m2``; merged as cells are)."""

    def update(self, block: Block, scan: TokenScan | None) -> None:
        value = self._value_counts(block)
        n = _host(block, block.row_len)
        row = value[None, :]
        keep = rs_keep(row, self.lo, self.hi, self.k1)
        reject = ~keep & _host(block, block.row_valid)
        self.counts[2] += np.count_nonzero(reject, axis=1)
        self.counts[3] += np.einsum("tr,r->t", reject, n, dtype=np.float64)
        self.clamped.merge(_weighted_moments(np.clip(row, self.lo, self.hi), n))

    def merge(self, other: OptionSweep) -> None:
        assert isinstance(other, SequenceRSSweep)
        super().merge(other)
        self.clamped.merge(other.clamped)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "clamped": self.clamped.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.clamped = CellArrays.from_state_dict(state["clamped"], like=self.clamped)

    def _filled(self, index: int) -> Accumulator:
        out = super()._filled(index)
        c = self.clamped
        out.state["clamped"] = Moments(float(c.n[index]), float(c.mean[index]), float(c.m2[index]))
        return out


def _weighted_moments(x: np.ndarray, weights: np.ndarray) -> CellArrays:
    """``Backend.moments(row, weights)`` of each row of ``x`` (thresholds x rows), in float64."""
    out = CellArrays.empty(x.shape[0])
    n = float(np.add.reduce(weights, dtype=np.float64)) if weights.size else 0.0
    if n > 0:
        out.n[:] = n
        out.mean = np.einsum("tr,r->t", x, weights) / n
        d = x - out.mean[:, None]
        out.m2 = np.einsum("tr,tr,r->t", d, d, weights)
    return out


class TokenRSSweep(RSSweep):
    """``token_k1/k2/k3``: per-cell sums of the token statistic, per-threshold row counts."""

    def __init__(self, option: str, thresholds: tuple[Threshold, ...], version: VerlVersion) -> None:
        super().__init__(option, thresholds, version)
        self.statistic = self.estimator
        edges = [b for a in self._rs for b in bounds(a.option)]  # k2/k3: 0, the std clamp's floor
        self.cells = Cells(edges)
        self.arrays = CellArrays.empty(self.cells.count)
        self.maps = [clip_map(self.cells, *bounds(option)) for option in self._options()]
        """Each threshold's clamp of the statistic (std), cell by cell."""

    def update(self, block: Block, scan: TokenScan | None) -> None:
        assert scan is not None
        self._value_counts(block)
        self.arrays.merge(scan.arrays)
        row_max, row_min = (_host(block, r)[None, :] for r in block.row_extremes_k(self.estimator))
        hit = (row_max > self.hi) | np.isnan(row_max)
        if self.k1:
            hit |= row_min < self.lo
        self.counts[2] += np.count_nonzero(hit, axis=1)

    def merge(self, other: OptionSweep) -> None:
        assert isinstance(other, TokenRSSweep)
        super().merge(other)
        self.arrays.merge(other.arrays)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "cells": self.arrays.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.arrays = CellArrays.from_state_dict(state["cells"], like=self.arrays)

    def _filled(self, index: int) -> Accumulator:
        out = super()._filled(index)
        own = self._rs[index]
        cells, arrays = self.cells, self.arrays
        lo, hi = bounds(own.option)
        above = count_above(cells, arrays, hi)
        below = count_below(cells, arrays, lo) if self.k1 else 0.0
        nan = float(arrays.n[cells.nan_cell])
        # an inverted k1 band (lo > hi, accepted by verl <= 0.8.0) keeps nothing: each token is rejected once,
        # though it may lie both above hi and below lo
        masked = float(arrays.n.sum()) if self.k1 and lo > hi else above + below + nan
        out.state.update(
            tok_hi=above,
            tok_lo=below,
            clamped=self.maps[index].moments(arrays),
            masked_tokens=masked,
        )
        return out


class TokenISSweep(OptionSweep):
    """Token-level IS (TIS and IcePop): per-cell sums of the token ratio; per threshold, the per-row mean weights
    of every threshold at once (thresholds x rows) and their states (``ISMetrics.row_states``) as arrays."""

    def __init__(self, option: str, thresholds: tuple[Threshold, ...], version: VerlVersion) -> None:
        super().__init__(option, thresholds, version)
        edges: list[float] = []
        for accumulator in self._is:
            edges += [accumulator.upper, accumulator.metric_lower]
            if accumulator.lower is not None:
                edges.append(accumulator.lower)
        self.cells = Cells(edges)
        self.statistic = "ratio"
        self.arrays = CellArrays.empty(self.cells.count)
        self.maps = [self._map(a) for a in self._is]
        self.own = np.stack([m.own for m in self.maps])
        """Thresholds x cells: the cells whose weights are the tokens' own ratios."""
        self.constant = np.stack([np.where(m.own, 0.0, m.value) for m in self.maps])
        """Thresholds x cells: the weight of every other cell's tokens."""
        self.upper = np.asarray([a.upper for a in self._is])[:, None]
        self.metric_lower = np.asarray([a.metric_lower for a in self._is])[:, None]
        self.totals = [0, 0, 0]
        """Tokens, rows and valid rows (the same for every threshold)."""
        self.a = CellArrays.empty(len(thresholds))
        """Per threshold, the per-row mean weights: moments (all rows), max and min."""
        self.a_max_dev = np.full(len(thresholds), -np.inf)
        self.rawmean = np.zeros((2, len(thresholds)))
        """Per threshold, rows whose mean ratio lies above ``upper`` and below ``metric_lower``."""

    @functools.cached_property
    def _is(self) -> list[ISMetrics]:
        return [a for a in self.accumulators if isinstance(a, ISMetrics)]

    def _map(self, accumulator: ISMetrics) -> CellMap:
        if accumulator.lower is None:
            return clip_map(self.cells, None, accumulator.upper)
        return band_map(self.cells, accumulator.lower, accumulator.upper)

    def update(self, block: Block, scan: TokenScan | None) -> None:
        assert scan is not None
        assert scan.row_sums is not None
        assert scan.row_counts is not None
        self.arrays.merge(scan.arrays)
        row_len = np.maximum(_host(block, block.row_len), 1.0)
        own = np.where(self.own[:, None, :], scan.row_sums[None, :, :], 0.0).sum(axis=2)
        a = (own + np.einsum("rc,tc->tr", scan.row_counts, self.constant)) / row_len
        # ISMetrics.row_states for every threshold at once; verl 0.8.0 compares the applied weights' row means
        if self._is[0].seq_fraction_applied:
            raw_mean = a
        else:
            raw_mean = _host(block, block.row_mean(block.seg.sum(block.ratio)))[None, :]
        counted = (block.n_tokens, block.n_rows, block.n_valid_rows)
        self.totals = [total + more for total, more in zip(self.totals, counted, strict=True)]
        self.rawmean[0] += np.count_nonzero(raw_mean > self.upper, axis=1)
        self.rawmean[1] += np.count_nonzero(raw_mean < self.metric_lower, axis=1)
        if not block.n_rows:
            return
        states = CellArrays.empty(len(self.thresholds))
        states.n[:] = block.n_rows
        states.mean = a.sum(axis=1) / block.n_rows
        d = a - states.mean[:, None]
        states.m2 = np.einsum("tr,tr->t", d, d)
        states.max, states.min = a.max(axis=1), a.min(axis=1)
        self.a.merge(states)
        self.a_max_dev = np.maximum(self.a_max_dev, np.abs(a - 1.0).max(axis=1))

    def merge(self, other: OptionSweep) -> None:
        assert isinstance(other, TokenISSweep)
        self.arrays.merge(other.arrays)
        self.totals = [mine + theirs for mine, theirs in zip(self.totals, other.totals, strict=True)]
        self.a.merge(other.a)
        self.a_max_dev = np.maximum(self.a_max_dev, other.a_max_dev)
        self.rawmean += other.rawmean

    def state_dict(self) -> dict[str, Any]:
        return {
            "cells": self.arrays.state_dict(),
            "totals": self.totals,
            "a": self.a.state_dict(),
            "a_max_dev": self.a_max_dev.tolist(),
            "rawmean": self.rawmean.tolist(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.arrays = CellArrays.from_state_dict(state["cells"], like=self.arrays)
        totals = state["totals"]
        if not isinstance(totals, list) or len(totals) != len(self.totals):
            raise FieldError(f"totals must be {len(self.totals)} counts, got {shown(totals)}")
        self.totals = [integer(v, "totals") for v in totals]
        self.a = CellArrays.from_state_dict(state["a"], like=self.a)
        self.a_max_dev = reals(state["a_max_dev"], "a_max_dev", self.a_max_dev.shape)
        self.rawmean = reals(state["rawmean"], "rawmean", self.rawmean.shape, nonnegative=True)

    def _filled(self, index: int) -> Accumulator:
        own, cell_map = self._is[index], self.maps[index]
        cells, arrays, a = self.cells, self.arrays, self.a
        out = own  # holds no state of its own here: filled for this compute
        high = count_above(cells, arrays, own.upper)
        low = count_below(cells, arrays, own.metric_lower)
        out.state.update(
            tokens=self.totals[0],
            rows=self.totals[1],
            valid_rows=self.totals[2],
            a=Moments(float(a.n[index]), float(a.mean[index]), float(a.m2[index])),
            a_max=float(a.max[index]),
            a_min=float(a.min[index]),
            a_max_dev=float(self.a_max_dev[index]),
            rawmean_hi=float(self.rawmean[0, index]),
            rawmean_lo=float(self.rawmean[1, index]),
            w=cell_map.moments(arrays),
            w_max=cell_map.extreme(arrays, largest=True),
            w_min=cell_map.extreme(arrays, largest=False),
            raw_hi=high,
            raw_lo=low,
            oob_tokens=0.0 if own.lower is None else high + count_below(cells, arrays, own.lower),
        )
        return out


def option_sweep(option: str, thresholds: tuple[Threshold, ...], version: VerlVersion) -> OptionSweep:
    """The sweep accumulator of one option under verl ``version``. Token IS up to v0.7.1 describes the raw
    weights, which the per-cell sums of the applied ones do not give: there each threshold runs the engine's
    accumulator."""
    if option == "is_token" and not version.is_metrics_on_raw_weights:
        return TokenISSweep(option, thresholds, version)
    if option.startswith("token_"):
        return TokenRSSweep(option, thresholds, version)
    if option.startswith("seq_"):
        return SequenceRSSweep(option, thresholds, version)
    return SequenceSweep(option, thresholds, version)
