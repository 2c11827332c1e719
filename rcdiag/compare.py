"""Two dumps through the same engine configuration, side by side, with a temperature-aware verdict.

Why temperature matters: with logit noise eps between the engines at sampling temperature T, the first-order
term cancels and ``kl ~ Var_pi(eps) / (2 T^2)``. So kl alone is not comparable across temperatures, but the
logit-noise estimate ``std(eps) ~ T * sqrt(2 kl)`` is. For 0.6 vs 1.0 the ideal kl ratio is (1.0/0.6)^2 = 2.78;
measured ratios are lower (about 2x) because a sharper distribution concentrates its mass and ``Var_pi(eps)``
shrinks. A side that left the temperature out of its log-probs shows kl of order 0.1-1 at T != 1, and a noise
estimate far from the other side's. Every finding code is documented in docs/compare.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rcdiag.api import analyze
from rcdiag.backend import Backend
from rcdiag.config import CorrectionConfig
from rcdiag.constants import DEFAULT_CHUNK_TOKENS
from rcdiag.errors import ConfigError, InputError
from rcdiag.io.base import ColumnMap
from rcdiag.report import SCHEMA_VERSION, Report, Severity

Side = Literal["a", "b"]
P = "rollout_corr/"
KL = P + "kl"
K3 = P + "k3_kl"
KL_SE = "rcdiag/kl_std_error"

TEMPERATURE_KEY = "temperature"
"""Dump metadata key holding the rollout sampling temperature."""
TRAIN_TEMPERATURE_KEY = "train_temperature"
"""Dump metadata key holding the temperature the trainer divided its logits by, when the dump records it."""

NOISE_RATIO_LIMIT = 3.0
"""Noise estimates further apart than this factor are not the same engine noise (kl differs by 9x)."""
TEMPERATURE_KL_LIMIT = 0.1
"""kl at or above this at T != 1 is the size a log-prob computed without the temperature gives (0.1-1)."""
SIGMAS = 2.0
"""Noise estimates carry a band from kl +- this many standard errors; "far apart" must hold across the bands."""
TREND_KEYS = (KL, K3, P + "chi2_token", P + "log_ppl_abs_diff", "rcdiag/abs_log_ratio_mean")

COMPARE_FINDING_CODES = (
    "temperature_kl_high",
    "temperature_noise_mismatch",
    "temperature_recorded_mismatch",
    "engine_noise_differs",
    "systematic_shift",
    "temperature_unknown",
    "noise_inconclusive",
    "noise_consistent",
)
"""Every code ``compare`` can give, in the order findings are listed (documented in docs/compare.md)."""


@dataclass(frozen=True)
class CompareFinding:
    """One verdict about the pair; ``side`` says which dump it is about (``None``: the pair as a whole)."""

    code: str
    severity: Severity
    message: str
    side: Side | None = None
    metric: str | None = None
    value: float | None = None
    threshold: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"value": _finite(self.value)}


@dataclass(frozen=True)
class MetricDiff:
    """One metric on both sides: ``difference`` is b - a, ``ratio`` is b / a (``None`` where undefined)."""

    key: str
    a: float | None
    b: float | None
    difference: float | None
    ratio: float | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class SideTemperature:
    """What one side's kl says about its logit noise, given its sampling temperature."""

    temperature: float | None
    source: Literal["option", "metadata"] | None
    train_temperature: float | None
    """From the dump's ``train_temperature`` metadata, when recorded."""
    kl: float | None
    k3_kl: float | None
    kl_std_error: float | None
    kl_t2: float | None
    """kl * T^2: constant across temperatures in the ideal case."""
    noise: float | None
    """T * sqrt(2 kl): the logit-noise estimate, comparable across temperatures (``None`` unless kl > 0)."""
    noise_low: float | None
    """T * sqrt(2 max(kl - 2 se, 0)): the low end of the estimate given kl's standard error."""
    noise_high: float | None
    """T * sqrt(2 (kl + 2 se)): the high end."""

    @property
    def noise_resolved(self) -> bool:
        """kl is more than ``SIGMAS`` standard errors above 0: the side's noise is measurably nonzero."""
        return bool(self.noise_low)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class TemperatureAnalysis:
    """Both sides' noise estimates and the kl ratio against the ideal 1/T^2 scaling."""

    a: SideTemperature
    b: SideTemperature
    kl_ratio: float | None
    """kl_a / kl_b as measured."""
    ideal_kl_ratio: float | None
    """(T_b / T_a)^2: kl_a / kl_b if the engines' logit noise were the same and Var_pi(eps) did not depend on T."""
    noise_ratio: float | None
    """noise_b / noise_a (both resolved)."""
    explanation: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": self.a.to_dict(),
            "b": self.b.to_dict(),
            "kl_ratio": self.kl_ratio,
            "ideal_kl_ratio": self.ideal_kl_ratio,
            "noise_ratio": self.noise_ratio,
            "explanation": list(self.explanation),
        }


@dataclass(frozen=True)
class StepPair:
    """One training step present in both dumps: every metric on both sides and b - a."""

    step: int
    metrics: tuple[MetricDiff, ...]

    def get(self, key: str) -> MetricDiff | None:
        return next((m for m in self.metrics if m.key == key), None)

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "metrics": [m.to_dict() for m in self.metrics]}


@dataclass(frozen=True)
class Comparison:
    """The result of ``compare``: both reports, the metric-by-metric diff, the temperature analysis, findings."""

    a: Report
    b: Report
    metrics: tuple[MetricDiff, ...]
    temperature: TemperatureAnalysis
    steps: tuple[StepPair, ...]
    """Steps present in both dumps, in step order."""
    unpaired_steps: dict[str, tuple[int, ...]]
    """Steps found in only one dump (``{"a": (...), "b": (...)}``): listed, never dropped silently."""
    trend: dict[str, float | None]
    """Least-squares slope of (b - a) per step over the paired steps, for the ``TREND_KEYS`` present."""
    findings: tuple[CompareFinding, ...]

    def metric(self, key: str) -> MetricDiff:
        """The row of one metric (full key)."""
        return next(m for m in self.metrics if m.key == key)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (schema in docs/compare.md)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "kind": "comparison",
            "a": self.a.to_dict(),
            "b": self.b.to_dict(),
            "metrics": [m.to_dict() for m in self.metrics],
            "temperature": self.temperature.to_dict(),
            "steps": [s.to_dict() for s in self.steps],
            "unpaired_steps": {side: list(steps) for side, steps in self.unpaired_steps.items()},
            "trend": self.trend,
            "findings": [f.to_dict() for f in self.findings],
        }


def compare(
    path_a: str | Path,
    path_b: str | Path,
    config: CorrectionConfig | None = None,
    *,
    temperature_a: float | None = None,
    temperature_b: float | None = None,
    device: str | Backend = "cpu",
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    columns: ColumnMap | None = None,
    on_bad_row: str = "error",
    workers: int = 1,
) -> Comparison:
    """Analyse both dumps with ``config`` and compare them.

    Temperatures given here override the dumps' ``temperature`` metadata. ``columns``, ``on_bad_row`` and
    ``workers`` are passed to ``rcdiag.analyze`` for both dumps. Raises ``ConfigError`` for a bad temperature and
    the errors of ``rcdiag.analyze`` for bad inputs.
    """
    for name, value in (("temperature_a", temperature_a), ("temperature_b", temperature_b)):
        _check_temperature(value, name)
    config = config or CorrectionConfig()
    config.resolve()
    read = {
        "device": device,
        "chunk_tokens": chunk_tokens,
        "columns": columns,
        "on_bad_row": on_bad_row,
        "workers": workers,
    }
    report_a = analyze(path_a, config, **read)
    report_b = analyze(path_b, config, **read)
    return compare_reports(report_a, report_b, temperature_a=temperature_a, temperature_b=temperature_b)


def compare_reports(
    a: Report, b: Report, *, temperature_a: float | None = None, temperature_b: float | None = None
) -> Comparison:
    """``compare`` over two reports you already have (same engine configuration)."""
    if a.config != b.config:
        raise ConfigError("the two reports were computed with different engine configurations; compare needs one.")
    temperature = _temperature_analysis(
        _side(a, temperature_a, "--temperature-a"), _side(b, temperature_b, "--temperature-b")
    )
    steps_a = {s.step: s for s in a.steps}
    steps_b = {s.step: s for s in b.steps}
    paired = sorted(steps_a.keys() & steps_b.keys())
    pairs = tuple(
        StepPair(
            step, _diffs(steps_a[step].metrics | steps_a[step].extras, steps_b[step].metrics | steps_b[step].extras)
        )
        for step in paired
    )
    return Comparison(
        a=a,
        b=b,
        metrics=_diffs(a.metrics | a.extras, b.metrics | b.extras),
        temperature=temperature,
        steps=pairs,
        unpaired_steps={
            "a": tuple(sorted(steps_a.keys() - steps_b.keys())),
            "b": tuple(sorted(steps_b.keys() - steps_a.keys())),
        },
        trend={key: _slope(pairs, key) for key in TREND_KEYS if key in a.metrics or key in a.extras},
        findings=tuple(_findings(a, b, temperature)),
    )


# ----------------------------------------------------------------------------------------------- temperature


def _check_temperature(value: float | None, name: str) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{name} must be a positive number, got {value}.")


def _metadata_temperature(report: Report, key: str, option: str) -> float | None:
    text = report.input.metadata.get(key)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise InputError(
            f"metadata '{key}' is {text!r}, not a positive number; pass {option} to give the temperature",
            path=report.input.path,
        )
    return value


def _side(report: Report, given: float | None, option: str) -> SideTemperature:
    recorded = _metadata_temperature(report, TEMPERATURE_KEY, option) if given is None else None
    temperature = given if given is not None else recorded
    source: Literal["option", "metadata"] | None = "option" if given is not None else "metadata" if recorded else None
    kl = report.metrics.get(KL)
    se = report.extras.get(KL_SE) or 0.0

    def estimate(value: float | None) -> float | None:
        return temperature * math.sqrt(2.0 * max(value, 0.0)) if value is not None and temperature else None

    return SideTemperature(
        temperature=temperature,
        source=source,
        train_temperature=_metadata_temperature(report, TRAIN_TEMPERATURE_KEY, option),
        kl=kl,
        k3_kl=report.metrics.get(K3),
        kl_std_error=se,
        kl_t2=kl * temperature**2 if kl is not None and temperature is not None else None,
        noise=estimate(kl) if kl is not None and kl > 0 else None,
        noise_low=estimate(kl - SIGMAS * se) if kl is not None else None,
        noise_high=estimate(kl + SIGMAS * se) if kl is not None else None,
    )


def _temperature_analysis(a: SideTemperature, b: SideTemperature) -> TemperatureAnalysis:
    kl_ratio = a.kl / b.kl if a.kl is not None and b.kl is not None and b.kl > 0 and a.kl > 0 else None
    ideal = (b.temperature / a.temperature) ** 2 if a.temperature and b.temperature else None
    noise_ratio = b.noise / a.noise if a.noise and b.noise else None
    lines: list[str] = []
    if ideal is None:
        missing = " and ".join(s for s, t in (("a", a), ("b", b)) if t.temperature is None)
        lines.append(
            f"The temperature of side {missing} is unknown (no --temperature-{missing[0]} and no 'temperature' in "
            "the dump's metadata), so kl cannot be turned into a logit-noise estimate."
        )
        return TemperatureAnalysis(a, b, kl_ratio, None, None, tuple(lines))
    assert a.temperature is not None
    assert b.temperature is not None
    lines.append(
        f"kl is second order in the logit error eps and grows as 1/T^2: kl ~ Var(eps)/(2 T^2). "
        f"kl*T^2 is {_g(a.kl_t2)} on side a (T={a.temperature:g}) and {_g(b.kl_t2)} on side b "
        f"(T={b.temperature:g}); ideally these are equal."
    )
    if a.temperature != b.temperature:
        measured = f"{kl_ratio:.3g}x" if kl_ratio is not None else "undefined (a kl is not positive)"
        text = f"From the temperatures alone, kl_a/kl_b would be (T_b/T_a)^2 = {ideal:.3g}x; measured: {measured}. "
        if kl_ratio is not None and min(1.0, ideal) / NOISE_RATIO_LIMIT <= kl_ratio <= max(1.0, ideal) * 1.5:
            text += (
                "The ideal overstates reality: at lower temperature the distribution is sharper, its mass sits on "
                "fewer tokens and Var_pi(eps) shrinks, so the measured ratio usually lies between 1x and the ideal "
                "(about 2x instead of 2.78x for 0.6 vs 1.0)."
            )
        else:
            text += (
                "That is far outside what temperature explains (between 1x and the ideal, since a sharper "
                "distribution shrinks Var_pi(eps)); the noise estimates below say which side moved."
            )
        lines.append(text)
    if a.noise is not None and b.noise is not None:
        lines.append(
            f"Logit-noise estimate T*sqrt(2 kl), comparable across temperatures: {a.noise:.3g} (a) vs "
            f"{b.noise:.3g} (b), b/a = {noise_ratio:.3g}. Within {NOISE_RATIO_LIMIT:g}x means the same size of "
            f"engine noise; further apart, across kl +- {SIGMAS:g} standard errors, means it is not."
        )
    return TemperatureAnalysis(a, b, kl_ratio, ideal, noise_ratio, tuple(lines))


# ---------------------------------------------------------------------------------------------------- findings


def _findings(a: Report, b: Report, t: TemperatureAnalysis) -> list[CompareFinding]:
    findings: list[CompareFinding] = []
    sides: dict[Side, tuple[Report, SideTemperature]] = {"a": (a, t.a), "b": (b, t.b)}
    for side, (report, st) in sides.items():
        findings.extend(_side_findings(side, report, st))
    shifted = {f.side for f in findings if f.code == "systematic_shift"}
    findings.extend(_noise_findings(t, shifted))
    problems = [f for f in findings if f.severity != "info"]
    if not problems and t.noise_ratio is not None and 1 / NOISE_RATIO_LIMIT < t.noise_ratio < NOISE_RATIO_LIMIT:
        findings.append(_consistent(t))
    order = {code: i for i, code in enumerate(COMPARE_FINDING_CODES)}
    rank = {"error": 0, "warning": 1, "info": 2}
    findings.sort(key=lambda f: (rank[f.severity], order[f.code], f.side or ""))
    return findings


def _side_findings(side: Side, report: Report, st: SideTemperature) -> list[CompareFinding]:
    out: list[CompareFinding] = []
    other = "b" if side == "a" else "a"
    if st.temperature is None:
        out.append(
            CompareFinding(
                "temperature_unknown",
                "info",
                f"side {side}'s sampling temperature is unknown: pass --temperature-{side} (or write 'temperature' "
                "into the dump's metadata) to get the temperature analysis for it.",
                side,
            )
        )
    elif st.kl is not None and st.kl >= TEMPERATURE_KL_LIMIT and st.temperature != 1.0:
        agree = st.k3_kl is not None and abs(st.kl - st.k3_kl) <= 0.5 * max(abs(st.kl), abs(st.k3_kl))
        shape = (
            "kl and k3_kl agree, as they do when one side's distribution is a re-tempered but still normalised "
            "copy of the other's"
            if agree
            else "kl and k3_kl also disagree, so part of it is a systematic shift"
        )
        out.append(
            CompareFinding(
                "temperature_kl_high",
                "warning",
                f"side {side}: kl = {st.kl:.3g} at T={st.temperature:g}. Numerical engine noise gives kl of "
                f"1e-5..1e-2; kl of order {TEMPERATURE_KL_LIMIT:g}-1 at T != 1 is what log-probs computed without "
                f"the temperature on one side give ({shape}). Check that the trainer divides its logits by the "
                "rollout temperature before log_softmax, and that the rollout engine reports log-probs after "
                "temperature scaling.",
                side,
                KL,
                st.kl,
                TEMPERATURE_KL_LIMIT,
            )
        )
    recorded = st.source == "metadata" and st.train_temperature is not None
    if recorded and st.train_temperature != st.temperature:
        out.append(
            CompareFinding(
                "temperature_recorded_mismatch",
                "warning",
                f"side {side}'s dump records a rollout temperature of {st.temperature:g} but a trainer temperature "
                f"of {st.train_temperature:g}: its old_log_prob is not from the distribution the tokens were "
                "sampled from.",
                side,
                None,
                st.train_temperature,
                st.temperature,
            )
        )
    shift = next((f for f in report.findings if f.code == "kl_k3_disagree"), None)
    if shift is not None:
        out.append(
            CompareFinding(
                "systematic_shift",
                "warning",
                f"side {side}: kl ({_g(st.kl)}) and k3_kl ({_g(st.k3_kl)}) disagree, so its mismatch is not "
                "small noise and its noise estimate T*sqrt(2 kl) does not hold (the second-order expansion "
                f"behind it assumes they agree). The cause is on side {side}'s log-prob plumbing, not something "
                f"side {other} shares: top-k/top-p renormalised on one engine only, a constant offset, or "
                "shifted positions. analyze's finding: " + shift.message,
                side,
                KL,
                shift.value,
                shift.threshold if isinstance(shift.threshold, float) else None,
            )
        )
    return out


def _noise_findings(t: TemperatureAnalysis, shifted: set[Side | None]) -> list[CompareFinding]:
    """The noise comparison on the point estimates; where the quieter side's kl is within ``SIGMAS`` standard
    errors of 0, "far apart" must also hold against the high end of its band. Silent for a side with a systematic
    shift, where the estimate does not hold."""
    a, b = t.a, t.b
    if a.noise_high is None or b.noise_high is None:
        return []  # a temperature or kl is unknown
    side: Side = "b" if (b.noise or 0.0) >= (a.noise or 0.0) else "a"
    noisy, quiet = (b, a) if side == "b" else (a, b)
    other = "a" if side == "b" else "b"
    if side in shifted or not noisy.noise:
        return []
    point = noisy.noise / quiet.noise if quiet.noise else math.inf
    if point < NOISE_RATIO_LIMIT:
        return []
    assert noisy.temperature is not None
    worst_case = noisy.noise / quiet.noise_high if quiet.noise_high else math.inf
    quiet_text = f"{quiet.noise:.3g}" if quiet.noise else "none measurable (kl <= 0)"
    numbers = (
        f"side {side}'s logit-noise estimate T*sqrt(2 kl) is {noisy.noise:.3g} against {quiet_text} on side {other}"
    )
    if not quiet.noise_resolved and worst_case < NOISE_RATIO_LIMIT:
        return [
            CompareFinding(
                "noise_inconclusive",
                "info",
                f"{numbers}: {point:.3g}x apart, but side {other}'s kl ({_g(quiet.kl)}) is within {SIGMAS:g} "
                f"standard errors ({_g(quiet.kl_std_error)}) of 0, and at the high end of its band the two are "
                f"{worst_case:.3g}x apart, within {NOISE_RATIO_LIMIT:g}x. Compare larger dumps (more responses) "
                "for a verdict.",
                side,
                KL,
                point,
                NOISE_RATIO_LIMIT,
            )
        ]
    apart = f"{point:.3g}x apart" if quiet.noise else "apart"
    if noisy.temperature != 1.0 and quiet.noise:
        return [
            CompareFinding(
                "temperature_noise_mismatch",
                "warning",
                f"{numbers}: {apart} (limit {NOISE_RATIO_LIMIT:g}x). Temperature cannot explain this, because the "
                f"estimate already corrects for it; at T={noisy.temperature:g} the likely cause is temperature "
                f"handling on side {side}: log-probs taken before or without dividing by T on one engine, or a "
                f"different T on each. If the temperature is handled identically, side {side}'s engines are "
                "simply noisier (another kernel, dtype or parallel layout).",
                side,
                KL,
                noisy.noise,
                NOISE_RATIO_LIMIT,
            )
        ]
    if noisy.temperature == 1.0:
        why = "At T=1 the temperature cannot be the cause (dividing by 1 changes nothing), so"
    else:
        why = f"Side {other} shows no measurable noise (kl <= 0: bitwise-equal engines?), so"
    return [
        CompareFinding(
            "engine_noise_differs",
            "warning",
            f"{numbers}: {apart} (limit {NOISE_RATIO_LIMIT:g}x). {why} side {side}'s two engines disagree more: "
            "another kernel, dtype, parallel layout, engine version or checkpoint.",
            side,
            KL,
            noisy.noise,
            NOISE_RATIO_LIMIT,
        )
    ]


def _consistent(t: TemperatureAnalysis) -> CompareFinding:
    assert t.a.noise is not None
    assert t.b.noise is not None
    assert t.noise_ratio is not None
    message = (
        f"engine noise is consistent across the two runs: logit-noise estimates {t.a.noise:.3g} (a) and "
        f"{t.b.noise:.3g} (b), ratio {t.noise_ratio:.3g}, within {NOISE_RATIO_LIMIT:g}x."
    )
    rough = [side for side, st in (("a", t.a), ("b", t.b)) if not st.noise_resolved]
    if rough:
        message += (
            f" (Side {' and '.join(rough)}'s kl is within {SIGMAS:g} standard errors of 0, so its estimate is rough.)"
        )
    if t.a.temperature != t.b.temperature and t.kl_ratio is not None and t.ideal_kl_ratio is not None:
        message += (
            f" The kl difference (kl_a/kl_b = {t.kl_ratio:.3g}) comes from the temperatures "
            f"({t.a.temperature:g} vs {t.b.temperature:g}; ideal {t.ideal_kl_ratio:.3g}x, usually less because a "
            "sharper distribution shrinks Var_pi(eps)), not from a change in the engines."
        )
    return CompareFinding("noise_consistent", "info", message, None, KL, t.noise_ratio, NOISE_RATIO_LIMIT)


# ------------------------------------------------------------------------------------------------------ helpers


def _diffs(a: Mapping[str, float | None], b: Mapping[str, float | None]) -> tuple[MetricDiff, ...]:
    keys = list(a) + [k for k in b if k not in a]
    return tuple(_diff(key, a.get(key), b.get(key)) for key in keys)


def _diff(key: str, a: float | None, b: float | None) -> MetricDiff:
    difference = b - a if a is not None and b is not None else None
    ratio = b / a if a is not None and b is not None and a != 0 else None
    return MetricDiff(key, a, b, _finite(difference), _finite(ratio))


def _slope(pairs: tuple[StepPair, ...], key: str) -> float | None:
    points = [(p.step, d.difference) for p in pairs if (d := p.get(key)) is not None and d.difference is not None]
    if len(points) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx > 0 else None


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _g(value: float | None) -> str:
    return "null" if value is None else f"{value:.3g}"
