"""Each side's logit-noise estimate from its kl and sampling temperature, and the kl ratio against 1/T^2.

kl alone is not comparable across temperatures (``kl ~ Var_pi(eps) / (2 T^2)``), but ``T * sqrt(2 kl)`` is;
this module turns kl (with its standard error) into that estimate and explains the comparison in words.
"""

from __future__ import annotations

import math
from typing import Literal

from rcdiag.compare.records import K3, KL, KL_SE, SideTemperature, TemperatureAnalysis
from rcdiag.records.report import Report
from rcdiag.runtime.errors import InputError
from rcdiag.runtime.option_checks import positive
from rcdiag.settings.constants import TEMPERATURE_KEY, TRAIN_TEMPERATURE_KEY

NOISE_RATIO_LIMIT = 3.0
"""Noise estimates further apart than this factor are not the same engine noise (kl differs by 9x)."""
SIGMAS = 2.0
"""Noise estimates carry a band from kl +- this many standard errors; "far apart" must hold across the bands."""
TEMPERATURE = positive()
"""What a given temperature takes (``rcdiag.runtime.option_checks``)."""
ASSUMED_TEMPERATURE = 1.0
"""The temperature taken on both sides when neither dump records one: equal temperatures are assumed, and the
noise ratio and every verdict are the same for any common value."""


def check_temperature(value: float | None, name: str) -> None:
    """A given temperature must be a positive finite number; ``name`` is how the caller spelled it (the library's
    ``temperature_a``, the CLI's ``--temperature-a``)."""
    if value is not None:
        TEMPERATURE(value, name)


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


def _sides(
    a: Report, b: Report, temperature_a: float | None, temperature_b: float | None
) -> tuple[SideTemperature, SideTemperature]:
    """Both sides' temperatures; when neither dump records one (and no option gives one), equal temperatures are
    assumed (``ASSUMED_TEMPERATURE``), so the noise verdicts still run."""
    side_a, side_b = _side(a, temperature_a, "--temperature-a"), _side(b, temperature_b, "--temperature-b")
    if side_a.temperature is None and side_b.temperature is None:
        side_a = _side(a, temperature_a, "--temperature-a", assume=ASSUMED_TEMPERATURE)
        side_b = _side(b, temperature_b, "--temperature-b", assume=ASSUMED_TEMPERATURE)
    return side_a, side_b


def _side(report: Report, given: float | None, option: str, *, assume: float | None = None) -> SideTemperature:
    if given is None:
        recorded = _metadata_temperature(report, TEMPERATURE_KEY, option)
    else:  # the option wins; a recorded value that disagrees is reported, one that is unreadable is ignored
        try:
            recorded = _metadata_temperature(report, TEMPERATURE_KEY, option)
        except InputError:
            recorded = None
    temperature = given if given is not None else recorded if recorded is not None else assume
    source: Literal["option", "metadata", "assumed"] | None = (
        "option" if given is not None else "metadata" if recorded else "assumed" if assume is not None else None
    )
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
        recorded_temperature=recorded,
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
    if a.source == "assumed" and b.source == "assumed":
        lines.append(
            "Neither dump records its sampling temperature (no --temperature-a/-b, no 'temperature' metadata), so "
            f"the analysis assumes the two are equal (T={ASSUMED_TEMPERATURE:g} on both; the noise ratio and the "
            "verdicts do not depend on the common value). If they differ, pass --temperature-a and --temperature-b."
        )
    explained = _explained(a, b, ideal) if a.temperature != b.temperature else None
    lines.append(
        f"kl is second order in the logit error eps and grows as 1/T^2: kl ~ Var(eps)/(2 T^2). "
        f"kl*T^2 is {_g(a.kl_t2)} on side a (T={a.temperature:g}) and {_g(b.kl_t2)} on side b "
        f"(T={b.temperature:g}); ideally these are equal."
    )
    if a.temperature != b.temperature:
        measured = f"{kl_ratio:.3g}x" if kl_ratio is not None else "undefined (a kl is not positive)"
        text = f"From the temperatures alone, kl_a/kl_b would be (T_b/T_a)^2 = {ideal:.3g}x; measured: {measured}. "
        if explained:
            text += (
                "That is within what the temperatures explain: the ideal overstates reality, because at lower "
                "temperature the distribution is sharper, its mass sits on fewer tokens and Var_pi(eps) shrinks, so "
                "the measured ratio usually lies between 1x and the ideal (about 2x instead of 2.78x for 0.6 vs 1.0)."
            )
        else:
            text += (
                f"That lies outside what the temperatures can explain (between 1x and {ideal:.3g}x, even with kl "
                f"+- {SIGMAS:g} standard errors){_opposite(a, b, ideal)}, so the temperatures do not account for the "
                "kl difference: the engines (or their temperature handling) differ; the noise estimates below say "
                "which side moved."
            )
        lines.append(text)
    if a.noise is not None and b.noise is not None:
        lines.append(
            f"Logit-noise estimate T*sqrt(2 kl), comparable across temperatures: {a.noise:.3g} (a) vs "
            f"{b.noise:.3g} (b), b/a = {noise_ratio:.3g}. Within {NOISE_RATIO_LIMIT:g}x means the same size of "
            f"engine noise; further apart, across kl +- {SIGMAS:g} standard errors, means it is not."
        )
    return TemperatureAnalysis(a, b, kl_ratio, ideal, noise_ratio, tuple(lines), explained)


def _explained(a: SideTemperature, b: SideTemperature, ideal: float) -> bool:
    """Whether kl_a/kl_b, with each kl moved by up to ``SIGMAS`` standard errors, reaches the range between 1x
    and the ideal ratio (T_b/T_a)^2: the only ratios a change of temperature alone can give."""
    if a.kl is None or b.kl is None:
        return False
    low_a, high_a = a.kl - SIGMAS * (a.kl_std_error or 0.0), a.kl + SIGMAS * (a.kl_std_error or 0.0)
    low_b, high_b = b.kl - SIGMAS * (b.kl_std_error or 0.0), b.kl + SIGMAS * (b.kl_std_error or 0.0)
    if high_a <= 0 or high_b <= 0:
        return False
    smallest = max(low_a, 0.0) / high_b
    largest = high_a / low_b if low_b > 0 else math.inf
    return smallest <= max(1.0, ideal) and largest >= min(1.0, ideal)


def _opposite(a: SideTemperature, b: SideTemperature, ideal: float) -> str:
    """ ", and in the opposite direction: ..." when the side the temperatures say should have the larger kl has the
    smaller one."""
    if a.kl is None or b.kl is None or a.temperature is None or b.temperature is None:
        return ""
    if (ideal > 1) == (a.kl > b.kl):
        return ""
    high, low = ("a", "b") if a.temperature > b.temperature else ("b", "a")
    return (
        f", and in the opposite direction: side {high} has the larger kl although its temperature is the higher "
        f"({max(a.temperature, b.temperature):g} against {min(a.temperature, b.temperature):g} on side {low}), "
        "while kl grows as the temperature falls"
    )


def _g(value: float | None) -> str:
    return "null" if value is None else f"{value:.3g}"
