"""Signature findings: each names a cause by its own evidence from the signature statistics (rcdiag/metrics/
signatures.py), on every run, and ``precision_tests`` says whether a mismatch is consistent with precision noise.

Read on the whole dump (all steps pooled): a pipeline bug is there at every step, and pooling gives the tests their
power. docs/verdict.md gives each signature, its threshold and its measured false-alarm rate on the tests' real
model (tests/verdict/test_verdict_open_world.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rcdiag.catalogue.emit import emit
from rcdiag.catalogue.findings import Code
from rcdiag.catalogue.keys import Key
from rcdiag.catalogue.metrics import KL_BANDS, known_key
from rcdiag.metrics.signatures import CERTAIN_KEYS, HISTORY_KEYS, RATIO_KEYS
from rcdiag.records.report import Finding

NOISE_K3_MAX = next(band.below for band in KL_BANDS if band.text.startswith("small"))
"""A mismatch is large from this k3_kl (1e-3): the top of the range published for dense bf16 models (1e-5..1e-3),
the kl readings' "small: typical of dense models" band, read from the catalogue; a bf16 rollout of the tests' real
model gives 1.3e-4. Below it a mismatch is ``healthy`` whatever its shape (the verdict)."""
NOISE_SIGMAS = 2.0
"""kl within this many of its standard errors (rcdiag/kl_std_error) of 0 is indistinguishable from no mismatch
(the same band the kl reading uses)."""
Z = 4.0
"""Standard errors (responses as the units) a ratio must clear beyond 1: with the Bonferroni share of the dump's
two ratio tests, under 1e-4 false alarms per dump."""
MIN_TOKENS = 2000
"""Fewer valid tokens leave every signature silent."""
RATIO_OVER_MIN = 0.005
"""logprobs_not_sampled: the capped mean IS ratio must also exceed 1 by this (0.5% of probability mass)."""
DEFICIT_MIN = 0.003
"""precision test: a capped mean IS ratio this far below 1 beyond noise is mass missing, not noise (as
the sampling_truncation detector)."""
SHAPE_CORR_MAX = 0.35
"""precision test: |corr(log-ratio, log-prob)| above this is a shaped mismatch (a temperature, a penalty, soft-capping:
0.41-0.89 on the tests' real model), not noise (at most 0.27 measured: a 4-bit rollout)."""
ENVELOPE_K3 = 0.1
"""precision test: k3_kl above this is beyond every range published for precision effects (dense bf16 1e-5..1e-3,
MoE 1e-3..1e-1; mismatch-practice.md)."""
ALIGN_RATIO_MAX = 0.5
"""logprobs_misaligned: the columns shifted by one position agree at least twice as well as unshifted (1.1-2900 on
clean real-model dumps; 0.00002 with an off-by-one trainer)."""
ALIGN_ABS_MIN = 0.05
"""logprobs_misaligned: and the unshifted mean |log-ratio| is at least this (5x bf16's)."""
OFFSET_WITHIN_MAX = 0.25
"""offset_per_response: at most this share of the log-ratio's energy is left within responses once each response's
mean is taken out (0.96-0.99 for noise; 0 for an exact offset; 0.06-0.18 for a 0.05-nat offset over bf16 noise)."""
OFFSET_SIGMAS = 4.0
"""offset_per_response: |kl| at least this many of its standard errors."""
ZERO_SHARE_MAX = 0.01
"""mask_tokens_unsampled: rollout log-probs of exactly 0.0 against a trainer below -0.1 on more than this share of
valid tokens (0 on every clean real-model dump)."""
BOTH_ZERO_SHARE_MAX = 0.5
"""mask_padding_valid: both log-probs exactly 0.0 on more than this share of valid tokens."""
CERTAIN_LOWERED_MIN = 0.5
"""certain_tokens_lowered: more than this share of the tokens one side gives p >= 0.99 scored more than 0.1 nats
lower by the other (at least 0.999 for soft-capping at 4-10 on the tests' real model; at most 0.05 for a one-sided
temperature up to 1.5, a repetition penalty, every other planted cause and every clean engine; 0.27 on a dump where
one engine gives only the stop token probability 1)."""
REPEAT_DROP_MIN = 0.05
"""repeated_tokens_lowered: repeated tokens lowered by the rollout this much more than first occurrences (0.06,
0.10 and 0.25 nats for repetition penalties of 5%, 10% and 30% on the tests' real model; at most 0.021 for every
other planted cause and clean engine)."""
FAR_SHARE_MIN = 0.05
"""logprobs_of_another_token: more than this share of the valid tokens scored more than 2 nats higher by the rollout
than by the trainer (12.1-12.2% for a rollout reporting the top-1 token's log-prob on the tests' real model; at most
0.5% for every clean engine, 2.9% for a repetition penalty, 3.7% for prompt tokens in the mask)."""
FAR_TOP1_MIN = 0.1
"""logprobs_of_another_token: and at least this share of those given p >= 1/2 by the rollout (its most likely token:
0.25 for top-1 log-probs; at most 0.002 for a flatter rollout, which raises the unlikely tokens it samples but never
to its most likely one: a temperature of 1.5 or 2, soft-capping at 4 or 10)."""
FAR_MIRROR_MAX = 0.02
"""logprobs_of_another_token: and at most this many tokens scored 2 nats higher by the trainer for each of those (0
for top-1 log-probs: the reported log-prob is never below the sampled token's; 0.08-0.09 for soft-capping at 4,
about 1 for an off-by-one trainer)."""
MIN_GROUP_TOKENS = 30
"""Fewer tokens in a group (near-certain ones, repeated or first-seen ones) leave its test silent."""

SIGNATURE_CODES = (
    "mask_padding_valid",
    "mask_tokens_unsampled",
    "logprobs_misaligned",
    "offset_per_response",
    "logprobs_not_sampled",
    "logprobs_of_another_token",
    "certain_tokens_lowered",
    "repeated_tokens_lowered",
    "mismatch_not_noise",
)


@dataclass(frozen=True)
class _Read:
    """The numbers the signatures read from a pooled result."""

    kl: float | None
    kl_se: float | None
    k3: float | None
    abs_mean: float | None
    extras: dict[str, float | None]

    def get(self, key: str) -> float | None:
        """An extra by its full key (``Key``); ``KeyError`` for a name the catalogue lacks, never a silent ``None``."""
        return self.extras.get(known_key(key))


def signature_findings(
    metrics: dict[str, float | None], extras: dict[str, float | None], valid_tokens: int
) -> list[Finding]:
    """The signature findings of a whole dump's pooled metrics and extras."""
    read = _Read(
        metrics.get(Key.KL),
        extras.get(Key.KL_STD_ERROR),
        metrics.get(Key.K3_KL),
        extras.get(Key.ABS_LOG_RATIO_MEAN),
        extras,
    )
    if valid_tokens < MIN_TOKENS:
        return []
    found = [_mask(read), _alignment(read), _offset(read), _not_sampled(read), _another_token(read)]
    found.append(_certain(read, valid_tokens))
    found.append(repeats(extras, valid_tokens))
    found.append(_not_noise(metrics, extras))
    return [f for f in found if f is not None]


def kl_beyond_noise(metrics: dict[str, float | None], extras: dict[str, float | None]) -> bool:
    """kl beyond ``NOISE_SIGMAS`` of its standard errors (or without one)."""
    kl, se = metrics.get(Key.KL), extras.get(Key.KL_STD_ERROR)
    return kl is not None and (se is None or abs(kl) > NOISE_SIGMAS * se)


def mismatch_large(metrics: dict[str, float | None], extras: dict[str, float | None]) -> bool:
    """k3_kl above ``NOISE_K3_MAX`` and kl beyond its noise."""
    k3 = metrics.get(Key.K3_KL)
    return k3 is not None and k3 > NOISE_K3_MAX and kl_beyond_noise(metrics, extras)


def _not_noise(metrics: dict[str, float | None], extras: dict[str, float | None]) -> Finding | None:
    """A large mismatch that fails a precision test: systematic, whether or not a signature names it."""
    if not mismatch_large(metrics, extras):
        return None
    _, failed = precision_tests(metrics, extras)
    if not failed:
        return None
    k3 = metrics.get(Key.K3_KL)
    return emit(
        Code.MISMATCH_NOT_NOISE,
        f"the mismatch (k3_kl {k3:.3g}, above {NOISE_K3_MAX:g}) is not precision noise: {'; '.join(failed)}",
        value=k3,
        threshold=NOISE_K3_MAX,
    )


def _mask(read: _Read) -> Finding | None:
    both, unsampled = read.get(Key.BOTH_ZERO_FRACTION), read.get(Key.ROLLOUT_ZERO_FRACTION)
    if both is not None and both > BOTH_ZERO_SHARE_MAX:
        return emit(
            Code.MASK_PADDING_VALID,
            f"{both:.1%} of the valid tokens are exactly 0.0 on both sides (more than {BOTH_ZERO_SHARE_MAX:.0%}): "
            "padding counted as response tokens",
            value=both,
            threshold=BOTH_ZERO_SHARE_MAX,
        )
    if unsampled is not None and unsampled > ZERO_SHARE_MAX:
        return emit(
            Code.MASK_TOKENS_UNSAMPLED,
            f"{unsampled:.1%} of the valid tokens have a rollout log-prob of exactly 0.0 (probability 1) where the "
            f"trainer's is below -0.1 (more than {ZERO_SHARE_MAX:.0%}): the rollout never sampled them",
            value=unsampled,
            threshold=ZERO_SHARE_MAX,
        )
    return None


def _alignment(read: _Read) -> Finding | None:
    ahead, behind = read.get(Key.SHIFTED_AHEAD_RATIO), read.get(Key.SHIFTED_BEHIND_RATIO)
    if ahead is None or behind is None or read.abs_mean is None or read.abs_mean < ALIGN_ABS_MIN:
        return None
    ratio = min(ahead, behind)
    if ratio >= ALIGN_RATIO_MAX:
        return None
    which = (
        "the trainer's log-prob at position t matches the rollout's at t+1"
        if ahead <= behind
        else "the trainer's log-prob at position t+1 matches the rollout's at t"
    )
    return emit(
        Code.LOGPROBS_MISALIGNED,
        f"shifted by one position the two columns agree {1 / ratio:.3g}x better than as given (mean |log-ratio| "
        f"{read.abs_mean:.3g} unshifted, {read.abs_mean * ratio:.3g} shifted): {which}",
        value=ratio,
        threshold=ALIGN_RATIO_MAX,
    )


def _offset(read: _Read) -> Finding | None:
    within = read.get(Key.WITHIN_ROW_SHARE)
    if within is None or within > OFFSET_WITHIN_MAX or read.kl is None or read.kl_se is None:
        return None
    if abs(read.kl) <= OFFSET_SIGMAS * read.kl_se or read.kl == 0.0:
        return None
    higher = "rollout" if read.kl > 0 else "trainer"
    return emit(
        Code.OFFSET_PER_RESPONSE,
        f"the log-ratio is a constant per response: {1 - within:.1%} of its energy is each response's mean "
        f"(precision noise puts 1-4% there); the {higher}'s log-probs sit {abs(read.kl):.3g} nats higher on average",
        value=within,
        threshold=OFFSET_WITHIN_MAX,
    )


def _certain(read: _Read, valid_tokens: int) -> Finding | None:
    """certain_tokens_lowered: most of the tokens one side is near-certain of lowered by the other."""
    sides = []
    for side, lowered, sure in (("certain", "rollout", "trainer"), ("rollout_certain", "trainer", "rollout")):
        drop_key, error_key, share_key, lowered_key = CERTAIN_KEYS[side]
        share, most = read.get(share_key), read.get(lowered_key)
        drop, se = read.get(drop_key), read.get(error_key)
        if share is None or most is None or drop is None or se is None or share * valid_tokens < MIN_GROUP_TOKENS:
            continue
        if most > CERTAIN_LOWERED_MIN:
            sides.append((most, drop, se, share, lowered, sure))
    if not sides:
        return None
    most, drop, se, share, lowered, sure = max(sides)
    return emit(
        Code.CERTAIN_TOKENS_LOWERED,
        f"of the tokens the {sure} gives p >= 0.99 ({share:.2%} of the valid tokens), the {lowered} scores {most:.1%} "
        f"more than 0.1 nats lower ({drop:.3g} +- {se:.2g} nats on average, p x {math.exp(-drop):.3g}): no "
        "temperature does that (it leaves near-certain tokens near-certain: 4% of them lowered that much at T = 1.5 "
        "on the tests' model)",
        value=most,
        threshold=CERTAIN_LOWERED_MIN,
    )


def repeats(extras: dict[str, float | None], valid_tokens: int) -> Finding | None:
    """repeated_tokens_lowered, where the token ids were read (``repeat_drop``)."""
    drop, se, share = (extras.get(key) for key in HISTORY_KEYS)
    if drop is None or se is None or share is None or min(share, 1 - share) * valid_tokens < MIN_GROUP_TOKENS:
        return None
    return _repeated(drop, se, share) if _clears(drop, se, REPEAT_DROP_MIN) else None


def _repeated(drop: float, se: float, share: float) -> Finding:
    return emit(
        Code.REPEATED_TOKENS_LOWERED,
        f"the tokens whose id occurred earlier in their response ({share:.1%} of them) get {drop:.3g} +- {se:.2g} nats "
        f"less from the rollout than first occurrences of the same trainer log-prob ({_in_errors(drop, se)}): the "
        "rollout penalises what it has already generated",
        value=drop,
        threshold=REPEAT_DROP_MIN,
    )


def _clears(value: float, se: float, floor: float) -> bool:
    """``value`` above ``floor`` and beyond ``Z`` of its standard errors."""
    return value > floor and value > Z * se


def ratio_excess(read_extras: dict[str, float | None], keys: tuple[str, str]) -> tuple[float, float] | None:
    """(mean - 1, its standard error) of a capped ratio (``RATIO_KEYS``' ``ratio`` or ``reverse``), when known."""
    mean_key, error_key = keys
    mean, se = read_extras.get(mean_key), read_extras.get(error_key)
    if mean is None or se is None:
        return None
    return mean - 1.0, se


def _not_sampled(read: _Read) -> Finding | None:
    excess = ratio_excess(read.extras, RATIO_KEYS["ratio"])
    if excess is None:
        return None
    gap, se = excess
    if not _clears(gap, se, RATIO_OVER_MIN):
        return None
    return emit(
        Code.LOGPROBS_NOT_SAMPLED,
        f"the mean IS ratio pi_train/pi_rollout (capped at e^3) is {1 + gap:.4g} +- {se:.2g}, above 1 by "
        f"{_in_errors(gap, se)}: for tokens drawn from the distribution the rollout reports it is at most 1, "
        "so the rollout's log-probs are not those of the distribution its tokens were drawn from",
        value=1 + gap,
        threshold=1 + RATIO_OVER_MIN,
    )


def _another_token(read: _Read) -> Finding | None:
    """logprobs_of_another_token: many tokens far more likely to the rollout than to the trainer, a good share of them
    the rollout's most likely token, and almost none the other way: the rollout reports a log-prob at least as high
    as the sampled token's, the top-1 token's."""
    above, top1 = read.get(Key.ROLLOUT_FAR_HIGHER_SHARE), read.get(Key.ROLLOUT_FAR_HIGHER_TOP1_SHARE)
    below = read.get(Key.TRAINER_FAR_HIGHER_SHARE)
    if above is None or top1 is None or below is None or above <= FAR_SHARE_MIN or top1 < FAR_TOP1_MIN:
        return None
    if below > FAR_MIRROR_MAX * above:
        return None
    return emit(
        Code.LOGPROBS_OF_ANOTHER_TOKEN,
        f"{above:.1%} of the valid tokens get more than e^2 = 7.4 times the trainer's probability from the rollout "
        f"({top1:.0%} of them at p >= 1/2: its most likely token), {below:.2%} the reverse: the rollout's log-prob is "
        "almost never far below the trainer's, as when it reports the most likely token's instead of the sampled "
        "one's (renormalising over a top-k/top-p set raises a kept token by at most 1/kept mass, a flatter rollout "
        "raises only unlikely tokens, and precision noise moves tokens both ways)",
        value=above,
        threshold=FAR_SHARE_MIN,
    )


def _in_errors(gap: float, se: float) -> str:
    """``gap`` in standard errors, for a message (a single response has none: its spread is unknown)."""
    return f"{gap / se:.3g} standard errors" if se > 0 else "more than its noise (a standard error of 0)"


def swap_consistent(extras: dict[str, float | None]) -> bool:
    """Exchanging the columns makes the dump read as precision noise: the reverse ratio at most 1 within noise and
    no shaped mismatch (a shaped one swapped would still be a bug: raw log-probs, a penalty)."""
    excess = ratio_excess(extras, RATIO_KEYS["reverse"])
    corr = extras.get(Key.SHAPE_CORR)
    if excess is None:
        return False
    gap, se = excess
    return gap <= max(Z * se, RATIO_OVER_MIN) and (corr is None or abs(corr) <= SHAPE_CORR_MAX)


def precision_tests(metrics: dict[str, float | None], extras: dict[str, float | None]) -> tuple[list[str], list[str]]:
    """The precision-noise tests as (passed, failed) sentences; noise is named only when none fails."""
    passed, failed = [], []
    excess = ratio_excess(extras, RATIO_KEYS["ratio"])
    if excess is not None:
        gap, se = excess
        text = f"mean IS ratio {1 + gap:.4g} +- {se:.2g}"
        if -gap > DEFICIT_MIN and -gap > Z * se:
            failed.append(f"{text}: {-gap:.2%} of the trainer's mass is missing on the rollout's support")
        else:
            passed.append(f"{text} (at most 1 on sampled tokens)")
    corr = extras.get(Key.SHAPE_CORR)
    if corr is not None:
        text = f"corr(log-ratio, log-prob) {corr:+.2f}"
        if abs(corr) > SHAPE_CORR_MAX:
            side = "the rollout is sharper" if corr < 0 else "the rollout is flatter or penalised"
            failed.append(f"{text}: the mismatch depends on how likely a token is ({side}), beyond {SHAPE_CORR_MAX}")
        else:
            passed.append(f"{text} (within {SHAPE_CORR_MAX})")
    k3 = metrics.get(Key.K3_KL)
    if k3 is not None:
        if k3 > ENVELOPE_K3:
            failed.append(f"k3_kl {k3:.3g} beyond every published precision range (at most {ENVELOPE_K3:g}, MoE)")
        else:
            passed.append(f"k3_kl {k3:.3g} inside the published precision ranges (at most {ENVELOPE_K3:g})")
    return passed, failed
