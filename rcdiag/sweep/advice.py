"""What the sweep advises, from analyze's verdict on the same dump: the one rule that keeps the sweep's
recommendations from contradicting the verdict (docs/sweep.md, "The verdict first").

* ``fix`` / ``broken``: no threshold is the remedy; the tables say what each threshold would do, urging none.
* ``correct``: the first recommendation is the verdict's prescription; the per-option thresholds aim at the target
  share the user chose (``--target-reject``), which the sweep says; the prescribed preset leads the ranking unless
  it raises one of analyze's findings there (then the sweep says so).
* ``healthy`` / ``identical``: no correction is needed.
"""

from __future__ import annotations

import dataclasses

from rcdiag.records.report import Prescription, Verdict
from rcdiag.sweep.sweep_report import NO_THRESHOLD_REMEDY, Correction, PresetRank, SweepAdvice

CORRECTION: dict[str, Correction] = {
    "correct": "prescribed",
    "healthy": "optional",
    "identical": "none",
    "fix": "not_a_remedy",
    "broken": "not_a_remedy",
}
"""The verdict's status -> what the sweep says of correcting."""


def advise(
    verdict: Verdict, presets: tuple[PresetRank, ...], target: float | None
) -> tuple[SweepAdvice, tuple[PresetRank, ...]]:
    """The advice for ``verdict``, and the presets in the order the sweep shows them (the prescribed preset first
    under ``correct``, when it corrects without raising a finding)."""
    correction = CORRECTION[verdict.status]
    if correction == "not_a_remedy":
        return SweepAdvice(verdict.status, correction, f"{verdict.status}: {NO_THRESHOLD_REMEDY}"), presets
    if correction == "none":
        says = "no correction is needed: the two log-prob columns are identical, so every threshold below does nothing"
        return SweepAdvice(verdict.status, correction, says), presets
    if correction == "optional" or verdict.recommendation is None:
        says = (
            "no correction is needed: the engines agree to numerical noise; the tables below say what each threshold "
            "would do if you want one (token-level TIS 2.0, decoupled_token_is, is the robust default)"
        )
        return SweepAdvice(verdict.status, "optional", says), presets
    prescribed = verdict.recommendation
    shown, ranking = _lead(presets, prescribed)
    says = f"the first recommendation is the verdict's prescription: {_setting(prescribed)}"
    why = [ranking] if ranking else []
    if target is not None:
        why.append(
            f"the per-option thresholds below aim at the rejected share you chose (--target-reject {target:g}), not "
            "at the verdict's prescription: they say what each option would do at that share"
        )
    return SweepAdvice(verdict.status, correction, says, prescribed, "; ".join(why) or None), shown


def _setting(prescription: Prescription) -> str:
    text = ", ".join(f"{key} {value}" for key, value in prescription.config.to_dict().items() if value is not None)
    return text + (f" (verl preset {prescription.preset})" if prescription.preset else " (no verl preset)")


def _lead(presets: tuple[PresetRank, ...], prescribed: Prescription) -> tuple[tuple[PresetRank, ...], str]:
    """The presets with the prescribed one first when it corrects without a finding (tier 0), and what the ranking
    says otherwise."""
    name = prescribed.preset
    if name is None:
        return presets, "the prescription is no verl preset: the presets below are ranked on their own"
    found = next((p for p in presets if p.name == name), None)
    if found is None:
        return presets, f"{name} is not among the presets this sweep computed (its options were not swept)"
    if found.tier != 0:
        return presets, f"{name} {found.note} on this dump: ranked with those raising a finding"
    others = tuple(p for p in presets if p is not found)
    return (dataclasses.replace(found, note="the verdict's prescription"), *others), ""
