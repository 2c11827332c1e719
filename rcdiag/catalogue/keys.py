"""Every fixed metric key rcdiag reports, spelled once: the specs of ``rcdiag.catalogue.metrics`` are declared with
these names, and every module that computes or reads a metric names it through them (``Key.KL_STD_ERROR``), so a
renamed key fails where it is used instead of reading ``None``. Key families built from a name (an RS option's keys,
a framework's weights) are functions in ``rcdiag.catalogue.metrics`` that build and check them
(``rs_key``, ``framework_key``). tests/lint/test_metric_keys.py keeps the literals here.
"""

from __future__ import annotations

from typing import Final

PREFIX: Final = "rollout_corr/"
"""verl's prefix for the keys it logs."""
EXTRA_PREFIX: Final = "rcdiag/"
"""rcdiag's own diagnostics (not verl keys)."""
DEBUG_PREFIX: Final = "training/"
"""verl's prefix for its debug metrics (``calculate_debug_metrics``), declared and reported with it."""


class Key:
    """The full key of every metric the catalogue declares one by one (the RS per-option templates aside), in the
    catalogue's order; the attribute is the key without its prefix, upper-cased."""

    # verl's off-policy metrics
    TRAINING_PPL: Final = "rollout_corr/training_ppl"
    TRAINING_LOG_PPL: Final = "rollout_corr/training_log_ppl"
    KL: Final = "rollout_corr/kl"
    K3_KL: Final = "rollout_corr/k3_kl"
    ROLLOUT_PPL: Final = "rollout_corr/rollout_ppl"
    ROLLOUT_LOG_PPL: Final = "rollout_corr/rollout_log_ppl"
    LOG_PPL_DIFF: Final = "rollout_corr/log_ppl_diff"
    LOG_PPL_ABS_DIFF: Final = "rollout_corr/log_ppl_abs_diff"
    LOG_PPL_DIFF_MAX: Final = "rollout_corr/log_ppl_diff_max"
    LOG_PPL_DIFF_MIN: Final = "rollout_corr/log_ppl_diff_min"
    PPL_RATIO: Final = "rollout_corr/ppl_ratio"
    CHI2_TOKEN: Final = "rollout_corr/chi2_token"
    CHI2_SEQ: Final = "rollout_corr/chi2_seq"
    # verl's IS metrics
    ROLLOUT_IS_MEAN: Final = "rollout_corr/rollout_is_mean"
    ROLLOUT_IS_RATIO_FRACTION_HIGH: Final = "rollout_corr/rollout_is_ratio_fraction_high"
    ROLLOUT_IS_RATIO_FRACTION_LOW: Final = "rollout_corr/rollout_is_ratio_fraction_low"
    ROLLOUT_IS_MAX: Final = "rollout_corr/rollout_is_max"
    ROLLOUT_IS_MIN: Final = "rollout_corr/rollout_is_min"
    ROLLOUT_IS_STD: Final = "rollout_corr/rollout_is_std"
    ROLLOUT_IS_EFF_SAMPLE_SIZE: Final = "rollout_corr/rollout_is_eff_sample_size"
    ROLLOUT_IS_SEQ_MEAN: Final = "rollout_corr/rollout_is_seq_mean"
    ROLLOUT_IS_SEQ_STD: Final = "rollout_corr/rollout_is_seq_std"
    ROLLOUT_IS_SEQ_MAX: Final = "rollout_corr/rollout_is_seq_max"
    ROLLOUT_IS_SEQ_MIN: Final = "rollout_corr/rollout_is_seq_min"
    ROLLOUT_IS_SEQ_MAX_DEVIATION: Final = "rollout_corr/rollout_is_seq_max_deviation"
    ROLLOUT_IS_SEQ_FRACTION_HIGH: Final = "rollout_corr/rollout_is_seq_fraction_high"
    ROLLOUT_IS_SEQ_FRACTION_LOW: Final = "rollout_corr/rollout_is_seq_fraction_low"
    ROLLOUT_IS_OOB_RATIO: Final = "rollout_corr/rollout_is_oob_ratio"
    ROLLOUT_IS_BATCH_NORM_FACTOR: Final = "rollout_corr/rollout_is_batch_norm_factor"
    # verl's RS aggregates (the per-option keys: rs_key)
    ROLLOUT_RS_MASKED_FRACTION: Final = "rollout_corr/rollout_rs_masked_fraction"
    ROLLOUT_RS_SEQ_MASKED_FRACTION: Final = "rollout_corr/rollout_rs_seq_masked_fraction"
    # verl's debug metrics (decoupled mode)
    ROLLOUT_PROBS_DIFF_VALID: Final = "training/rollout_probs_diff_valid"
    ROLLOUT_PROBS_DIFF_MAX: Final = "training/rollout_probs_diff_max"
    ROLLOUT_PROBS_DIFF_MEAN: Final = "training/rollout_probs_diff_mean"
    ROLLOUT_PROBS_DIFF_STD: Final = "training/rollout_probs_diff_std"
    ROLLOUT_ACTOR_PROBS_PEARSON_CORR: Final = "training/rollout_actor_probs_pearson_corr"
    # rcdiag's own diagnostics (rcdiag/metrics/extras.py)
    ABS_LOG_RATIO_MEAN: Final = "rcdiag/abs_log_ratio_mean"
    ABS_LOG_RATIO_MAX: Final = "rcdiag/abs_log_ratio_max"
    TOKEN_MULT_PROB_ERROR: Final = "rcdiag/token_mult_prob_error"
    KL_STD_ERROR: Final = "rcdiag/kl_std_error"
    KL_STD_ERROR_DOF: Final = "rcdiag/kl_std_error_dof"
    CLAMPED_TOKEN_FRACTION: Final = "rcdiag/clamped_token_fraction"
    # the signature statistics (rcdiag/metrics/signatures.py)
    CAPPED_RATIO_MEAN: Final = "rcdiag/capped_ratio_mean"
    CAPPED_RATIO_STD_ERROR: Final = "rcdiag/capped_ratio_std_error"
    REVERSE_RATIO_MEAN: Final = "rcdiag/reverse_ratio_mean"
    REVERSE_RATIO_STD_ERROR: Final = "rcdiag/reverse_ratio_std_error"
    SHAPE_CORR: Final = "rcdiag/shape_corr"
    WITHIN_ROW_SHARE: Final = "rcdiag/within_row_share"
    SHIFTED_AHEAD_RATIO: Final = "rcdiag/shifted_ahead_ratio"
    SHIFTED_BEHIND_RATIO: Final = "rcdiag/shifted_behind_ratio"
    ROLLOUT_ZERO_FRACTION: Final = "rcdiag/rollout_zero_fraction"
    BOTH_ZERO_FRACTION: Final = "rcdiag/both_zero_fraction"
    IDENTICAL_FRACTION: Final = "rcdiag/identical_fraction"
    CERTAIN_DROP: Final = "rcdiag/certain_drop"
    CERTAIN_DROP_STD_ERROR: Final = "rcdiag/certain_drop_std_error"
    CERTAIN_SHARE: Final = "rcdiag/certain_share"
    CERTAIN_LOWERED_SHARE: Final = "rcdiag/certain_lowered_share"
    ROLLOUT_CERTAIN_DROP: Final = "rcdiag/rollout_certain_drop"
    ROLLOUT_CERTAIN_DROP_STD_ERROR: Final = "rcdiag/rollout_certain_drop_std_error"
    ROLLOUT_CERTAIN_SHARE: Final = "rcdiag/rollout_certain_share"
    ROLLOUT_CERTAIN_LOWERED_SHARE: Final = "rcdiag/rollout_certain_lowered_share"
    ROLLOUT_FAR_HIGHER_SHARE: Final = "rcdiag/rollout_far_higher_share"
    ROLLOUT_FAR_HIGHER_TOP1_SHARE: Final = "rcdiag/rollout_far_higher_top1_share"
    TRAINER_FAR_HIGHER_SHARE: Final = "rcdiag/trainer_far_higher_share"
    REPEAT_DROP: Final = "rcdiag/repeat_drop"
    REPEAT_DROP_STD_ERROR: Final = "rcdiag/repeat_drop_std_error"
    REPEAT_SHARE: Final = "rcdiag/repeat_share"
