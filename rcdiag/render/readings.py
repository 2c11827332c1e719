"""Plain-language readings of each metric: what the number says about the mismatch."""

from __future__ import annotations

_STATIC: dict[str, str] = {
    "training_ppl": "mean per-response perplexity under the trainer",
    "training_log_ppl": "mean per-response log-perplexity under the trainer",
    "rollout_ppl": "mean per-response perplexity under the rollout engine",
    "rollout_log_ppl": "mean per-response log-perplexity under the rollout engine",
    "log_ppl_abs_diff": "mean |log-PPL gap| per response: size of the gap regardless of sign",
    "log_ppl_diff_max": "largest per-response log-PPL gap (trainer finds this response least likely)",
    "log_ppl_diff_min": "most negative per-response log-PPL gap",
    "ppl_ratio": "mean of PPL_train/PPL_rollout per response; 1 = no gap",
    "chi2_seq": "E[(prod ratio)^2] - 1 per response: the variance a sequence-level IS weight would have; "
    "grows with length",
    "rollout_is_max": "largest applied IS weight",
    "rollout_is_min": "smallest applied IS weight",
    "rollout_is_ratio_fraction_high": "share with raw ratio above the upper bound",
    "rollout_is_ratio_fraction_low": "share with raw ratio below the lower bound (1/U for TIS)",
    "rollout_is_seq_mean": "mean over responses of the per-response mean weight",
    "rollout_is_seq_std": "spread of per-response mean weights",
    "rollout_is_seq_max": "largest per-response mean weight",
    "rollout_is_seq_min": "smallest per-response mean weight (0 for empty responses)",
    "rollout_is_seq_max_deviation": "largest |per-response mean weight - 1|",
    "rollout_is_seq_fraction_high": "share of responses whose mean raw weight exceeds the upper bound",
    "rollout_is_seq_fraction_low": "share of responses whose mean raw weight is below the lower bound "
    "(empty responses count here)",
    "rollout_is_oob_ratio": "share of tokens IcePop zeroed (raw ratio outside [L, U])",
    "rollout_is_batch_norm_factor": "the mean weight the batch is divided by to normalise it to 1",
    "rollout_rs_masked_fraction": "share of valid tokens rejected by any RS option",
    "rollout_rs_seq_masked_fraction": "share of all responses with at least one rejected token",
}

_RS_SUFFIX: dict[str, str] = {
    "mean": "token-weighted mean of the statistic (ideal 0)",
    "max": "largest value",
    "min": "smallest value",
    "fraction_high": "share above the upper bound",
    "fraction_low": "share below the lower bound",
    "std": "spread of the statistic clamped to the bounds",
    "seq_mean": "mean over responses of the per-response value",
    "seq_std": "spread over responses",
    "seq_max": "largest per-response value",
    "seq_min": "smallest per-response value",
    "seq_max_deviation": "largest |per-response value| (ideal 0)",
    "seq_fraction_high": "share of responses above the upper bound",
    "seq_fraction_low": "share of responses below the lower bound",
    "masked_fraction": "share of valid tokens this option rejects",
    "seq_masked_fraction": "share of responses (with a valid token) this option touches",
}

_EXTRAS: dict[str, str] = {
    "rcdiag/abs_log_ratio_mean": "mean |log-prob gap| per token (TRL/slime/SkyRL's abs-diff metric)",
    "rcdiag/abs_log_ratio_max": "largest |log-prob gap| of any token",
    "rcdiag/token_mult_prob_error": "mean exp(|gap|) per token (NeMo-RL's metric; its gate is 1.05)",
    "rcdiag/kl_std_error": "standard error of kl (responses as independent units)",
    "rcdiag/clamped_token_fraction": "share of tokens with |gap| > 20, where verl's clamps bite",
}


def _kl_band(value: float) -> str:
    size = abs(value)
    if size < 1e-4:
        return "tiny: engines nearly agree"
    if size < 1e-3:
        return "small: typical of dense models"
    if size < 1e-2:
        return "moderate: typical of MoE or low-precision rollout"
    if size < 0.1:
        return "large: correction matters"
    return "very large: likely a bug (temperature, sampling filters, checkpoint)"


def reading(key: str, value: float | None) -> str:
    """A short reading of one metric (``key`` with or without the ``rollout_corr/`` prefix)."""
    name = key.removeprefix("rollout_corr/")
    if key in _EXTRAS:
        return _EXTRAS[key]
    if value is not None:
        dynamic = _dynamic(name, value)
        if dynamic:
            return dynamic
    if name in _STATIC:
        return _STATIC[name]
    if name.startswith("rollout_rs_"):
        for suffix in sorted(_RS_SUFFIX, key=len, reverse=True):
            if name.endswith("_" + suffix):
                return _RS_SUFFIX[suffix]
    return ""


def _dynamic(name: str, value: float) -> str:
    if name == "kl":
        return f"~KL(rollout||train) per token; {_kl_band(value)}"
    if name == "k3_kl":
        return f"low-variance estimate of the same KL (should match kl); {_kl_band(value)}"
    if name == "chi2_token":
        return "E[ratio^2] - 1 per token: " + ("small spread" if value < 0.1 else "wide spread of token ratios")
    if name == "log_ppl_diff":
        if abs(value) < 1e-3:
            return "mean log-PPL(train) - log-PPL(rollout): no systematic gap"
        side = "trainer" if value > 0 else "rollout engine"
        return f"mean log-PPL(train) - log-PPL(rollout): the {side} finds responses less likely"
    if name == "rollout_is_mean":
        return "mean applied IS weight; ~1 when the mismatch is noise" + (
            "" if 0.5 <= value <= 2.0 else " (outside [0.5, 2]: systematic shift)"
        )
    if name == "rollout_is_eff_sample_size":
        verdict = "healthy" if value >= 0.5 else "low" if value >= 0.3 else "too low"
        return f"effective share of the batch after weighting ({verdict})"
    if name == "rollout_is_std":
        return "spread of applied IS weights" + (" (> 1: high variance)" if value > 1.0 else "")
    return ""
