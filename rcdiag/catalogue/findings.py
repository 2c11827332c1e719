"""Every finding code: one spec each, with its severity, which commands give it, its checklist wording, what it
advises and what the verdict reads from it (the cause class it is evidence of, its role, whether it reads the
log-ratio's sign, what it tests as a detector).

Codes are stable (scripts key on them; ``Code`` names each). Findings are listed in this order within a severity;
docs/findings.md documents the ``analyze`` codes and docs/compare.md the ``compare`` codes, and tests hold both to
this table. A threshold finding's bound lives with its metric (``rcdiag.catalogue.metrics.finding_threshold``),
never here. Findings are made by ``rcdiag.catalogue.emit.emit`` (severity and advice from the spec). Imports no
records at run time: command help reads the detectors from here.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from enum import Enum
from functools import cache
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from rcdiag.records.report import CauseClass, Severity

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - Python 3.10

    class StrEnum(str, Enum):
        """``enum.StrEnum`` (Python 3.11): members are their values, as strings."""

        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return format(str(self.value), spec)


Command = Literal["analyze", "compare", "sweep"]
Role = Literal["size", "configuration", "input"]
"""What a finding is about when it names no cause of its own: ``size`` (the data's mismatch is large: with no other
cause, evidence of ``noise``), ``configuration`` (the correction the report was computed with: the verdict's next
steps), ``input`` (what was read: the verdict's first next steps)."""


class Code(StrEnum):
    """Every finding code; a member is its string (``Code.KL_NEGATIVE == "kl_negative"``)."""

    VERL_CRASH_EMPTY_BATCH = "verl_crash_empty_batch"
    VERL_CRASH_ESS_ZERO_DIVISION = "verl_crash_ess_zero_division"
    VERL_CRASH_MICROBATCH_ALL_REJECTED = "verl_crash_microbatch_all_rejected"
    VERL_CRASH_MICROBATCH_EMPTY = "verl_crash_microbatch_empty"
    VERL_REFUSES_MICROBATCH_SETUP = "verl_refuses_microbatch_setup"
    KL_NEGATIVE = "kl_negative"
    MASK_PADDING_VALID = "mask_padding_valid"
    MASK_TOKENS_UNSAMPLED = "mask_tokens_unsampled"
    LOGPROBS_MISALIGNED = "logprobs_misaligned"
    OFFSET_PER_RESPONSE = "offset_per_response"
    LOGPROBS_NOT_SAMPLED = "logprobs_not_sampled"
    LOGPROBS_OF_ANOTHER_TOKEN = "logprobs_of_another_token"
    CERTAIN_TOKENS_LOWERED = "certain_tokens_lowered"
    REPEATED_TOKENS_LOWERED = "repeated_tokens_lowered"
    MISMATCH_NOT_NOISE = "mismatch_not_noise"
    SLICE_CONCENTRATED = "slice_concentrated"
    SLICE_STALE = "slice_stale"
    MASK_LOOKS_INVERTED = "mask_looks_inverted"
    MASK_MISSING = "mask_missing"
    IS_MEAN_OUT_OF_RANGE = "is_mean_out_of_range"
    IS_ESS_LOW = "is_ess_low"
    IS_STD_HIGH = "is_std_high"
    KL_HIGH = "kl_high"
    CHI2_TOKEN_HIGH = "chi2_token_high"
    KL_K3_DISAGREE = "kl_k3_disagree"
    IS_SATURATED = "is_saturated"
    SPARSE_OUTLIERS = "sparse_outliers"
    RS_REJECTS_ALL_TOKENS = "rs_rejects_all_tokens"
    RS_REJECTS_MOST_TOKENS = "rs_rejects_most_tokens"
    FRAMEWORK_DROPS_GRADIENT = "framework_drops_gradient"
    LOGPROB_NEG_INF = "logprob_neg_inf"
    METRIC_NOT_FINITE = "metric_not_finite"
    TEMPERATURE_MISMATCH = "temperature_mismatch"
    LOGPROB_OFFSET = "logprob_offset"
    SAMPLING_TRUNCATION = "sampling_truncation"
    POSITION_DRIFT = "position_drift"
    MISMATCH_TREND = "mismatch_trend"
    TOKEN_SPECIFIC = "token_specific"
    SEQ_IS_HOPELESS = "seq_is_hopeless"
    IS_WEIGHTS_UNUSED = "is_weights_unused"
    TEMPERATURE_KL_HIGH = "temperature_kl_high"
    TEMPERATURE_NOISE_MISMATCH = "temperature_noise_mismatch"
    TEMPERATURE_RECORDED_MISMATCH = "temperature_recorded_mismatch"
    TEMPERATURE_OPTION_OVERRIDES_METADATA = "temperature_option_overrides_metadata"
    ENGINE_NOISE_DIFFERS = "engine_noise_differs"
    SYSTEMATIC_SHIFT = "systematic_shift"
    TEMPERATURE_UNKNOWN = "temperature_unknown"
    NOISE_INCONCLUSIVE = "noise_inconclusive"
    NOISE_CONSISTENT = "noise_consistent"


@dataclass(frozen=True)
class FindingSpec:
    """One finding code."""

    code: str
    """Stable: scripts key on it (a ``Code`` value)."""
    severity: Severity
    """The same wherever the code is raised (analyze, compare, an accumulator's crash note)."""
    trigger: str
    """When it fires, in one line (the docs table says the same)."""
    check: str | None = None
    """Wording of its row in analyze's checklist (``{rule}``: the metric's threshold); ``None``: no row."""
    metric: str | None = None
    """The metric it needs; the checklist marks the row "not computed" without it."""
    advice: str = ""
    """What to try, appended to the measured facts of the message."""
    commands: tuple[Command, ...] = ("analyze",)
    explain: bool = False
    """A bias detector (``rcdiag.explain``): every analyze runs it (those of ``EXPLAIN_ONLY`` only with ``--explain``),
    and its checklist row is shown wherever the detectors ran."""
    cause: CauseClass | None = None
    """The cause class it is evidence of (``rcdiag.diagnosis.verdict``); ``None``: it names no cause of its own."""
    role: Role | None = None
    """What it is about when it names no cause (``Role``); ``None``: neither."""
    reads_sign: bool = False
    """It reads which side scores a token higher: on swapped columns, raw log-probs or a layout bug it sees what
    the bug made, so the verdict lets it name no cause of its own there."""
    reads_shape: bool = False
    """It reads how the log-ratio depends on a token's probability: logit processing (soft-capping, a penalty) gives
    that shape too, so where ``processing`` is named by its own signature (which no temperature fits) it names no
    cause of its own."""
    detects: str | None = None
    """A bias detector's test in words (a report without their results lists them as not examined); ``None``: not
    a detector."""
    class_advice: str | None = None
    """What the verdict advises for its cause class as a whole, whichever finding showed it (truncation, seen by
    the kl/k3_kl gap alone, is cured as when this detector sees it); ``None``: the first finding's advice."""


FINDINGS: tuple[FindingSpec, ...] = (
    FindingSpec(
        "verl_crash_empty_batch",
        "error",
        "a batch has no valid token",
        check="every batch has a valid token (else verl raises ValueError)",
        commands=("analyze", "sweep"),
        cause="crash",
    ),
    FindingSpec(
        "verl_crash_ess_zero_division",
        "error",
        "IS on and every applied weight of a batch is 0",
        check="IS leaves a nonzero weight (else verl's ESS divides by 0)",
        metric="rollout_is_eff_sample_size",
        commands=("analyze", "sweep"),
        cause="crash",
    ),
    FindingSpec(
        "verl_crash_microbatch_all_rejected",
        "error",
        "with micro-batch flags, verl <= 0.7.1 in decoupled mode: RS rejects every token of a micro-batch",
        advice="verl <= 0.7.1's actor asserts a valid token in each micro-batch. Loosen the RS thresholds, use larger "
        "micro-batches, or upgrade to verl >= 0.8.0, whose decoupled mode has no per-micro-batch call.",
        cause="crash",
    ),
    FindingSpec(
        "verl_crash_microbatch_empty",
        "error",
        "with micro-batch flags, bypass mode: a micro-batch has no valid token (or IcePop zeroes all its weights)",
        advice="Bypass mode runs rollout correction per micro-batch. Filter empty responses before the update, or use "
        "larger micro-batches.",
        cause="crash",
    ),
    FindingSpec(
        "verl_refuses_microbatch_setup",
        "error",
        "with micro-batch flags: verl refuses the split (rows not divisible, a token budget below the longest "
        "sequence)",
        advice="verl stops at this assertion before training. Change the batch sizes or the token budget.",
        cause="crash",
    ),
    FindingSpec(
        "kl_negative",
        "error",
        "kl is below 0 by more than its noise (corrected for the number of steps tested) and the rounding floor",
        check="kl is not negative beyond noise (tokens sampled by the rollout engine give kl >= 0)",
        metric="kl",
        advice="On tokens sampled from the rollout engine E[log(pi_rollout/pi_train)] >= 0, so these log-probs cannot "
        "be right: the two log-prob columns are likely swapped (pass --old-col/--rollout-col the other way round), "
        "or the tokens were not sampled from the engine that scored them (a re-scored or replayed rollout).",
        cause="swapped_columns",
    ),
    FindingSpec(
        "mask_padding_valid",
        "error",
        "more than half of the valid tokens are exactly 0.0 on both sides",
        check="valid tokens are not padding (not exactly 0.0 on both sides)",
        advice="Padding is counted as response tokens: the mask is inverted or belongs to another column. Fix the "
        "mask (or pass --mask-col with the right one) before reading any metric.",
        cause="mask",
    ),
    FindingSpec(
        "mask_tokens_unsampled",
        "error",
        "more than 1% of valid tokens have a rollout log-prob of exactly 0.0 where the trainer's is below -0.1",
        check="the rollout scored every valid token (no exact 0.0 against a trainer below -0.1)",
        advice="The mask covers tokens the rollout never sampled (prompt tokens, padding, tool output), for which it "
        "reports 0.0: make the mask 1 only at sampled response tokens before reading any metric.",
        cause="mask",
    ),
    FindingSpec(
        "logprobs_misaligned",
        "error",
        "the two columns agree at least twice as well shifted by one position as unshifted",
        check="the two columns are aligned (no one-position shift agrees better)",
        advice="The trainer's log-probs are shifted by one position against the rollout's (logits or labels sliced "
        "one position off, a BOS/EOS token added on one side): align them; no correction can repair this.",
        cause="alignment",
    ),
    FindingSpec(
        "offset_per_response",
        "error",
        "the log-ratio is a constant per response (less than 25% of its energy within responses) and kl is beyond "
        "its noise",
        check="the log-ratio is not a constant offset per response",
        advice="One side's log-probs carry a constant offset (on all responses or some): a bias added after the "
        "softmax, a log-sum-exp computed over another vocabulary, a length or reward term folded into the log-prob. "
        "Find which side and remove it; correction would only reweight by a constant.",
        cause="offset",
    ),
    FindingSpec(
        "logprobs_not_sampled",
        "error",
        "the capped mean IS ratio is above 1 beyond 4 standard errors and by at least 0.5%",
        check="the rollout's log-probs are of the distribution it sampled from (capped ratio at most 1 on average)",
        advice="Return the log-probs of the distribution the tokens were sampled from: processed log-probs (after "
        "temperature, penalties and truncation; vLLM logprobs_mode=processed_logprobs) of the sampled token, "
        "not raw ones or another token's.",
        cause="logprob_mode",
    ),
    FindingSpec(
        "logprobs_of_another_token",
        "error",
        "more than 5% of the valid tokens are scored more than 2 nats higher by the rollout than by the trainer, and "
        "at most 1/50 as many the other way",
        check="the rollout reports the sampled token's log-prob, not the most likely token's",
        advice="The rollout reports another token's log-prob than the sampled one's, most likely the top-1 token's "
        "(the most likely token's): report the sampled token's own log-prob. vLLM returns the sampled token's entry "
        "beside the top-k ones (each position's logprobs are keyed by token id; the OpenAI-compatible API's "
        "`logprob` field is the sampled token's): read the sampled id's entry, not the first or highest entry of the "
        "top-k list (`top_logprobs[0]`, max over the dict); check which entry your pipeline reads. No correction "
        "repairs log-probs of another token.",
        cause="logprob_mode",
    ),
    FindingSpec(
        "certain_tokens_lowered",
        "error",
        "more than half of the tokens one side gives p >= 0.99 are scored more than 0.1 nats lower by the other "
        "(at least 30 such tokens)",
        check="tokens one side is near-certain of stay near-certain on the other (no large logits compressed)",
        advice="Logit processing on one side compresses the large logits that make a token near-certain: "
        "soft-capping (softcap * tanh(logits / softcap), Gemma's final_logit_softcapping) applied by one engine only, "
        "or another processor that flattens confident positions; no temperature does this. Apply the same logit "
        "processing on both sides; correction cannot repair a shifted distribution.",
        cause="processing",
    ),
    FindingSpec(
        "repeated_tokens_lowered",
        "error",
        "tokens whose id occurred earlier in their response get at least 0.05 nats less from the rollout than first "
        "occurrences of the same trainer log-prob, beyond 4 standard errors (token ids read)",
        check="the rollout does not lower tokens repeated within a response (no repetition/presence/frequency penalty)",
        advice="A repetition, presence or frequency penalty on the rollout side changes the distribution it samples "
        "from, and the trainer scores without it: turn the penalties off for RL rollouts or apply the same ones to "
        "the trainer's logits; correction cannot repair a shifted distribution.",
        cause="processing",
    ),
    FindingSpec(
        "mismatch_not_noise",
        "warning",
        "k3_kl above 1e-3 beyond noise and a precision test fails (missing mass, a shaped mismatch, beyond the "
        "published precision ranges)",
        check="a large mismatch is precision-like noise",
        advice="A systematic difference, not precision noise: check the sampling parameters on each side (penalties, "
        "logit bias, soft-capping, min-p, temperature), raw vs processed log-probs, the columns' alignment and the "
        "mask, and the engine and weights on each side; analyze's bias detectors test for a temperature, an offset, a "
        "truncation and drift along the response.",
        cause="unexplained",
    ),
    FindingSpec(
        "slice_concentrated",
        "warning",
        "one value of a replica/rank/worker or --by column, or one block of rows in reading order, carries k3 per "
        "token at least RATIO_MIN times the other rows' and above 1e-3, beyond z_critical standard errors (responses "
        "as units; thresholds: rcdiag.sections.slices)",
        check="no subset of rows (a replica, a worker, a --by value, a block of rows) carries the mismatch",
        advice="One subset of the rows carries the mismatch. For an engine replica, worker or GPU: compare its weights "
        "(a checkpoint not synced, quantised, in another dtype), engine version and kernels with the others'; for "
        "another column (an environment, a data source): what differs on its rows (chat template, tool output inside "
        "the mask, sampling settings). Fix that subset: correction would reweight the healthy rows with it.",
        cause="replica",
    ),
    FindingSpec(
        "slice_stale",
        "info",
        "as slice_concentrated, but within each value of a policy-version column the slice is no longer concentrated",
        advice="The excess follows the policy version: those rows were sampled by an older policy (staleness in "
        "asynchronous training), which importance sampling corrects; check the staleness bound if it is larger than "
        "intended.",
    ),
    FindingSpec(
        "mask_looks_inverted",
        "warning",
        "more than half of the rows have no valid token",
        check="most rows have a valid token (the mask is not inverted)",
        advice="The mask must be 1 at response tokens and 0 at prompt and padding: check the mask column (or pass "
        "--mask-col with the right one) before reading any metric.",
        cause="mask",
        role="input",
    ),
    FindingSpec(
        "mask_missing",
        "warning",
        "no mask column in a format whose rows hold prompt and padding",
        check="the dump has a mask where its format needs one",
        advice="Pass --mask-col with the key holding the loss mask (NeMo-RL writes token_loss_mask, prime-rl "
        "loss_mask).",
        role="input",
    ),
    FindingSpec(
        "is_mean_out_of_range",
        "warning",
        "the mean applied IS weight is outside its range",
        check="IS weights average near 1: {rule}",
        metric="rollout_is_mean",
        advice="The two engines' log-probs differ systematically, not by noise. Check that the rollout engine "
        "returns log-probs of the sampled tokens (calculate_log_probs), that both sides use the same temperature "
        "and sampling filters, and the log-prob plumbing.",
        role="configuration",
    ),
    FindingSpec(
        "is_ess_low",
        "warning",
        "the IS effective sample size is below its minimum",
        check="IS effective sample size: {rule}",
        metric="rollout_is_eff_sample_size",
        advice="A few tokens or sequences carry most of the IS weight, so the corrected gradient is high-variance. "
        "Tighten the IS threshold, or reject outliers with length-normalised RS (seq_mean_k1 'Geo-RS', or "
        "seq_mean_k3).",
        role="configuration",
    ),
    FindingSpec(
        "is_std_high",
        "warning",
        "the standard deviation of the applied IS weights is above its maximum",
        check="IS weight spread: {rule}",
        metric="rollout_is_std",
        advice="High-variance correction. Tighten the IS threshold or add length-normalised RS.",
        role="configuration",
    ),
    FindingSpec(
        "kl_high",
        "warning",
        "|kl| is above its maximum",
        check="{rule}",
        metric="kl",
        advice="Training and rollout disagree far beyond numerical noise (k3 KL typically runs 1e-5..1e-3 on "
        "dense models, 1e-3..1e-1 on MoE). Likely causes: temperature applied on one side only, top-k/top-p "
        "log-probs not renormalised alike, a stale or different checkpoint, or misaligned token positions.",
        role="size",
    ),
    FindingSpec(
        "chi2_token_high",
        "warning",
        "chi2_token is above its maximum",
        check="{rule}",
        metric="chi2_token",
        advice="The second moment of the token IS ratio is large, so some tokens have ratios far above 1. "
        "Token-level IS needs a tight cap, or reject those tokens (token_k1/token_k3 RS).",
        role="size",
    ),
    FindingSpec(
        "kl_k3_disagree",
        "warning",
        "kl - k3_kl is beyond its noise (corrected for the number of steps tested) and beyond half the KL",
        check="kl agrees with k3_kl within noise (the mean IS ratio is 1)",
        metric="kl",
        advice="Both estimate KL(rollout || training) and agree when the mismatch is noise, because the mean ratio "
        "pi_train/pi_rollout of tokens sampled from the rollout policy is 1. A gap beyond noise means a "
        "systematic shift: the rollout log-probs are not those of the distribution that sampled the tokens "
        "(top-k/top-p truncation renormalised on one side, a constant offset, shifted positions).",
    ),
    FindingSpec(
        "is_saturated",
        "warning",
        "IS on and at least IS_SATURATED_SHARE of the raw ratios are beyond the upper threshold (thresholds: "
        "rcdiag.diagnosis.health)",
        check="IS weights are not all truncated at the threshold (the correction is not a constant)",
        metric="rollout_is_ratio_fraction_high",
        advice="Truncation replaced (nearly) every weight by the threshold, so IS multiplies every sample by the "
        "same constant and corrects nothing; rollout_is_std near 0 and an ESS near 1 only say the weights are "
        "equal. Sequence weights are products over the response: use token-level TIS (rollout_is=token, "
        "threshold ~2), and check the IS threshold is an upper bound above 1.",
        cause="saturated_is",
    ),
    FindingSpec(
        "sparse_outliers",
        "warning",
        "at most OUTLIER_TOKEN_SHARE of the tokens have |log-ratio| >= OUTLIER_LOG_RATIO and carry at least "
        "OUTLIER_K3_SHARE of k3_kl (thresholds: rcdiag.diagnosis.health)",
        check="k3_kl is not carried by a few outlier tokens",
        advice="A heavy tail of its own, not precision noise: a few huge tokens (MoE routing flips, "
        "nondeterministic or buggy kernels, a token mis-scored on one side) dominate k3_kl and chi2, so averages "
        "mislead. Reject them with token-level RS (token_k1/token_k3) or IcePop, and look at the worst responses "
        "(analyze --explain).",
        cause="outliers",
    ),
    FindingSpec(
        "rs_rejects_all_tokens",
        "warning",
        "RS rejects every valid token of a batch",
        check="RS leaves some tokens to train on",
        metric="rollout_rs_masked_fraction",
        advice="The step trains on nothing. (verl <= v0.7.1 crashed here: 'Expected at least one valid token in "
        "response_mask'.) Loosen the RS thresholds.",
        cause="crash",
    ),
    FindingSpec(
        "rs_rejects_most_tokens",
        "warning",
        "RS rejects more than its documented share of the valid tokens of a batch (but not all)",
        check="RS removes outliers only: {rule}",
        metric="rollout_rs_masked_fraction",
        advice="verl's RS is a hard filter for extreme outliers; removing this much of a batch trains on a biased "
        "subset. Loosen that option's --rs-threshold (rcdiag sweep scans thresholds for one that fits).",
        role="configuration",
    ),
    FindingSpec(
        "framework_drops_gradient",
        "warning",
        "under --as NAME, NAME's own correction, pooled or at some steps, keeps a weight mean below 0.5, zeroes "
        "more than 50% of the valid tokens, or leaves an ESS of its weights below verl's minimum (0.3)",
        advice="Training then learns from a small share of the batch, or from a few tokens: use a token-level "
        "truncation in that framework's options (the verdict's prescription gives one, measured on this dump) rather "
        "than a sequence-level weight or mask, which multiplies every token's ratio along long responses.",
        commands=("analyze", "compare"),
        role="configuration",
    ),
    FindingSpec(
        "logprob_neg_inf",
        "warning",
        "valid tokens have -inf log-probs, so the unclamped metrics are infinite",
        check="no -inf log-prob at a valid token",
        advice="A log-prob of -inf says the engine gave the sampled token probability 0: a sampling filter "
        "(top-k/top-p/min-p) applied on one side only, or a masked-out vocabulary entry. Every metric it made "
        "infinite is listed in this finding's detail (JSON).",
        cause="token_specific",
    ),
    FindingSpec(
        "metric_not_finite",
        "warning",
        "a metric is +inf, -inf or NaN for a reason other than -inf log-probs",
        check="every metric is finite",
        role="input",
    ),
    # the bias detectors, run by every analyze (rcdiag.explain.detectors; token_specific only with --explain)
    FindingSpec(
        "temperature_mismatch",
        "warning",
        "the log-ratio old - rollout is positive on tokens the trainer finds unlikely (by TEMPERATURE_MIN_SHIFT) and "
        "negative on likely ones (sharper rollout), or the reverse with FLAT_SHARE_MIN of the moved likely tokens "
        "moved down (flatter); each beyond shape_critical standard errors (thresholds: rcdiag.explain.detectors)",
        check="no temperature difference between the engines (one side neither sharper nor flatter)",
        advice="Apply the same temperature on both sides: the trainer divides its logits by the rollout's sampling "
        "temperature, and the rollout engine reports log-probs of the tempered distribution it sampled from.",
        explain=True,
        cause="temperature",
        reads_sign=True,
        reads_shape=True,
        detects="a temperature applied on one side",
    ),
    FindingSpec(
        "logprob_offset",
        "warning",
        "the capped mean IS ratio is more than OFFSET_MIN (beyond Z standard errors) from 1, with at least "
        "OFFSET_SHARE_MIN net tokens shifted the same way",
        check="no broad one-way offset (fires only with 25% net of the tokens shifted one way and the capped mean "
        "ratio 2% beyond noise from 1)",
        advice="Typical cause: log-probs renormalised over top-k/top-p (or another truncated support) on one side "
        "only; return log-probs of the same distribution on both sides.",
        explain=True,
        cause="offset",
        reads_sign=True,
        detects="a log-prob offset on one side",
    ),
    FindingSpec(
        "sampling_truncation",
        "warning",
        "the mean capped IS ratio at least TRUNCATION_MIN_DEFICIT below 1 and beyond shape_critical standard errors, "
        "TRUNCATION_SHARE_MIN net tokens scored higher by the rollout, and the log-ratio lowest where the trainer is "
        "unsure (thresholds: rcdiag.explain.detectors)",
        check="the rollout's log-probs cover the trainer's whole distribution (no top-k/top-p renormalisation seen)",
        advice="The rollout engine reports log-probs renormalised over its top-k/top-p set and the trainer scores the "
        "full vocabulary: apply the same truncation in the trainer, or have the engine return log-probs of the "
        "untruncated distribution (and sample without truncation if the trainer cannot match it).",
        explain=True,
        cause="truncation",
        reads_sign=True,
        detects="top-k/top-p renormalised on one side",
        class_advice="Return log-probs of the same distribution on both sides: both renormalised over the same "
        "top-k/top-p set, or both over the full vocabulary.",
    ),
    FindingSpec(
        "position_drift",
        "warning",
        "late positions' k3_kl is at least DRIFT_RATIO_MIN times the early positions', pooled and in most row "
        "groups, and their mean |log-ratio| at least DRIFT_ABS_RATIO_MIN times",
        check="mismatch does not grow along the response",
        advice="Numerical noise does not depend on position; look for precision lost with context length "
        "(KV-cache dtype, RoPE or attention kernels at long context, positions shifted between the engines).",
        explain=True,
        cause="position",
        detects="mismatch growing along the response",
    ),
    FindingSpec(
        "mismatch_trend",
        "warning",
        "k3_kl fitted to grow at least TREND_GROWTH_MIN-fold over at least TREND_MIN_STEPS steps, beyond the "
        "fit's scatter",
        check="mismatch does not grow across training steps",
        advice="Mismatch that feeds on itself precedes collapse: find the component that drifts with training (a "
        "weight sync that lags or stops, a stale policy, an optimizer or precision change) before the run goes on; "
        "a correction would only reweight a gap that keeps growing.",
        explain=True,
        cause="trend",
        detects="mismatch growing across steps",
    ),
    FindingSpec(
        "token_specific",
        "warning",
        "at most MAX_IDS token ids, each significantly above the rest's mean |log-ratio|, carry at least "
        "K3_SHARE_MIN of the dump's k3 while being at most TOKEN_SHARE_MAX of its valid tokens",
        check="mismatch is not concentrated on a few token ids",
        advice="Mismatch on a few ids is a handling difference, not numerical noise: compare how the two engines "
        "treat those tokens (chat template, stop and end-of-sequence tokens, added or special tokens, tokenizer "
        "versions, digit or whitespace normalisation).",
        explain=True,
        cause="token_specific",
        detects="mismatch on a few token ids",
    ),
    FindingSpec(
        "seq_is_hopeless",
        "info",
        "chi2_seq puts the effective sample size of untruncated sequence IS weights, 1 / (1 + chi2_seq), below "
        "verl's ESS minimum (0.3)",
        check="sequence-level IS weights are usable at these lengths: 1 / (1 + chi2_seq) >= 0.3",
        metric="chi2_seq",
        advice="A sequence weight is the product of every token's ratio, so its variance grows exponentially with "
        "the response length; at these lengths sequence-level IS (or a sequence-level threshold) is dominated by a "
        "few responses or truncated to a constant. Use token-level TIS (rollout_is=token), which stays stable as "
        "responses grow, with RS for outliers.",
    ),
    FindingSpec(
        "is_weights_unused",
        "info",
        "bypass_mode with loss_type ppo_clip and IS on (configuration-level)",
        advice="Use loss_type=reinforce to apply them.",
        role="configuration",
    ),
    # compare's verdicts about a pair of dumps (docs/compare.md)
    FindingSpec(
        "temperature_kl_high",
        "warning",
        "a side's kl at T != 1 is the size a missing temperature gives",
        advice="Check that the trainer divides its logits by the rollout temperature before log_softmax, and that "
        "the rollout engine reports log-probs after temperature scaling.",
        commands=("compare",),
    ),
    FindingSpec(
        "temperature_noise_mismatch",
        "warning",
        "the noise estimates are far apart and the noisier side is at T != 1",
        commands=("compare",),
    ),
    FindingSpec(
        "temperature_recorded_mismatch",
        "warning",
        "the dump's metadata records a train_temperature different from its temperature",
        check="recorded temperature and train_temperature agree",
        advice="Its old_log_prob is not from the distribution the tokens were sampled from: the trainer must divide "
        "its logits by the rollout temperature before log_softmax.",
        commands=("analyze", "compare"),
        cause="temperature",
    ),
    FindingSpec(
        "temperature_option_overrides_metadata",
        "warning",
        "--temperature-X disagrees with the temperature the dump's metadata records",
        commands=("compare",),
    ),
    FindingSpec(
        "engine_noise_differs",
        "warning",
        "the noise estimates are far apart and temperature cannot be blamed",
        commands=("compare",),
    ),
    FindingSpec(
        "systematic_shift",
        "warning",
        "analyze reported kl_k3_disagree for a side",
        commands=("compare",),
    ),
    FindingSpec("temperature_unknown", "info", "a side's temperature is unknown", commands=("compare",)),
    FindingSpec(
        "noise_inconclusive",
        "info",
        "the noise estimates are far apart, but not across the quieter side's noise band",
        advice="Compare larger dumps (more responses) for a verdict.",
        commands=("compare",),
    ),
    FindingSpec(
        "noise_consistent",
        "info",
        "no warning fired and the noise estimates are close",
        commands=("compare",),
    ),
)


EXPLAIN_ONLY = (Code.TOKEN_SPECIFIC,)
"""Detectors only ``analyze --explain`` runs: they read its by-token table (``rcdiag.explain.token_detector``)."""


@cache
def _by_code() -> dict[str, FindingSpec]:
    return {spec.code: spec for spec in FINDINGS}


def finding(code: str) -> FindingSpec:
    """The spec of a code; ``KeyError`` for a code not in the catalogue (a bug, not an input error)."""
    return _by_code()[code]


def codes_for(command: Command) -> tuple[str, ...]:
    """The codes a command can give, in listing order."""
    return tuple(spec.code for spec in FINDINGS if command in spec.commands)


def codes_with(role: Role) -> frozenset[str]:
    """The codes of a role (``Role``)."""
    return frozenset(spec.code for spec in FINDINGS if spec.role == role)


def of_class(cls: CauseClass) -> tuple[FindingSpec, ...]:
    """The specs that are evidence of a cause class, in catalogue order."""
    return tuple(spec for spec in FINDINGS if spec.cause == cls)


def detectors() -> tuple[FindingSpec, ...]:
    """The bias detectors (every analyze runs them; ``EXPLAIN_ONLY`` only with ``--explain``), in catalogue order."""
    return tuple(spec for spec in FINDINGS if spec.detects is not None)


SEVERITY_RANK: dict[Severity, int] = {"error": 0, "warning": 1, "info": 2}


@cache
def _position() -> dict[str, int]:
    return {spec.code: i for i, spec in enumerate(FINDINGS)}


def listing_order(code: str, severity: Severity) -> tuple[int, int]:
    """Sort key: severity first, then catalogue order."""
    return SEVERITY_RANK[severity], _position()[code]
