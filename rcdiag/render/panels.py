"""What the pictures show, without drawing anything: the six trend panels of the seed guide's dashboard (IS mean,
ESS, RS rejected share, kl vs k3_kl, PPL ratio, chi2), each panel's series over steps and its warning lines; the
verdict's colours and measured effect; and, for a dump without steps, what varies inside it (IS weight tails).

Warning lines are read from the metric catalogue (every threshold that gives a finding), never restated here;
a panel's ``ideal`` is where its metric says "no mismatch". Imports no plotting library.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rcdiag.catalogue import metric, short_key
from rcdiag.catalogue.keys import Key
from rcdiag.catalogue.metrics import GROUP_NEEDS, rs_option
from rcdiag.records.report import Effect, FrameworkEffect, Histogram, Report
from rcdiag.settings.correction import SAFETY_BOUND, parse_is_threshold

MAX_POINTS = 1500
"""A series longer than this is drawn as the minimum and maximum of each of ``MAX_POINTS // 2`` runs of steps, so
a picture's size does not grow with the run's length and no spike is lost."""


@dataclass(frozen=True)
class WarnLine:
    """A horizontal line at ``value``: the bound of a health check (``finding`` fires beyond it)."""

    value: float
    label: str
    finding: str
    source: str = "verl"
    """Whose threshold it is: ``verl`` (its documented health bounds) or ``rcdiag`` (rcdiag's own checks)."""


@dataclass(frozen=True)
class Panel:
    """One trend chart: ``keys`` (full metric keys) over steps."""

    title: str
    keys: tuple[str, ...]
    ideal: float | None = None
    per_rs_option: bool = False
    """Also draw every RS option's own ``masked_fraction`` (when there are several)."""

    def warnings(self) -> list[WarnLine]:
        out: list[WarnLine] = []
        for key in self.keys:
            spec = metric(key)
            assert spec is not None, key
            for threshold in spec.thresholds:
                if threshold.finding is None:
                    continue
                bounds = threshold.bounds if threshold.kind == "range" else (threshold.limit,)
                if threshold.kind == "max_abs":
                    bounds = (-threshold.limit, threshold.limit)
                rule = threshold.describe(spec.short)
                source = "verl" if "verl" in threshold.packs else "rcdiag"
                out.extend(WarnLine(bound, rule, threshold.finding, source) for bound in bounds)
        return out

    def needs(self) -> str:
        """Why the panel may be empty: what computes its metrics."""
        spec = metric(self.keys[0])
        assert spec is not None
        return spec.how_to_compute() if spec.needs else GROUP_NEEDS[spec.group]


TRENDS: tuple[Panel, ...] = (
    Panel("IS weight mean", (Key.ROLLOUT_IS_MEAN,), ideal=1.0),
    Panel("Effective sample size", (Key.ROLLOUT_IS_EFF_SAMPLE_SIZE,)),
    Panel("RS rejected share of tokens", (Key.ROLLOUT_RS_MASKED_FRACTION,), per_rs_option=True),
    Panel("KL: kl vs k3_kl", (Key.KL, Key.K3_KL), ideal=0.0),
    Panel("PPL ratio (train / rollout)", (Key.PPL_RATIO,), ideal=1.0),
    Panel("Chi-square divergence", (Key.CHI2_TOKEN, Key.CHI2_SEQ)),
)
"""The dashboard, in the seed's 2x3 order (its empty slot holds the RS rejected share)."""


@dataclass(frozen=True)
class Series:
    """One line: ``label`` and its points (step, value); ``None`` values are gaps."""

    key: str
    label: str
    steps: tuple[float, ...]
    values: tuple[float | None, ...]

    @property
    def present(self) -> bool:
        return any(v is not None for v in self.values)


def panel_keys(panel: Panel, report: Report) -> list[str]:
    """The keys the panel draws for this report (RS options as the configuration has them); none when the
    configuration does not compute the panel's metrics."""
    keys = [k for k in panel.keys if k in report.metrics]
    if panel.per_rs_option:
        options = [k for k in report.metrics if rs_option(k) is not None and k.endswith("_masked_fraction")]
        options = [k for k in options if not k.endswith("_seq_masked_fraction")]
        keys += options if len(options) > 1 else []  # one option's share is the combined share
    return keys


def series(report: Report, key: str, label: str | None = None) -> Series:
    """``key`` over the report's steps; a dump without steps is one point at step 0 (the whole dump)."""
    name = label or short_key(key)
    if not report.steps:
        value = report.metrics.get(key)
        return Series(key, name, (0.0,), (value,))
    steps = [float(s.step) for s in report.steps]
    values = [s.metrics.get(key) for s in report.steps]
    steps, values = thinned(steps, values, MAX_POINTS)
    return Series(key, name, tuple(steps), tuple(values))


def thinned(steps: list[float], values: list[float | None], most: int) -> tuple[list[float], list[float | None]]:
    """At most ``most`` points: each run of steps keeps its lowest and highest value, in step order (a run
    without a finite value is one gap)."""
    if len(steps) <= most:
        return steps, values
    runs = max(most // 2, 1)
    out_steps: list[float] = []
    out_values: list[float | None] = []
    for i in range(runs):
        a, b = i * len(steps) // runs, (i + 1) * len(steps) // runs
        present = {j: v for j in range(a, b) if (v := values[j]) is not None and math.isfinite(v)}
        kept = sorted({min(present, key=present.__getitem__), max(present, key=present.__getitem__)}) if present else []
        out_steps += [steps[j] for j in kept] or [steps[a]]
        out_values += [values[j] for j in kept] or [None]
    return out_steps, out_values


def sparkline(values: list[float | None], width: int = 12, floor: float | None = None) -> str:
    """``▁▃▅█``: values scaled between their minimum (or ``floor``, e.g. 0 for shares) and maximum, at most
    ``width`` characters (each the mean of its run of values); a gap is a space."""
    bars = "▁▂▃▄▅▆▇█"
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return ""
    runs = min(width, len(values))
    cells: list[float | None] = []
    for i in range(runs):
        run = [v for v in values[i * len(values) // runs : (i + 1) * len(values) // runs] if v is not None]
        run = [v for v in run if math.isfinite(v)]
        cells.append(sum(run) / len(run) if run else None)
    lo, hi = min(finite) if floor is None else floor, max(finite)
    span = hi - lo
    out = []
    for cell in cells:
        if cell is None:
            out.append(" ")
        elif span <= 0 or not math.isfinite(span):
            out.append(bars[0])
        else:
            out.append(bars[min(int((cell - lo) / span * len(bars)), len(bars) - 1)])
    return "".join(out)


# ------------------------------------------------------------------------------------------------ the verdict

STATUS_COLOURS: dict[str, str] = {
    "identical": "#0969da",
    "healthy": "#1a7f37",
    "correct": "#b08800",
    "fix": "#e16f24",
    "broken": "#cf222e",
}
"""The verdict badge's colour per status (blue, green, amber, orange, red), in the HTML report and the PNG
dashboard."""


def effect_facts(effect: Effect) -> list[tuple[str, str]]:
    """The prescription's measured effect on this dump, as (what, value) pairs; IS numbers only where IS applies."""
    facts = [
        ("tokens rejected", _share(effect.tokens_rejected)),
        ("responses rejected", _share(effect.responses_rejected)),
    ]
    if effect.is_ess is not None:
        facts.append(("IS effective sample size", f"{effect.is_ess:.3g}"))
    if effect.is_truncated_share is not None:
        facts.append(("IS weights truncated", _share(effect.is_truncated_share)))
    return facts


def framework_effect_facts(effect: FrameworkEffect) -> list[tuple[str, str]]:
    """A framework setting's measured effect (``--as NAME``), as (what, value) pairs."""
    return [
        ("weight mean", "—" if effect.weight_mean is None else f"{effect.weight_mean:.4g}"),
        ("tokens zeroed", _share(effect.tokens_zeroed)),
        ("responses with a token zeroed", _share(effect.responses_zeroed)),
        ("weights truncated", _share(effect.weights_truncated)),
        ("ESS of the weights", "—" if effect.ess is None else f"{effect.ess:.3g}"),
    ]


def _share(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    return f"{value:.3g} ({100 * value:.3g}%)"


# ------------------------------------------------------------------------------------- inside a dump (no steps)


@dataclass(frozen=True)
class WeightSetting:
    """The IS setting whose weights a picture shows: the prescription's when it has IS, else the configured one."""

    source: str
    """``prescription`` or ``configuration``."""
    level: str
    """``token`` or ``sequence``."""
    upper: float
    lower: float | None
    """IcePop's lower bound (weights outside [lower, upper] are zeroed); ``None``: TIS (weights above are capped)."""
    beyond: float | None
    """Measured share of tokens (token level) or responses (sequence level) whose weight lies beyond ``upper``."""
    ess: float | None

    @property
    def label(self) -> str:
        bounds = f"[{self.lower:g}, {self.upper:g}]" if self.lower is not None else f"≤ {self.upper:g}"
        return f"{self.source}: rollout_is {self.level}, threshold {bounds}"


def weight_setting(report: Report) -> WeightSetting | None:
    """The IS setting to draw: the verdict's prescription when it sets ``rollout_is``, else ``--is``; ``None``
    when neither applies IS."""
    verdict = report.verdict
    rec = verdict.recommendation if verdict is not None else None
    if rec is not None and rec.config.rollout_is and rec.config.rollout_is_threshold is not None:
        upper, lower = parse_is_threshold(rec.config.rollout_is_threshold)
        effect = rec.effect
        beyond, ess = (effect.is_truncated_share, effect.is_ess) if effect is not None else (None, None)
        return WeightSetting("prescription", rec.config.rollout_is, upper, lower, beyond, ess)
    spec = report.config.is_spec
    if spec is None:
        return None
    return WeightSetting("configuration", spec.level, spec.upper, spec.lower,
                         report.metrics.get(Key.ROLLOUT_IS_RATIO_FRACTION_HIGH),
                         report.metrics.get(Key.ROLLOUT_IS_EFF_SAMPLE_SIZE))  # fmt: skip


def weight_tails(histogram: Histogram) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """Token IS weights ``w = exp(log-ratio)`` (verl clamps the log-ratio to ±SAFETY_BOUND first) from the log-ratio
    histogram, exact at its bin edges: the upper tail ``(x, share of tokens with w >= x)`` for x > 1 and the lower
    tail ``(x, share with w < x)`` for x < 1. Weights beyond the clamp count at e^±SAFETY_BOUND."""
    total = sum(histogram.counts)
    if total == 0:
        return [], []
    upper, lower = [], []
    for j, edge in enumerate(histogram.edges):
        if 0 < edge <= SAFETY_BOUND:
            upper.append((math.exp(edge), sum(histogram.counts[j + 1 :]) / total))
        elif -SAFETY_BOUND <= edge < 0:
            lower.append((math.exp(edge), sum(histogram.counts[: j + 1]) / total))
    return upper, lower
