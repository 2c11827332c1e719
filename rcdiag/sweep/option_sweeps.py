"""One option swept over its thresholds, fed block by block; each threshold's state is the state the engine's
own accumulator (``ISMetrics``, ``RSOptionMetrics``) would hold after ``rcdiag analyze`` at that threshold, so
its metrics come from that accumulator's ``compute`` (one formula, one place).

Every state here is an accumulator's (``rcdiag.metrics.base``: declared ``STATES``, ``update``, ``merge``, saved and
checked like every other). Sequence IS runs the engine's accumulator itself at each threshold (its work is per
row). An RS option is one accumulator: the engine's threshold-free states (``threshold_free_states``) once, and each
threshold's own counts (and, for ``seq_*``, clamped moments) as arrays over the thresholds, all decided at once from
(thresholds x rows) arrays. Token-level options keep one set of per-cell sums for all thresholds
(``rcdiag.sweep.cells``, filled by the sweep's pass over the statistic); token IS also the per-row mean weights of
every threshold, as arrays. ``at`` gives the engine's accumulator at one threshold, filled through its public
``set_states``, which refuses a state the sweep does not give: a new threshold-dependent state is never read as 0.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import numpy as np

from rcdiag.core.formulas import rs_keep
from rcdiag.metrics.base import Accumulator, MetricValue, MomentArrays, Reduce, VerlCrash
from rcdiag.metrics.block import Block
from rcdiag.metrics.importance import ISMetrics
from rcdiag.metrics.rejection import RSAggregateMetrics, RSOptionMetrics, bounds, row_statistic, threshold_free_states
from rcdiag.settings.correction import Estimator, RSOption
from rcdiag.settings.versions import VerlVersion
from rcdiag.sweep.cells import CellMap, Cells, Passes, band_map, clip_map, count_above, count_below
from rcdiag.sweep.grid import GridPoint

Values = tuple[dict[str, MetricValue], list[VerlCrash]]


def _accumulator(threshold: GridPoint, version: VerlVersion) -> Accumulator:
    if threshold.is_spec is not None:
        return ISMetrics(threshold.is_spec, version)
    assert threshold.rs_option is not None
    return RSOptionMetrics(threshold.rs_option)


def _host(block: Block, x: Any) -> np.ndarray:
    return block.b.to_numpy(x)


class OptionSweep:
    """Base: the accumulators that hold one option's state (``parts``), and per threshold the engine's accumulator
    (``at``) and its metrics (``compute``)."""

    statistic: str | None = None
    """The per-token statistic whose pass (``Passes``) ``update`` reads: ``k1``, ``k2``, ``k3`` or ``ratio``;
    ``None`` for per-response options."""
    cells: Cells | None = None

    def __init__(self, option: str, thresholds: tuple[GridPoint, ...], version: VerlVersion, passes: Passes) -> None:
        self.option = option
        self.thresholds = thresholds
        self.version = version
        self.passes = passes
        self._made: list[Accumulator] | None = None

    @property
    def accumulators(self) -> list[Accumulator]:
        """The engine's accumulator of each threshold, made on first use (``SequenceSweep``: the state itself; the
        others: filled from the option's state at each ``at``, and dropped by ``release``)."""
        if self._made is None:
            self._made = [_accumulator(t, self.version) for t in self.thresholds]
        return self._made

    def release(self) -> None:
        """Drop what only ``compute_at`` needs: a report holds every step's batch, a state file every step's."""
        self.__dict__.pop("_aggregates", None)

    def parts(self) -> list[Accumulator]:
        """The accumulators holding this option's state (merged, saved and loaded by the batch)."""
        raise NotImplementedError

    def at(self, index: int) -> Accumulator:
        """The engine's accumulator at threshold ``index``, holding the state ``rcdiag analyze`` would."""
        return self.accumulators[index]

    def compute_at(self, index: int, rows: float) -> Values:
        """The metrics at threshold ``index`` (``rows``: all rows of the batch, for the RS aggregate)."""
        accumulator = self.at(index)
        values, crashes = accumulator.compute()
        if isinstance(accumulator, RSOptionMetrics):
            aggregate = self._aggregate(accumulator.option)
            st = accumulator.state
            aggregate.set_states(
                {
                    "tokens": st["tokens"],
                    "rows": rows,
                    "masked_tokens": st["masked_tokens"],
                    "masked_rows": st["masked_rows"],
                }
            )
            values = {**values, **aggregate.compute()[0]}
        return values, crashes

    def _aggregate(self, option: RSOption) -> RSAggregateMetrics:
        """The RS aggregate of this option alone (one object per threshold, its state replaced at each compute)."""
        made = self.__dict__.setdefault("_aggregates", {})
        found = made.get(option)
        if found is None:
            found = made[option] = RSAggregateMetrics((option,))
        return found


class SequenceSweep(OptionSweep):
    """Sequence IS (and token IS up to verl 0.7.1): the engine's accumulator at every threshold."""

    def parts(self) -> list[Accumulator]:
        return self.accumulators


class _Filled(OptionSweep):
    """An option whose engine accumulators only carry one threshold's state through ``compute_at``."""

    def parts(self) -> list[Accumulator]:
        """Itself: the option's whole state, an accumulator of its own (``RSSweep``, ``TokenISSweep``)."""
        assert isinstance(self, Accumulator)  # mixed into accumulators only
        return [self]

    def signature(self) -> tuple:
        return (type(self).__name__, self.option, tuple(t.spec for t in self.thresholds))

    def release(self) -> None:
        super().release()
        self._made = None
        self.__dict__.pop("_rs", None)
        self.__dict__.pop("_is", None)


class RSSweep(_Filled, Accumulator):
    """An RS option: its threshold-free states once (the engine's, by their declared names), and each threshold's
    own counts as arrays over the thresholds, all of them at once from (thresholds x rows) comparisons."""

    PER_THRESHOLD: ClassVar[dict[str, Reduce]] = {"v_hi": "sums", "v_lo": "sums", "masked_rows": "sums"}
    """The states kept per threshold (an array over the thresholds each)."""
    GIVES: ClassVar[frozenset[str]] = frozenset({"v_hi", "v_lo", "masked_rows"})
    """The threshold-dependent states of ``RSOptionMetrics`` that ``at`` gives."""
    STATES: ClassVar[dict[str, Reduce]] = {}

    k1: bool
    estimator: Estimator
    free: dict[str, Reduce]
    """``RSOptionMetrics``' threshold-free states, as declared when the state was made."""
    needed: frozenset[str]
    """The threshold-free states each block must give (``threshold_free_states``)."""
    lo: np.ndarray
    hi: np.ndarray
    """Each threshold's bounds as verl compares them (a column: thresholds x rows)."""
    option_of: RSOption
    """The option (at its first threshold: what does not depend on the threshold)."""

    def __init__(self, option: str, thresholds: tuple[GridPoint, ...], version: VerlVersion, passes: Passes) -> None:
        OptionSweep.__init__(self, option, thresholds, version, passes)
        self.__dict__.update(passes.shared((type(self), option, thresholds, version), self._layout))
        Accumulator.__init__(self, self._sizes())

    def _layout(self) -> dict[str, Any]:
        """What does not depend on the data (the option, its bounds, the declaration), made once per sweep state and
        shared by every step's accumulator of this option (``Passes.shared``)."""
        first = RSOptionMetrics(self._options()[0])
        free = _threshold_free_declared()
        missing = (first.filled_states() & RSOptionMetrics.THRESHOLD_STATES) - self.GIVES
        if missing:
            raise NotImplementedError(
                f"rcdiag sweep does not compute RSOptionMetrics' threshold-dependent state(s) {sorted(missing)} per "
                f"threshold: add them to {type(self).__name__} (rcdiag/sweep/option_sweeps.py)"
            )
        both = np.asarray([bounds(option) for option in self._options()], dtype=np.float64)
        return {
            "k1": first.option.is_k1,
            "estimator": first.option.estimator,
            "free": free,
            # this instance's declaration, read from RSOptionMetrics' as it is now (the class's is read at import,
            # for the state layout): a threshold-free state added there is carried here
            "STATES": {**free, **self.PER_THRESHOLD},
            "needed": first.filled_states() & set(free),
            "lo": both[:, :1],
            "hi": both[:, 1:],
            "option_of": first.option,
        }

    def _sizes(self) -> dict[str, int]:
        return dict.fromkeys(self.PER_THRESHOLD, len(self.thresholds))

    @functools.cached_property
    def _rs(self) -> list[RSOptionMetrics]:
        return [a for a in self.accumulators if isinstance(a, RSOptionMetrics)]

    def _options(self) -> list[RSOption]:
        return [t.rs_option for t in self.thresholds if t.rs_option is not None]

    def _value_counts(self, block: Block) -> np.ndarray:
        """Fold the threshold-free states and each threshold's counts of valid rows' values above the upper and
        below the lower bound (k1 only) in; give the per-row statistic (all rows)."""
        option = self.option_of
        free = threshold_free_states(block, option)
        if not self.needed <= free.keys():
            raise NotImplementedError(
                f"RSOptionMetrics state(s) {sorted(self.needed - free.keys())} are neither threshold-free "
                "(threshold_free_states) nor in RSOptionMetrics.THRESHOLD_STATES: rcdiag sweep cannot fill them"
            )
        value = _host(block, row_statistic(block, option))
        v = value[_host(block, block.row_valid)][None, :]
        above = np.count_nonzero(v > self.hi, axis=1)
        below = np.count_nonzero(v < self.lo, axis=1) if self.k1 else 0.0
        self.add(**free, v_hi=above, v_lo=below)
        return value

    def _given(self, index: int) -> dict[str, Any]:
        """The threshold-dependent states at ``index``."""
        st = self.state
        return {name: float(st[name][index]) for name in ("v_hi", "v_lo", "masked_rows")}

    def at(self, index: int) -> Accumulator:
        out = self._rs[index]  # holds no state of its own here: filled for this compute
        st = self.state
        out.set_states({**{name: st[name] for name in self.free if name in self.needed}, **self._given(index)})
        return out


@functools.cache
def _free_declared(states: tuple[tuple[str, Reduce], ...]) -> dict[str, Reduce]:
    return {name: how for name, how in states if name not in RSOptionMetrics.THRESHOLD_STATES}


def _threshold_free_declared() -> dict[str, Reduce]:
    """``RSOptionMetrics``' declared states that do not depend on the threshold, as declared now."""
    return _free_declared(tuple(RSOptionMetrics.STATES.items()))


class SequenceRSSweep(RSSweep):
    """``seq_*`` options: what each threshold rejects, from the per-row statistic (thresholds x rows arrays)."""

    PER_THRESHOLD: ClassVar[dict[str, Reduce]] = {
        **RSSweep.PER_THRESHOLD,
        "masked_tokens": "sums",
        "clamped": "cells",
    }
    """``clamped``: each threshold's moments of the clamped per-row values, weighted by the rows' tokens."""
    GIVES = RSSweep.GIVES | {"masked_tokens", "clamped"}

    def update(self, block: Block) -> None:
        value = self._value_counts(block)
        n = _host(block, block.row_len)
        row = value[None, :]
        keep = rs_keep(row, self.lo, self.hi, self.k1)
        reject = ~keep & _host(block, block.row_valid)
        self.add(
            masked_rows=np.count_nonzero(reject, axis=1),
            masked_tokens=np.einsum("tr,r->t", reject, n, dtype=np.float64),
            clamped=_weighted_moments(np.clip(row, self.lo, self.hi), n),
        )

    def _given(self, index: int) -> dict[str, Any]:
        st = self.state
        return {
            **super()._given(index),
            "masked_tokens": float(st["masked_tokens"][index]),
            "clamped": st["clamped"].moments(index),
        }


def _weighted_moments(x: np.ndarray, weights: np.ndarray) -> MomentArrays:
    """``Backend.moments(row, weights)`` of each row of ``x`` (thresholds x rows), in float64."""
    out = MomentArrays.empty(x.shape[0])
    n = float(np.add.reduce(weights, dtype=np.float64)) if weights.size else 0.0
    if n > 0:
        out.n[:] = n
        out.mean = np.einsum("tr,r->t", x, weights) / n
        d = x - out.mean[:, None]
        out.m2 = np.einsum("tr,tr,r->t", d, d, weights)
    return out


class TokenRSSweep(RSSweep):
    """``token_k1/k2/k3``: per-cell sums of the token statistic, per-threshold row counts."""

    PER_THRESHOLD: ClassVar[dict[str, Reduce]] = {**RSSweep.PER_THRESHOLD, "cells": "cells"}
    """``cells``: the statistic's count, moments and extremes in each cell (``rcdiag.sweep.cells``)."""
    GIVES = RSSweep.GIVES | {"tok_hi", "tok_lo", "clamped", "masked_tokens"}

    maps: list[CellMap]
    """Each threshold's clamp of the statistic (std), cell by cell."""

    def __init__(self, option: str, thresholds: tuple[GridPoint, ...], version: VerlVersion, passes: Passes) -> None:
        super().__init__(option, thresholds, version, passes)
        assert self.statistic is not None
        assert self.cells is not None
        passes.cells[self.statistic] = self.cells

    def _layout(self) -> dict[str, Any]:
        edges = [b for t in self.thresholds if t.rs_option is not None for b in bounds(t.rs_option)]  # k2/k3: 0, std
        cells = Cells(edges)
        maps = [clip_map(cells, *bounds(option)) for option in self._options()]
        return {**super()._layout(), "statistic": self.option.rsplit("_", 1)[1], "cells": cells, "maps": maps}

    def _sizes(self) -> dict[str, int]:
        assert self.cells is not None
        return {**super()._sizes(), "cells": self.cells.count}

    def update(self, block: Block) -> None:
        scan = self.passes.scans(block)[self.estimator]
        self._value_counts(block)
        row_max, row_min = (_host(block, r)[None, :] for r in block.row_extremes_k(self.estimator))
        hit = (row_max > self.hi) | np.isnan(row_max)
        if self.k1:
            hit |= row_min < self.lo
        self.add(cells=scan.arrays, masked_rows=np.count_nonzero(hit, axis=1))

    def _given(self, index: int) -> dict[str, Any]:
        cells, arrays = self.cells, self.state["cells"]
        assert cells is not None
        lo, hi = bounds(self._options()[index])
        above = count_above(cells, arrays, hi)
        below = count_below(cells, arrays, lo) if self.k1 else 0.0
        nan = float(arrays.n[cells.nan_cell])
        # an inverted k1 band (lo > hi, accepted by verl <= 0.8.0) keeps nothing: each token is rejected once,
        # though it may lie both above hi and below lo
        masked = float(arrays.n.sum()) if self.k1 and lo > hi else above + below + nan
        return {
            **super()._given(index),
            "tok_hi": above,
            "tok_lo": below,
            "clamped": self.maps[index].moments(arrays),
            "masked_tokens": masked,
        }


class TokenISSweep(_Filled, Accumulator):
    """Token-level IS (TIS and IcePop): per-cell sums of the token ratio; per threshold, the per-row mean weights
    of every threshold at once (thresholds x rows) and their states (``ISMetrics.row_states``) as arrays."""

    STATES: ClassVar[dict[str, Reduce]] = {
        "cells": "cells",
        "tokens": "sum",
        "rows": "sum",
        "valid_rows": "sum",
        "a": "cells",
        "a_max_dev": "maxima",
        "rawmean_hi": "sums",
        "rawmean_lo": "sums",
    }
    """``cells``: the ratio's count, moments and extremes in each cell; ``tokens``, ``rows``, ``valid_rows``: the
    same for every threshold; per threshold: the per-row mean weights (moments of all rows, extremes, largest
    deviation from 1) and the rows whose mean ratio lies above ``upper`` and below ``metric_lower``."""

    maps: list[CellMap]
    own: np.ndarray
    """Thresholds x cells: the cells whose weights are the tokens' own ratios."""
    constant: np.ndarray
    """Thresholds x cells: the weight of every other cell's tokens."""
    upper: np.ndarray
    metric_lower: np.ndarray
    seq_fraction_applied: bool

    def __init__(self, option: str, thresholds: tuple[GridPoint, ...], version: VerlVersion, passes: Passes) -> None:
        OptionSweep.__init__(self, option, thresholds, version, passes)
        self.__dict__.update(passes.shared((type(self), option, thresholds, version), self._layout))
        assert self.cells is not None
        passes.cells["ratio"] = self.cells
        per_threshold = dict.fromkeys(("a", "a_max_dev", "rawmean_hi", "rawmean_lo"), len(thresholds))
        Accumulator.__init__(self, {"cells": self.cells.count, **per_threshold})

    def _layout(self) -> dict[str, Any]:
        """What does not depend on the data (the thresholds' cells, maps and bounds), made once per sweep state and
        shared by every step's accumulator of this option (``Passes.shared``)."""
        edges: list[float] = []
        for accumulator in self._is:
            edges += [accumulator.upper, accumulator.metric_lower]
            if accumulator.lower is not None:
                edges.append(accumulator.lower)
        cells = Cells(edges)
        maps = [_is_map(cells, a) for a in self._is]
        layout = {
            "statistic": "ratio",
            "cells": cells,
            "maps": maps,
            "own": np.stack([m.own for m in maps]),
            "constant": np.stack([np.where(m.own, 0.0, m.value) for m in maps]),
            "upper": np.asarray([a.upper for a in self._is])[:, None],
            "metric_lower": np.asarray([a.metric_lower for a in self._is])[:, None],
            "seq_fraction_applied": self._is[0].seq_fraction_applied,
        }
        self.release()  # the accumulators made for this: ``at`` makes them again when computing
        return layout

    @functools.cached_property
    def _is(self) -> list[ISMetrics]:
        return [a for a in self.accumulators if isinstance(a, ISMetrics)]

    def update(self, block: Block) -> None:
        scan = self.passes.scans(block)["ratio"]
        assert scan.row_sums is not None
        assert scan.row_counts is not None
        row_len = np.maximum(_host(block, block.row_len), 1.0)
        own = np.where(self.own[:, None, :], scan.row_sums[None, :, :], 0.0).sum(axis=2)
        a = (own + np.einsum("rc,tc->tr", scan.row_counts, self.constant)) / row_len
        # ISMetrics.row_states for every threshold at once; verl 0.8.0 compares the applied weights' row means
        raw_mean = a if self.seq_fraction_applied else _host(block, block.row_mean(block.seg.sum(block.ratio)))[None, :]
        self.add(
            cells=scan.arrays,
            tokens=block.n_tokens,
            rows=block.n_rows,
            valid_rows=block.n_valid_rows,
            rawmean_hi=np.count_nonzero(raw_mean > self.upper, axis=1),
            rawmean_lo=np.count_nonzero(raw_mean < self.metric_lower, axis=1),
        )
        if not block.n_rows:
            return
        states = MomentArrays.empty(len(self.thresholds))
        states.n[:] = block.n_rows
        states.mean = a.sum(axis=1) / block.n_rows
        d = a - states.mean[:, None]
        states.m2 = np.einsum("tr,tr->t", d, d)
        states.max, states.min = a.max(axis=1), a.min(axis=1)
        self.add(a=states, a_max_dev=np.abs(a - 1.0).max(axis=1))

    def at(self, index: int) -> Accumulator:
        own, cell_map = self._is[index], self.maps[index]
        cells, st = self.cells, self.state
        assert cells is not None
        arrays, a = st["cells"], st["a"]
        high = count_above(cells, arrays, own.upper)
        low = count_below(cells, arrays, own.metric_lower)
        given = {
            "tokens": st["tokens"],
            "rows": st["rows"],
            "valid_rows": st["valid_rows"],
            "a": a.moments(index),
            "a_max": float(a.max[index]),
            "a_min": float(a.min[index]),
            "a_max_dev": float(st["a_max_dev"][index]),
            "rawmean_hi": float(st["rawmean_hi"][index]),
            "rawmean_lo": float(st["rawmean_lo"][index]),
            "w": cell_map.moments(arrays),
            "w_max": cell_map.extreme(arrays, largest=True),
            "w_min": cell_map.extreme(arrays, largest=False),
            "raw_hi": high,
            "raw_lo": low,
        }
        if own.lower is not None:
            given["oob_tokens"] = high + count_below(cells, arrays, own.lower)
        own.set_states(given)  # holds no state of its own here: filled for this compute
        return own


def option_sweep(option: str, thresholds: tuple[GridPoint, ...], version: VerlVersion, passes: Passes) -> OptionSweep:
    """The sweep accumulator of one option under verl ``version``. Token IS up to v0.7.1 describes the raw
    weights, which the per-cell sums of the applied ones do not give: there each threshold runs the engine's
    accumulator."""
    if option == "is_token" and not version.is_metrics_on_raw_weights:
        return TokenISSweep(option, thresholds, version, passes)
    if option.startswith("token_"):
        return TokenRSSweep(option, thresholds, version, passes)
    if option.startswith("seq_"):
        return SequenceRSSweep(option, thresholds, version, passes)
    return SequenceSweep(option, thresholds, version, passes)


def _is_map(cells: Cells, accumulator: ISMetrics) -> CellMap:
    """A token IS threshold's weight in each cell: truncated at ``upper`` (TIS), or zero outside the band (IcePop)."""
    if accumulator.lower is None:
        return clip_map(cells, None, accumulator.upper)
    return band_map(cells, accumulator.lower, accumulator.upper)


for _cls in (RSSweep, SequenceRSSweep, TokenRSSweep):  # the classes' declarations (the state layout's part)
    _cls.STATES = {**_threshold_free_declared(), **_cls.PER_THRESHOLD}
