"""Recommended thresholds: per option, the one whose rejected share comes closest to a target without exceeding it.

They are chosen from what the sweep's pass collected (``rcdiag.sweep.collector``): per response, every value, so
the threshold is an exact order statistic (rounded up to float32); per token, a histogram exact at its bucket
edges, so the threshold is taken just below an edge: the share it rejects is exact and never above the target,
and the threshold lies within 0.4% of the exact order statistic.

k1 bands are symmetric in log space, ``[1/U, U]``, written as ``L_U`` with ``log L = -log U`` exactly in float32,
so the band rejects exactly the values whose ``|log ratio|`` exceeds ``log U``. A statistic beyond ``K1_BAND_MAX``
(a sequence log-ratio sum of 800: ``exp(800)`` is no float) gets the widest band a decimal spec can state, and its
rejected shares are those of that band, above the target where it must be. IS recommendations truncate (TIS).

Each threshold is an exact value for the target, usually not one of the grid's points: ``place_on_grid`` says
which swept threshold comes nearest. A threshold that rejects or truncates nothing (beyond verl's clamp) or sits at
a float32 limit is no setting anyone should paste: it gets ``not_config`` and no YAML.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

import numpy as np

from rcdiag.core.formulas import POS_INF_KEY
from rcdiag.core.limits import F32_MAX
from rcdiag.settings.correction import SAFETY_BOUND, rollout_correction_yaml
from rcdiag.sweep.collector import BUCKETS, Collector, bucket, edge
from rcdiag.sweep.grid import IS_OPTIONS, resolve
from rcdiag.sweep.sweep_report import GridNeighbour, Recommendation, SweepRow

K1_BAND_MAX = float(np.nextafter(np.float32(math.log(np.finfo(np.float64).max)), np.float32(0.0)))
"""The widest k1 band, ``+-709.78`` in log space: ``exp`` of more overflows, so no spec states a wider one."""


CLAMP_WEIGHT = math.exp(SAFETY_BOUND)
"""verl clamps log-ratios to +-SAFETY_BOUND before exp: no IS weight or ratio exceeds e^20 ~ 4.85e8."""
TYPICAL = {
    "is_token": (1.5, 5.0),
    "is_sequence": (2.0, 10.0),
    **dict.fromkeys(("token_k3", "seq_sum_k3", "seq_mean_k3", "seq_max_k3"), (0.001, 0.1)),
}
"""verl's documented typical upper thresholds (docs/algo/rollout_corr.md: token IS 1.5-5, sequence IS 2-10, K3 RS
0.001-0.1), for the warnings."""


def unreachable(units: int, target: float, unit: str) -> str | None:
    """Why ``target`` cannot be met on ``units`` responses or tokens (less than one of them); ``None`` if it can."""
    if target * units >= 1.0 or target <= 0.0:
        return None
    return (
        f"the target cannot be met: {target:g} of {units:,} {unit}{'s' if units != 1 else ''} is less than one {unit} "
        f"(it needs at least {math.ceil(1.0 / target - 1e-9):,} {unit}s)"
    )


def warnings(option: str, spec: str) -> tuple[str, ...]:
    """What a recommended spec needs said: a bound beyond verl's clamp, or outside verl's typical range."""
    upper = float(spec.split("_")[-1])
    out = []
    if option.endswith("k1") and option != "is_token":
        if math.log(upper) > SAFETY_BOUND:
            out.append(
                f"the band reaches beyond e^{SAFETY_BOUND:g} ~ {CLAMP_WEIGHT:.3g}, verl's clamp on any ratio: "
                + (
                    "it rejects nothing"
                    if option != "seq_sum_k1"
                    else "only products of ratios beyond any weight "
                    "verl's IS can express are rejected; the dump's mismatch is far beyond correction"
                )
            )
    elif option.startswith("is_") and upper > CLAMP_WEIGHT:
        out.append(
            f"beyond verl's clamp: an IS weight is at most e^{SAFETY_BOUND:g} ~ {CLAMP_WEIGHT:.3g}, so this threshold "
            "truncates nothing"
        )
    typical = TYPICAL.get(option)
    if typical is not None and not typical[0] <= upper <= typical[1]:
        out.append(f"outside verl's typical range for {option} ({typical[0]:g}-{typical[1]:g})")
    return tuple(out)


F32_TINY = float(np.nextafter(np.float32(0.0), np.float32(1.0)))
"""The smallest positive float32: a threshold there rejects every value above 0."""


def not_config(option: str, spec: str) -> str | None:
    """Why a recommended spec is no setting to paste into verl's config, or ``None`` when it is one: a band or
    threshold beyond verl's clamp rejects (or truncates) nothing a weight can show, and a bound at a float limit
    (the widest band a spec can state, a threshold at the smallest or largest float32) says only that the dump's
    values reach that limit."""
    upper = float(spec.split("_")[-1])
    if option.endswith("k1") and option != "is_token":
        if math.log(upper) >= K1_BAND_MAX * (1 - 1e-6):
            return "the widest band a spec can state (a float limit): the dump's statistic lies beyond any band"
        if math.log(upper) > SAFETY_BOUND:
            return f"the band is wider than e^+-{SAFETY_BOUND:g}, verl's clamp on any ratio: " + (
                "it rejects nothing" if option != "seq_sum_k1" else "the dump's mismatch is far beyond correction"
            )
        return None
    if option.startswith("is_") and upper > CLAMP_WEIGHT:
        return f"beyond verl's clamp (e^{SAFETY_BOUND:g}): it truncates nothing"
    if upper >= F32_MAX or upper <= F32_TINY:
        return "the threshold sits at a float32 limit"
    return None


def place_on_grid(
    recommendations: Iterable[Recommendation], rows: Iterable[SweepRow], target: float | None, version: str
) -> list[Recommendation]:
    """Each recommendation with the swept threshold whose targeted share comes nearest to ``target`` (ties: the one
    nearest the recommendation in value; ``Recommendation.nearest``); for IS only TIS thresholds count, since the
    recommendations truncate. Specs are compared as verl ``version`` parses them (the grid's release)."""
    by_option: dict[str, list[SweepRow]] = {}
    for row in rows:
        if not row.icepop:
            by_option.setdefault(row.option, []).append(row)
    return [
        dataclasses.replace(rec, nearest=_nearest(rec, by_option.get(rec.option, []), target, version))
        for rec in recommendations
    ]


def _nearest(rec: Recommendation, rows: list[SweepRow], target: float | None, version: str) -> GridNeighbour | None:
    if rec.threshold is None or target is None:
        return None
    pairs = ((row.token_reject if rec.share == "token" else row.seq_reject, row) for row in rows)
    shares = [(share, row) for share, row in pairs if share is not None]
    if not shares:
        return None
    mine = resolve(rec.option, rec.threshold, version)
    for share, row in shares:  # the recommendation is a grid point: that one, whatever another's share
        if dataclasses.replace(resolve(rec.option, row.threshold, version), spec=mine.spec) == mine:
            return GridNeighbour(row.threshold, float(share), True)
    mine_upper = float(rec.threshold.split("_")[-1])

    def apart(spec: str) -> float:  # among equal shares, the grid point nearest the recommendation in value
        upper = float(spec.split("_")[-1])
        return abs(math.log(upper) - math.log(mine_upper)) if upper > 0 and mine_upper > 0 else math.inf

    share, row = min(shares, key=lambda pair: (abs(pair[0] - target), pair[0] > target, apart(pair[1].threshold)))
    return GridNeighbour(row.threshold, float(share), False)


def choose(collector: Collector, option: str, target: float) -> Recommendation | None:
    """The recommendation of one option; ``None`` if the dump has no valid token."""
    c = collector.collectors[option]
    if collector.tokens == 0:
        return None
    share = "token" if c.token_level else "response"
    units = collector.rows if option == "is_sequence" else collector.tokens if c.token_level else collector.valid_rows
    why = unreachable(units, target, share)
    if why is not None:
        return Recommendation(option, None, None, None, share, "", unreachable=why)
    rows = np.concatenate(c.rows).astype(np.float64, copy=False) if c.rows else np.zeros(0)
    lengths = collector.lengths(option)
    if option == "is_sequence":
        return _sequence_is(rows, lengths, collector, target)
    if c.token_level:
        assert c.histogram is not None
        histogram = c.histogram
        if option == "is_token":  # IS counts ratios above U; NaN is not above anything (verl's fraction_high)
            histogram = histogram.copy()
            histogram[int(bucket(np.asarray([np.inf], dtype=np.float32))[0]) :] = 0
            rows = np.where(np.isnan(rows), -np.inf, rows)
        threshold = _from_histogram(histogram, target * collector.tokens)
    else:
        threshold = _order_statistic(rows, math.floor(target * collector.valid_rows + 1e-9))
    if option.endswith("k1") and option != "is_token":
        threshold = min(threshold, K1_BAND_MAX)
    if c.token_level:
        token_reject = float(_rejected_tokens(histogram, threshold)) / collector.tokens
    else:
        token_reject = float(lengths[_rejected(rows, threshold)].sum()) / collector.tokens
    seq_reject = float(np.count_nonzero(_rejected(rows, threshold))) / max(collector.valid_rows, 1)
    spec = _spec(option, threshold)
    return _made(option, spec, token_reject, seq_reject, share)


def _made(option: str, spec: str, token_reject: float, seq_reject: float, share: str) -> Recommendation:
    """A recommendation, its YAML only when it is a setting to paste."""
    why = not_config(option, spec)
    yaml = verl_yaml(option, spec) if why is None else ""
    return Recommendation(option, spec, token_reject, seq_reject, share, yaml, warnings(option, spec), not_config=why)


def _rejected(values: np.ndarray, threshold: float) -> np.ndarray:
    return (values > threshold) | np.isnan(values)


def _from_histogram(histogram: np.ndarray, allowed: float) -> float:
    """Just below the lowest bucket edge above which at most ``allowed`` tokens lie."""
    above = np.cumsum(histogram[::-1])[::-1]  # tokens in this bucket or higher
    fits = np.flatnonzero(above <= allowed + 1e-9)
    first = max(int(fits[0]) if fits.size else BUCKETS - 1, 1)
    return float(np.nextafter(edge(first), np.float32(-np.inf)))


def _rejected_tokens(histogram: np.ndarray, threshold: float) -> int:
    first = int(bucket(np.asarray([np.nextafter(np.float32(threshold), np.float32(np.inf))]))[0])
    return int(histogram[first:].sum())


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
    return _made(
        "is_sequence",
        spec,
        float(lengths[hit].sum()) / max(collector.tokens, 1),
        float(np.count_nonzero(hit)) / max(collector.rows, 1),
        "response",
    )


def _smallest_with_log_at_least(s: float) -> np.float32:
    """The smallest positive float32 ``u`` whose float32 log (verl's IS log-threshold) is ``>= s``: a bisection
    over the bit patterns of positive float32 values, on which ``log`` is monotone."""
    lo, hi = 1, int(POS_INF_KEY)  # smallest subnormal .. +inf (bit patterns)
    with np.errstate(divide="ignore"):
        while lo < hi:
            mid = (lo + hi) // 2
            if float(np.log(np.uint32(mid).view(np.float32))) >= s:
                hi = mid
            else:
                lo = mid + 1
    return np.uint32(lo).view(np.float32)


def _spec(option: str, threshold: float) -> str:
    """A spec ``rcdiag analyze`` (and verl) parse back to exactly this threshold on the statistic; for a k1
    threshold too small for any decimal band to reach (below float32's step at 1, as on a dump whose log-ratios are
    all but zero), the band at 17 digits, whose bounds parse to the nearest log-thresholds verl can hold."""
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
    return f"{math.exp(-t):.17g}_{math.exp(t):.17g}"


def _float_spec(value: float) -> str:
    """The shortest decimal that verl's float() then float32 rounding turn back into this float32 value."""
    f = np.float32(value)
    short = np.format_float_positional(f, unique=True, trim="-")
    return short if np.float32(float(short)) == f else repr(float(f))


def verl_config(option: str, spec: str) -> dict[str, str]:
    """This option alone at this threshold, as verl's ``rollout_correction`` fields."""
    if option in IS_OPTIONS.values():
        return {"rollout_is": option.removeprefix("is_"), "rollout_is_threshold": spec}
    return {"rollout_rs": option, "rollout_rs_threshold": spec}


def verl_yaml(option: str, spec: str) -> str:
    """The lines to paste into verl's config for this option alone."""
    return rollout_correction_yaml(verl_config(option, spec))


def recommend(collector: Collector, target: float) -> list[Recommendation]:
    """A recommended threshold for every option the collector saw."""
    out = [choose(collector, option, target) for option in collector.options]
    return [r for r in out if r is not None]
