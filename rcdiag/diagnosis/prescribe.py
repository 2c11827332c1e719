"""The prescription for a ``correct`` verdict: one verl setting, in verl's config syntax, with why; under ``--as NAME``
also in that framework's own settings (``rcdiag.frameworks.speak``).

Grounding (docs/verdict.md): token-level truncated IS (``rollout_is: token``, threshold 2.0, verl's default and
the ``decoupled_token_is`` preset) is the robust default: each token's weight is capped on its own, so it stays
stable where a sequence weight (a product over the response) collapses as responses grow (seed 004; "Mismatch
Praxis": the most robust choice on long horizons). Sparse outlier tokens are rejected with token-level RS on the
band that defines them (|log-ratio| <= 1 nat, ``token_k1``). Sequence-level IS is only ever offered as an
alternative, and only where ``seq_is_hopeless`` is quiet and ``chi2_seq`` is measurable. The effect of the
setting on the dump is measured by ``rcdiag.api`` (a second pass), never guessed here.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from rcdiag.catalogue.keys import Key
from rcdiag.frameworks.speak import riding, speak
from rcdiag.records.report import CauseClass, Effect, PrescribedSetting, Prescription, Report, VerdictStatus
from rcdiag.runtime.errors import ConfigError
from rcdiag.settings.correction import PRESETS, CorrectionConfig, rollout_correction_yaml
from rcdiag.settings.versions import DEFAULT_VERSION

TIS_THRESHOLD = 2.0
"""Token TIS's upper threshold: verl's default and its presets' (typical range 1.5-5)."""
OUTLIER_BAND_NATS = 1.0
"""The token_k1 band rejects |log-ratio| beyond this: the sparse_outliers finding's definition of an outlier."""
MOST_RESPONSES = 0.5
"""A prescription whose RS rejects tokens in more than this share of the responses is no remedy (said in the
verdict)."""
REVIEW_CODES = (
    "is_saturated",
    "is_ess_low",
    "is_mean_out_of_range",
    "is_std_high",
    "rs_rejects_most_tokens",
    "rs_rejects_all_tokens",
    "verl_crash_ess_zero_division",
    "verl_crash_empty_batch",
)
"""analyze's findings a prescription must not raise on the dump it is prescribed for (checked when measured)."""


@dataclass(frozen=True)
class Candidate:
    """The prescription (effect not yet measured) and alternatives worth a next step."""

    prescription: Prescription
    alternatives: list[str] = field(default_factory=list)

    @property
    def setting(self) -> str:
        """The setting in a few words, for the headline: under ``--as NAME`` that framework's options first."""
        c = self.prescription.config
        text = f"{c.rollout_is}-level TIS {c.rollout_is_threshold:g}"
        if c.rollout_rs:
            text += f" + {c.rollout_rs} RS {c.rollout_rs_threshold}"
        text += f" ({self.prescription.preset})" if self.prescription.preset else ""
        spoken = self.prescription.framework
        if spoken is None:
            return text
        if spoken.match == "none":
            return f"{text} ({spoken.release} has nothing alike: see the prescription)"
        return f"{spoken.release}'s setting in the prescription ({spoken.match.replace('_', ' ')} as verl's {text})"


def outlier_band() -> str:
    """token_k1's ``L_U`` band keeping |log-ratio| <= ``OUTLIER_BAND_NATS``."""
    return f"{math.exp(-OUTLIER_BAND_NATS):.4g}_{math.exp(OUTLIER_BAND_NATS):.4g}"


def candidate(report: Report, status: VerdictStatus, classes: frozenset[CauseClass]) -> Candidate | None:
    """The setting for a ``correct`` verdict; ``None`` for any other status (no threshold repairs a bug)."""
    if status != "correct":
        return None
    setting = PrescribedSetting("token", TIS_THRESHOLD)
    why = (
        "token-level truncated IS is the robust default: each token's weight is capped at "
        f"{TIS_THRESHOLD:g} on its own, so it stays stable on long responses where sequence-level weights collapse "
        "(seed 004; practice reports it most robust on long horizons)"
    )
    if "outliers" in classes:
        setting = dataclasses.replace(setting, rollout_rs="token_k1", rollout_rs_threshold=outlier_band())
        why += (
            f"; token_k1 RS on the band |log-ratio| <= {OUTLIER_BAND_NATS:g} nat rejects the sparse outlier tokens "
            "that carry most of k3_kl instead of letting them set the weights"
        )
    if "saturated_is" in classes:
        why += (
            "; the configured IS saturates (nearly every weight truncated to its bound): token-level TIS at "
            f"{TIS_THRESHOLD:g} neither multiplies ratios along the response nor caps below 1"
        )
    spoken = speak(setting.to_dict(), name) if (name := riding(report.sections)) is not None else None
    preset = matching_preset(prescribed_setting(setting))
    prescription = Prescription(setting, preset, verl_yaml(setting), None, why, spoken)
    return Candidate(prescription, _alternatives(report))


OPTIONAL = (
    "correction is optional at this level; if you want it, token-level TIS (decoupled_token_is: rollout_is token, "
    f"threshold {TIS_THRESHOLD:g}.0) is the robust default"
)


def optional_correction(report: Report) -> str:
    """The next step of a ``healthy`` verdict: correction is optional, token-level TIS the robust default (under
    ``--as NAME`` also in that framework's settings)."""
    name = riding(report.sections)
    if name is None:
        return OPTIONAL
    spoken = speak({"rollout_is": "token", "rollout_is_threshold": TIS_THRESHOLD}, name)
    return f"{OPTIONAL}; in {spoken.release}: {spoken.summary} ({spoken.match.replace('_', ' ')})"


SEQ_IS_PRESET = "decoupled_seq_is"
"""The sequence-level IS a next step may offer, measured on the dump under this preset (never the prescription)."""
CHI2_SEQ, IS_ESS, IS_TRUNCATED, RS_TOKENS, RS_RESPONSES = (
    Key.CHI2_SEQ,
    Key.ROLLOUT_IS_EFF_SAMPLE_SIZE,
    Key.ROLLOUT_IS_RATIO_FRACTION_HIGH,
    Key.ROLLOUT_RS_MASKED_FRACTION,
    Key.ROLLOUT_RS_SEQ_MASKED_FRACTION,
)
"""The metrics a prescription's effect and its alternatives are read from (the catalogue's names)."""


def _alternatives(report: Report) -> list[str]:
    chi2_seq = report.metrics.get(CHI2_SEQ)
    hopeless = any(f.code == "seq_is_hopeless" for f in report.findings)
    if hopeless:
        return [
            "sequence-level IS is not an option here: seq_is_hopeless (untruncated sequence weights leave an ESS "
            "below verl's minimum)"
        ]
    if chi2_seq is None or chi2_seq < 0.0:
        return ["sequence-level IS cannot be judged here: chi2_seq is not measurable (negative or missing)"]
    return [seq_is_unmeasured(report)]


def seq_is_unmeasured(report: Report) -> str:
    """The step offering sequence-level IS before it is measured on the dump (``rcdiag.api`` replaces it with
    ``seq_is_measured``; a report without a dump to re-read keeps it)."""
    command = report.command("analyze", "--preset", SEQ_IS_PRESET)
    return f"sequence-level IS ({SEQ_IS_PRESET}) was not measured on this dump: `{command}` measures its ESS"


def seq_is_measured(under: Report) -> str:
    """The step about sequence-level IS from ``under``, the dump's report under ``SEQ_IS_PRESET``: its measured ESS
    and what it raises of ``REVIEW_CODES`` (an ESS below verl's 0.3 is ``is_ess_low``)."""
    ess = under.metrics.get(IS_ESS)
    truncated = under.metrics.get(IS_TRUNCATED)
    raised = tuple(dict.fromkeys(f.code for f in under.findings if f.code in REVIEW_CODES))
    measured = f"under {SEQ_IS_PRESET} this dump's ESS is {_number(ess)}"
    if truncated is not None:
        measured += f" with {truncated:.1%} of the sequence weights truncated"
    if raised or ess is None:
        return f"sequence-level IS is not an option here: {measured} (raises {', '.join(raised) or 'no ESS'})"
    return f"sequence-level IS ({SEQ_IS_PRESET}) is admissible here: {measured}, raising none of analyze's findings"


def _number(value: float | None) -> str:
    return "not computed" if value is None else f"{value:.3g}"


def prescribed_setting(setting: PrescribedSetting, version: str = DEFAULT_VERSION) -> CorrectionConfig:
    """A prescription's four settings (``Prescription.config``) as the configuration analyze runs under verl
    ``version``: the one place they become one."""
    return CorrectionConfig(**setting.to_dict(), verl_version=version)


def matching_preset(config: CorrectionConfig) -> str | None:
    """The verl preset (decoupled mode) whose four settings equal ``config``'s, compared as verl parses them."""
    try:
        wanted = config.resolve()
    except ConfigError:
        return None
    for name, build in PRESETS.items():
        preset = build()
        if preset.bypass_mode:
            continue
        try:
            resolved = preset.resolve()
        except ConfigError:  # pragma: no cover - every preset resolves
            continue
        if resolved.is_spec == wanted.is_spec and resolved.rs_options == wanted.rs_options:
            return name
    return None


def verl_yaml(setting: PrescribedSetting) -> str:
    """The four settings as lines to paste into verl's config."""
    return rollout_correction_yaml(setting.to_dict())


def effect_of(prescription: Prescription, under: Report) -> tuple[Prescription, tuple[str, ...], bool]:
    """``prescription`` with its effect read from ``under`` (the report of the same dump computed with the
    prescribed setting), the next steps that what it raises calls for (``REVIEW_CODES``, flagged in ``why``), and
    whether it is a remedy: RS that rejects tokens in most responses is not one (the outliers it rejects are then no
    longer sparse, and the responses it leaves whole are a biased remnant)."""
    m = under.metrics
    rs = prescription.config.rollout_rs is not None
    effect = Effect(
        tokens_rejected=(m.get(RS_TOKENS) or 0.0) if rs else 0.0,
        responses_rejected=(m.get(RS_RESPONSES) or 0.0) if rs else 0.0,
        is_ess=m.get(IS_ESS),
        is_truncated_share=m.get(IS_TRUNCATED),
    )
    raised = tuple(dict.fromkeys(f.code for f in under.findings if f.code in REVIEW_CODES))
    why = prescription.why
    steps: list[str] = []
    remedy = effect.responses_rejected <= MOST_RESPONSES
    if not remedy:
        why += f"; NOT A REMEDY: its RS rejects tokens in {effect.responses_rejected:.0%} of the responses"
        steps.append(
            f"the prescribed RS rejects tokens in {effect.responses_rejected:.0%} of the responses on this dump: it "
            "is not a remedy (outliers in most responses are not sparse); find what moves so many tokens first"
        )
    if raised:
        why += f"; FLAGGED: on this dump it raises {', '.join(raised)} (analyze's own findings)"
        steps.append(
            f"the prescription raises {', '.join(raised)} on this dump: run `{under.command('sweep')}` to choose a "
            "threshold, and look for the cause of so large a mismatch first"
        )
    return dataclasses.replace(prescription, effect=effect, why=why), tuple(steps), remedy
