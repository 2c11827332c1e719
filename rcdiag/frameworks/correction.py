"""Every framework's correction in one vocabulary: what weight each valid token's loss carries, and which tokens or
responses it zeroes. Each framework reads its own settings into a ``Correction`` (``Settings.correction()``) and
declares the ``Form``s its options can write one in; ``rcdiag.frameworks.translate`` compares them.

With ``d = old - rollout`` per token (log pi_train/pi_rollout) and a response's valid tokens ``1..n``:

* a ``Weight`` is ``one`` (1), ``token`` (``e^d``, the token's own ratio), ``product`` (``e^(sum d)``, every
  token of the response the same), ``geomean`` (``e^(mean d)``) or ``segment`` (``e^(mean d)`` over each run of
  valid positions: ROLL's), clamped to ``[low, high]`` where given;
* a ``Band`` zeroes the token (a per-token statistic), the run (``segment_*``) or every token of the response (a
  per-response one) whose statistic lies outside ``[low, high]``. Per token: ``ratio`` (``e^d``; a bound on k1, k2
  or k3 of one token is a band on its ratio, ``ratio_band``), ``diff`` (``p_train - p_rollout``, in probability),
  ``token_k2``, ``token_k3`` and ``token_k3r`` where a lower bound makes them no band. Per response: ``product``,
  ``geomean``, ``max_ratio`` (``e^(max d)``), ``all_ratios`` (every token's ratio: a response with one outside is
  zeroed; an upper bound on the max of one token's k is such a band), ``mean_diff``, ``sum_diff``, ``mean_exp_abs``
  (the mean of ``e^|d|``: NeMo-RL's), and ``AGG_KIND`` for AGG in sum, mean, max and KIND ``k2`` (``d^2/2``), ``k3``
  (verl's ``e^d - 1 - d``) or ``k3r`` (``e^-d - 1 + d``: AReaL's ``kl_k3``, the KL in the other direction).

Bounds are normalised (a lower bound at or below 0 of a statistic that is never negative is no bound; an upper
bound on a band the weight is clamped inside makes the clamp nothing), so two frameworks' readings of the same rule
compare equal; each part keeps the source framework's own words (``label``) apart from what it means.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from rcdiag.core.limits import SAFETY_BOUND

Unit = Literal["one", "token", "product", "geomean", "segment"]
TOKEN_STATISTICS = ("ratio", "diff", "token_k2", "token_k3", "token_k3r")
"""Per-token statistics a band bounds (``ratio``, ``diff``, or a k estimate with a lower bound, which no ratio band
is)."""
SEGMENT_STATISTICS = ("segment_ratio", "segment_diff")
"""Statistics of a run of valid positions (ROLL's segments)."""
RATIO_LIKE = ("ratio", "product", "geomean", "max_ratio", "all_ratios", "segment_ratio")
"""Statistics that are ratios (positive)."""
SIGNED = ("diff", "mean_diff", "sum_diff", "segment_diff")
"""Statistics that can be negative (a probability difference): a lower bound below 0 still bounds."""
UNIT_STATISTIC: dict[str, str] = {
    "token": "ratio",
    "product": "product",
    "geomean": "geomean",
    "segment": "segment_ratio",
}
"""The statistic a weight of each unit is (a band on it is an IcePop-style mask of that weight)."""
REL = 1e-9
"""Two bounds are the same bound within this relative difference (a bound that went through log and exp)."""


@dataclass(frozen=True)
class Weight:
    """What a kept token's loss is multiplied by: its ``unit``, clamped to ``[low, high]`` where given."""

    unit: Unit
    low: float | None = None
    high: float | None = None
    label: str = field(default="", compare=False)
    """The framework's own words for it."""

    def normal(self) -> Weight:
        low = None if self.low is not None and self.low <= 0 else self.low
        high = None if self.high is not None and math.isinf(self.high) else self.high
        if self.unit == "one":
            low = high = None
        return replace(self, low=low, high=high)

    def same(self, other: Weight) -> bool:
        return self.unit == other.unit and _close(self.low, other.low) and _close(self.high, other.high)

    @property
    def clamped(self) -> bool:
        return self.low is not None or self.high is not None

    def describe(self) -> str:
        """``each token's own ratio, clamped from above at 2``."""
        text = UNIT_WORDS[self.unit]
        if self.high is not None and self.low is not None:
            return f"{text}, clamped to [{_g(self.low)}, {_g(self.high)}]"
        if self.high is not None:
            return f"{text}, clamped from above at {_g(self.high)}"
        if self.low is not None:
            return f"{text}, clamped from below at {_g(self.low)}"
        return text


UNIT_WORDS: dict[str, str] = {
    "one": "weight 1",
    "token": "each token's own ratio",
    "product": "the product of its response's ratios",
    "geomean": "its response's geometric-mean ratio",
    "segment": "the geometric-mean ratio of its run of valid tokens",
}


@dataclass(frozen=True)
class Band:
    """Zero the token (a per-token ``statistic``) or the whole response (a per-response one) outside ``[low, high]``."""

    statistic: str
    low: float | None = None
    high: float | None = None
    label: str = field(default="", compare=False)

    @property
    def scope(self) -> Literal["token", "run", "response"]:
        if self.statistic in TOKEN_STATISTICS:
            return "token"
        return "run" if self.statistic in SEGMENT_STATISTICS else "response"

    def normal(self) -> Band:
        low, high = self.low, self.high
        if low is not None and (math.isinf(low) or (low <= 0 and self.statistic not in SIGNED)):
            low = None
        if high is not None and math.isinf(high):
            high = None
        statistic = self.statistic
        kind = statistic.split("_", 1)[-1]
        if statistic.startswith("max_") and low is None and high is not None and kind in ("k2", "k3", "k3r"):
            # the largest k of a response at most U: every token's k at most U, a band on every token's ratio
            low, high = ratio_band(kind, high, clamp=None)
            statistic = "all_ratios"
        elif statistic == "max_ratio" and low is None:
            statistic = "all_ratios"  # the largest ratio at most U: every one
        return replace(self, statistic=statistic, low=low, high=high)

    def same(self, other: Band) -> bool:
        return self.statistic == other.statistic and _close(self.low, other.low) and _close(self.high, other.high)

    def describe(self) -> str:
        """``a token whose ratio is outside [0.5, 2]``."""
        what = STATISTIC_WORDS.get(self.statistic) or _agg_words(self.statistic)
        unit = {"token": "a token", "run": "a run of valid tokens", "response": "a response"}[self.scope]
        bound = _outside(self.low, self.high)
        if self.statistic == "all_ratios":
            return f"{unit} with any token ratio {bound}"
        return f"{unit} whose {what} is {bound}" if bound else f"no {unit.split()[1]} (no bound on its {what})"


STATISTIC_WORDS: dict[str, str] = {
    "ratio": "ratio pi_train/pi_rollout",
    "token_k2": "k2 = d^2/2",
    "token_k3": "k3 = e^d - 1 - d",
    "token_k3r": "e^-d - 1 + d (AReaL's kl_k3: the KL in the other direction from verl's k3)",
    "product": "product of ratios",
    "geomean": "geometric-mean ratio",
    "max_ratio": "largest token ratio",
    "all_ratios": "token ratios",
    "diff": "p_train - p_rollout (probabilities)",
    "mean_diff": "mean p_train - p_rollout",
    "sum_diff": "sum of p_train - p_rollout",
    "segment_ratio": "geometric-mean ratio (over the run)",
    "segment_diff": "mean p_train - p_rollout (over the run)",
    "mean_exp_abs": "mean of e^|d| (NeMo-RL's seq_mult_prob_error)",
}
KIND_WORDS = {
    "k2": "k2 = d^2/2",
    "k3": "k3 = e^d - 1 - d (verl's)",
    "k3r": "e^-d - 1 + d (AReaL's kl_k3: the KL in the other direction from verl's k3)",
}


def _agg_words(statistic: str) -> str:
    agg, _, kind = statistic.partition("_")
    return f"{agg} over its tokens of {KIND_WORDS.get(kind, kind)}"


@dataclass(frozen=True)
class Correction:
    """One framework's correction on a dump, in the shared vocabulary: the weight, the bands that zero, whether the
    weights are normalised to mean 1 over the batch, what the vocabulary cannot say (``other``: each is a part no
    other framework has), and how the framework's arithmetic differs in ways that matter only at the extremes
    (``quirks``: said where two corrections are otherwise the same)."""

    weight: Weight
    bands: tuple[Band, ...] = ()
    normalize: bool = False
    other: tuple[str, ...] = ()
    quirks: tuple[str, ...] = field(default=(), compare=False)

    def normal(self) -> Correction:
        bands = tuple(b for b in (b.normal() for b in self.bands) if b.low is not None or b.high is not None)
        weight = self.weight.normal()
        own = [b for b in bands if b.statistic == UNIT_STATISTIC.get(weight.unit)]
        if weight.high is not None and any(b.high is not None and b.high <= weight.high for b in own):
            weight = replace(weight, high=None)  # every kept weight is already at most the band's bound
        if weight.low is not None and any(b.low is not None and b.low >= weight.low for b in own):
            weight = replace(weight, low=None)
        quirks = self.quirks if weight.unit != "one" or bands else ()  # no correction: no arithmetic to differ in
        return replace(self, weight=weight, bands=bands, quirks=quirks)

    def same_bands(self, other: Correction) -> bool:
        mine, theirs = list(self.bands), list(other.bands)
        if len(mine) != len(theirs):
            return False
        for band in mine:
            match = next((i for i, b in enumerate(theirs) if band.same(b)), None)
            if match is None:
                return False
            theirs.pop(match)
        return True

    def same(self, other: Correction) -> bool:
        return (
            self.weight.same(other.weight)
            and self.same_bands(other)
            and self.normalize == other.normalize
            and not self.other
            and not other.other
        )

    def parts(self) -> list[Correction]:
        """The parts translated one by one, as the source wrote them: what shares one label (a weight and the mask
        its own option sets) is one part, each other band another (weight 1), then each thing the vocabulary cannot
        say."""
        groups: dict[str, list[Band]] = {self.weight.label: []}
        for i, band in enumerate(self.bands):
            groups.setdefault(band.label or f"#{i}", []).append(band)
        parts = []
        for label, bands in groups.items():
            if label == self.weight.label:
                if self.weight.unit != "one" or bands or (len(groups) == 1 and not self.other):
                    parts.append(Correction(self.weight, tuple(bands), self.normalize, quirks=self.quirks))
                continue
            parts.append(Correction(Weight("one"), tuple(bands), quirks=self.quirks))
        parts.extend(Correction(Weight("one"), other=(text,)) for text in self.other)
        return parts

    def label(self) -> str:
        """The part in its framework's own words (or in the shared vocabulary's)."""
        if self.other:
            return "; ".join(self.other)
        words = []
        if self.weight.unit != "one" or not self.bands:
            words.append(self.weight.label or self.weight.describe())
        words.extend(b.label or f"zero {b.describe()}" for b in self.bands)
        if self.normalize:
            words.append("weights normalised to mean 1 over the batch")
        return "; ".join(dict.fromkeys(words))

    def describe(self) -> str:
        """What the correction does, in the shared vocabulary."""
        if self.other:
            return "; ".join(self.other)
        text = self.weight.describe()
        if self.bands:
            text += ", 0 for " + " and for ".join(b.describe() for b in self.bands)
        return text + ("; normalised to mean 1 over the batch" if self.normalize else "")


# ------------------------------------------------------------------------------------------------ forms


Slot = Literal["none", "clamp", "band"]


@dataclass(frozen=True)
class Form:
    """One way a framework's options write a correction: a weight of ``unit``, and ``slot``: nothing more
    (``none``), a clamp of the weight (``clamp``) or a band on ``statistic`` (``band``), whose two bounds
    ``options(low, high)`` turns into the framework's options (``None`` where it cannot take them). The translation
    reads every candidate back through the framework's own settings, so a form says only where to put the bounds."""

    unit: Unit
    slot: Slot
    options: Callable[[float | None, float | None], dict[str, Any] | None]
    statistic: str = ""
    normalize: bool = False


def ratio_band(estimator: str, upper: float, clamp: float | None = SAFETY_BOUND) -> tuple[float, float]:
    """The ratio band ``[e^a, e^b]`` where one token's ``estimator`` of ``d`` (``k2`` = d^2/2, ``k3`` = e^d - 1 - d,
    ``k3r`` = e^-d - 1 + d) stays at or below ``upper``; with ``clamp``, ``d`` clamped to +-clamp first (verl)."""
    bound = clamp if clamp is not None else 700.0
    if estimator == "k2":
        root = min(math.sqrt(2.0 * upper), bound)
        return math.exp(-root), math.exp(root)

    def k3(d: float) -> float:
        return k_estimate(estimator, d)

    a = -bound if k3(-bound) <= upper else _bisect(k3, upper, 0.0, -bound)
    b = bound if k3(bound) <= upper else _bisect(k3, upper, 0.0, bound)
    return math.exp(a), math.exp(b)


def k_estimate(kind: str, d: float) -> float:
    """One token's ``k2`` (d^2/2), ``k3`` (e^d - 1 - d) or ``k3r`` (e^-d - 1 + d) of its log-ratio ``d``."""
    if kind == "k2":
        return d * d / 2.0
    return math.expm1(d) - d if kind == "k3" else math.expm1(-d) + d


def k_bound(kind: str, low: float | None, high: float | None) -> float | None:
    """The upper bound on one token's ``kind`` of k whose ratio band reaches both given ratio bounds (the wider
    side's: it keeps every ratio inside ``[low, high]``, and the narrower side's band is the k's own)."""
    reached = [k_estimate(kind, math.log(x)) for x in (low, high) if x is not None and x > 0]
    return float(f"{max(reached):.12g}") if reached else None


def _bisect(f: Callable[[float], float], level: float, inside: float, outside: float) -> float:
    """The point between ``inside`` (f <= level) and ``outside`` (f > level) where f crosses ``level``."""
    for _ in range(200):
        mid = (inside + outside) / 2
        if f(mid) <= level:
            inside = mid
        else:
            outside = mid
    return inside


def _outside(low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f"outside [{_g(low)}, {_g(high)}]"
    if high is not None:
        return f"above {_g(high)}"
    return "" if low is None else f"below {_g(low)}"


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=REL, abs_tol=0.0)


def _g(value: float) -> str:
    return f"{value:.6g}"


def family(statistic: str) -> str:
    """Statistics one band can stand in for another's, nearest, with the same bounds: k estimates aggregated alike
    (verl's k3 for AReaL's reversed k3, k2 for k3). Any other statistic is its own family: a bound on a product
    means nothing for a geometric mean (the two differ by the response's length)."""
    if statistic in ("token_k2", "token_k3", "token_k3r"):
        return "token_k"
    agg, _, kind = statistic.partition("_")
    if agg in ("sum", "mean", "max") and kind in ("k2", "k3", "k3r"):
        return "k:" + agg
    return statistic


def unit_family(unit: str) -> str:
    """Weights of one kind: none, per token, or per response or run (a product or a geometric mean)."""
    return {"product": "response", "geomean": "response", "segment": "response"}.get(unit, unit)


CLAMP_QUIRK = f"clamps each log-ratio at +-{SAFETY_BOUND:g} before exp (a difference only beyond e^+-{SAFETY_BOUND:g})"
"""verl's, SkyRL's and slime's MIS helper's arithmetic, said where it differs from the other side's."""


NO_CLAMP_QUIRK = "does not clamp the log-ratio"
"""TRL's, OpenRLHF's and slime's default TIS function's arithmetic."""


def within_clamp(band: Band, bound: float = SAFETY_BOUND) -> Band:
    """A ratio bound beyond a clamp of the log-ratio at +-``bound`` bounds nothing: no ratio gets there."""
    if band.statistic not in RATIO_LIKE:
        return band
    low = None if band.low is not None and band.low < math.exp(-bound) else band.low
    high = None if band.high is not None and band.high > math.exp(bound) else band.high
    return replace(band, low=low, high=high)
