"""The verdict: findings about the pair from the temperature analysis and each side's own report.

Codes, severities and their order come from the finding catalogue (``rcdiag.catalogue.findings``); the
messages, which quote the measured numbers, are built here.
"""

from __future__ import annotations

import math

from rcdiag.catalogue.emit import emit, ordered
from rcdiag.catalogue.findings import Code, codes_for
from rcdiag.compare.records import KL, SideTemperature, TemperatureAnalysis
from rcdiag.compare.temperature import ASSUMED_TEMPERATURE, NOISE_RATIO_LIMIT, SIGMAS, _g
from rcdiag.diagnosis.health import KL_K3_RELATIVE_GAP
from rcdiag.records.report import Finding, Report, Side

TEMPERATURE_KL_LIMIT = 0.1
"""kl at or above this at T != 1 is the size a log-prob computed without the temperature gives (0.1-1)."""

COMPARE_FINDING_CODES = codes_for("compare")
"""Every code ``compare`` can give, in the order findings are listed (documented in docs/compare.md)."""


def _findings(a: Report, b: Report, t: TemperatureAnalysis) -> list[Finding]:
    findings: list[Finding] = []
    sides: dict[Side, tuple[Report, SideTemperature]] = {"a": (a, t.a), "b": (b, t.b)}
    for side, (report, st) in sides.items():
        findings.extend(_side_findings(side, report, st))
    if t.a.source == "assumed" and t.b.source == "assumed":
        findings.append(
            emit(
                Code.TEMPERATURE_UNKNOWN,
                "neither dump records its sampling temperature (no --temperature-a/-b, no 'temperature' metadata): "
                f"the analysis assumes they are equal (T={ASSUMED_TEMPERATURE:g} on both; the noise verdicts do not "
                "depend on the common value)",
                more="If they differ, pass --temperature-a and --temperature-b.",
            )
        )
    shifted = {f.side for f in findings if f.code == "systematic_shift"}
    judged = {side for side, (report, _) in sides.items() if _names_a_bug(report)}
    findings.extend(_noise_findings(t, shifted, judged))
    problems = [f for f in findings if f.severity != "info"]
    if not problems and t.noise_ratio is not None and 1 / NOISE_RATIO_LIMIT < t.noise_ratio < NOISE_RATIO_LIMIT:
        findings.append(_consistent(t))
    findings.extend(_configuration_findings(sides))  # about the correction, not the engines: no noise verdict waits
    return ordered(findings)


def _configuration_findings(sides: dict[Side, tuple[Report, SideTemperature]]) -> list[Finding]:
    """Each side's ``framework_drops_gradient`` (under ``--as NAME``), carried with its side: the facts of the
    side's own finding, its value and bound."""
    return [
        emit(
            item.code,
            f"side {side}: {item.facts}",
            side=side,
            metric=item.metric,
            value=item.value,
            threshold=item.threshold,
        )
        for side, (report, _) in sides.items()
        for item in report.findings
        if item.code == Code.FRAMEWORK_DROPS_GRADIENT
    ]


def _names_a_bug(report: Report) -> bool:
    """The side's own verdict names a bug (``fix`` or ``broken``: a temperature, a truncation, an offset, ...): its
    mismatch is not engine noise, so ``engine_noise_differs`` (which blames the engines) says nothing about it."""
    return report.verdict is not None and report.verdict.status in ("fix", "broken")


def _side_findings(side: Side, report: Report, st: SideTemperature) -> list[Finding]:
    out: list[Finding] = []
    other = "b" if side == "a" else "a"
    if st.temperature is None:
        out.append(
            emit(
                Code.TEMPERATURE_UNKNOWN,
                f"side {side}'s sampling temperature is unknown: pass --temperature-{side} (or write 'temperature' "
                "into the dump's metadata) to get the temperature analysis for it.",
                side=side,
            )
        )
    elif st.kl is not None and st.kl >= TEMPERATURE_KL_LIMIT and st.temperature != 1.0:
        agree = st.k3_kl is not None and abs(st.kl - st.k3_kl) <= KL_K3_RELATIVE_GAP * max(abs(st.kl), abs(st.k3_kl))
        shape = (
            "kl and k3_kl agree, as they do when one side's distribution is a re-tempered but still normalised "
            "copy of the other's"
            if agree
            else "kl and k3_kl also disagree, so part of it is a systematic shift"
        )
        out.append(
            emit(
                Code.TEMPERATURE_KL_HIGH,
                f"side {side}: kl = {st.kl:.3g} at T={st.temperature:g}",
                more=f"Numerical engine noise gives kl of 1e-5..1e-2; kl of order {TEMPERATURE_KL_LIMIT:g}-1 at T != 1 "
                f"is what log-probs computed without the temperature on one side give ({shape}).",
                side=side,
                metric=KL,
                value=st.kl,
                threshold=TEMPERATURE_KL_LIMIT,
            )
        )
    overridden = st.source == "option" and st.recorded_temperature not in (None, st.temperature)
    if overridden:
        assert st.temperature is not None
        assert st.recorded_temperature is not None
        out.append(
            emit(
                Code.TEMPERATURE_OPTION_OVERRIDES_METADATA,
                f"side {side}: --temperature-{side} {st.temperature:g} disagrees with the temperature the dump "
                f"records ({st.recorded_temperature:g}); the analysis uses {st.temperature:g}",
                more=f"If the dump's metadata is right, drop --temperature-{side}: the noise estimate T*sqrt(2 kl) "
                "and the verdict depend on it.",
                side=side,
                value=st.temperature,
                threshold=st.recorded_temperature,
            )
        )
    recorded = st.source == "metadata" and st.train_temperature is not None
    if recorded and st.train_temperature != st.temperature:
        out.append(
            emit(
                Code.TEMPERATURE_RECORDED_MISMATCH,
                f"side {side}'s dump records a rollout temperature of {st.temperature:g} but a trainer temperature "
                f"of {st.train_temperature:g}",
                side=side,
                value=st.train_temperature,
                threshold=st.temperature,
            )
        )
    shift = next((f for f in report.findings if f.code == Code.KL_K3_DISAGREE), None)
    if shift is not None:
        out.append(
            emit(
                Code.SYSTEMATIC_SHIFT,
                f"side {side}: kl ({_g(st.kl)}) and k3_kl ({_g(st.k3_kl)}) disagree, so its mismatch is not "
                "small noise and its noise estimate T*sqrt(2 kl) does not hold (the second-order expansion "
                "behind it assumes they agree)",
                more=f"The cause is on side {side}'s log-prob plumbing, not something side {other} shares: "
                "top-k/top-p renormalised on one engine only, a constant offset, or shifted positions. analyze's "
                "finding: " + shift.message,
                side=side,
                metric=KL,
                value=shift.value,
                threshold=shift.threshold if isinstance(shift.threshold, float) else None,
            )
        )
    return out


def _noise_findings(t: TemperatureAnalysis, shifted: set[Side | None], judged: set[Side]) -> list[Finding]:
    """The noise comparison on the point estimates; where the quieter side's kl is within ``SIGMAS`` standard
    errors of 0, "far apart" must also hold against the high end of its band. Silent for a side with a systematic
    shift, where the estimate does not hold; no ``engine_noise_differs`` for a side whose own verdict names a bug
    (``judged``): the bug, not its engines, is what differs."""
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
            emit(
                Code.NOISE_INCONCLUSIVE,
                f"{numbers}: {point:.3g}x apart, but side {other}'s kl ({_g(quiet.kl)}) is within {SIGMAS:g} "
                f"standard errors ({_g(quiet.kl_std_error)}) of 0, and at the high end of its band the two are "
                f"{worst_case:.3g}x apart, within {NOISE_RATIO_LIMIT:g}x",
                side=side,
                metric=KL,
                value=point,
                threshold=NOISE_RATIO_LIMIT,
            )
        ]
    apart = f"{point:.3g}x apart" if quiet.noise else "apart"
    if noisy.temperature != 1.0 and quiet.noise:
        return [
            emit(
                Code.TEMPERATURE_NOISE_MISMATCH,
                f"{numbers}: {apart} (limit {NOISE_RATIO_LIMIT:g}x)",
                more="Temperature cannot explain this, because the estimate already corrects for it; at "
                f"T={noisy.temperature:g} the likely cause is temperature handling on side {side}: log-probs taken "
                f"before or without dividing by T on one engine, or a different T on each. If the temperature is "
                f"handled identically, side {side}'s engines are simply noisier (another kernel, dtype or parallel "
                "layout).",
                side=side,
                metric=KL,
                value=noisy.noise,
                threshold=NOISE_RATIO_LIMIT,
            )
        ]
    if side in judged:
        return []
    if noisy.source == "assumed":
        why = "With equal temperatures (assumed: neither dump records one) the temperature cannot be the cause, so"
    elif noisy.temperature == 1.0:
        why = "At T=1 the temperature cannot be the cause (dividing by 1 changes nothing), so"
    else:
        why = f"Side {other} shows no measurable noise (kl <= 0: bitwise-equal engines?), so"
    return [
        emit(
            Code.ENGINE_NOISE_DIFFERS,
            f"{numbers}: {apart} (limit {NOISE_RATIO_LIMIT:g}x)",
            more=f"{why} side {side}'s two engines disagree more: another kernel, dtype, parallel layout, engine "
            "version or checkpoint.",
            side=side,
            metric=KL,
            value=noisy.noise,
            threshold=NOISE_RATIO_LIMIT,
        )
    ]


def _consistent(t: TemperatureAnalysis) -> Finding:
    assert t.a.noise is not None
    assert t.b.noise is not None
    assert t.noise_ratio is not None
    facts = (
        f"engine noise is consistent across the two runs: logit-noise estimates {t.a.noise:.3g} (a) and "
        f"{t.b.noise:.3g} (b), ratio {t.noise_ratio:.3g}, within {NOISE_RATIO_LIMIT:g}x"
    )
    more: list[str] = []
    rough = [side for side, st in (("a", t.a), ("b", t.b)) if not st.noise_resolved]
    if rough:
        more.append(
            f"(Side {' and '.join(rough)}'s kl is within {SIGMAS:g} standard errors of 0, so its estimate is rough.)"
        )
    if t.a.temperature != t.b.temperature and t.kl_ratio is not None and t.ideal_kl_ratio is not None:
        if t.kl_ratio_explained:
            more.append(
                f"The kl difference (kl_a/kl_b = {t.kl_ratio:.3g}) comes from the temperatures "
                f"({t.a.temperature:g} vs {t.b.temperature:g}; ideal {t.ideal_kl_ratio:.3g}x, usually less because "
                "a sharper distribution shrinks Var_pi(eps)), not from a change in the engines."
            )
        else:
            more.append(
                f"But the kl ratio kl_a/kl_b = {t.kl_ratio:.3g} lies outside what the temperatures explain "
                f"({t.a.temperature:g} vs {t.b.temperature:g}: between 1x and {t.ideal_kl_ratio:.3g}x), so the "
                f"temperatures do not account for the kl difference; the {t.noise_ratio:.3g}x between the noise "
                f"estimates is what the engines differ by, within the {NOISE_RATIO_LIMIT:g}x this verdict allows."
            )
    # the statement alone keeps its full stop (``emit`` adds one only before what follows)
    return emit(
        Code.NOISE_CONSISTENT,
        facts if more else f"{facts}.",
        more=" ".join(more),
        metric=KL,
        value=t.noise_ratio,
        threshold=NOISE_RATIO_LIMIT,
    )
