"""Each finding code's severity, written out here rather than read from the catalogue: the tests' helpers that
collect findings check every finding that fires against it, so a severity changed in the code fails where the
finding fires (not only where the catalogue is compared with docs/findings.md)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

ERROR, WARNING, INFO = "error", "warning", "info"
SEVERITIES = {
    "verl_crash_empty_batch": ERROR,
    "verl_crash_ess_zero_division": ERROR,
    "verl_crash_microbatch_all_rejected": ERROR,
    "verl_crash_microbatch_empty": ERROR,
    "verl_refuses_microbatch_setup": ERROR,
    "kl_negative": ERROR,
    "mask_padding_valid": ERROR,
    "mask_tokens_unsampled": ERROR,
    "logprobs_misaligned": ERROR,
    "offset_per_response": ERROR,
    "logprobs_not_sampled": ERROR,
    "logprobs_of_another_token": ERROR,
    "certain_tokens_lowered": ERROR,
    "framework_drops_gradient": WARNING,  # under --as: the framework's own correction, not the engines
    "repeated_tokens_lowered": ERROR,
    "mismatch_not_noise": WARNING,
    "slice_concentrated": WARNING,
    "slice_stale": INFO,
    "mask_looks_inverted": WARNING,
    "mask_missing": WARNING,
    "is_mean_out_of_range": WARNING,
    "is_ess_low": WARNING,
    "is_std_high": WARNING,
    "kl_high": WARNING,
    "chi2_token_high": WARNING,
    "kl_k3_disagree": WARNING,
    "is_saturated": WARNING,
    "sparse_outliers": WARNING,
    "rs_rejects_all_tokens": WARNING,
    "rs_rejects_most_tokens": WARNING,
    "logprob_neg_inf": WARNING,
    "metric_not_finite": WARNING,
    "temperature_mismatch": WARNING,
    "logprob_offset": WARNING,
    "sampling_truncation": WARNING,
    "seq_is_hopeless": INFO,
    "position_drift": WARNING,
    "mismatch_trend": WARNING,
    "token_specific": WARNING,
    "is_weights_unused": INFO,
    "temperature_kl_high": WARNING,
    "temperature_noise_mismatch": WARNING,
    "temperature_recorded_mismatch": WARNING,
    "temperature_option_overrides_metadata": WARNING,
    "engine_noise_differs": WARNING,
    "systematic_shift": WARNING,
    "temperature_unknown": INFO,
    "noise_inconclusive": INFO,
    "noise_consistent": INFO,
}


def checked(findings: Iterable[Any]) -> list[Any]:
    """The findings, each asserted to carry its code's severity."""
    out = list(findings)
    for f in out:
        assert f.severity == SEVERITIES[f.code], (f.code, f.severity)
    return out
