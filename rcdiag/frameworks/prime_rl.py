"""prime-rl's mismatch KL and its trust-region masks (PrimeIntellect-ai/prime-rl 559b4477:
``src/prime_rl/trainer/rl/loss.py`` ``compute_importance_ratio_and_mismatch_kl`` :100-106, ``ipo_loss_fn``
:163-196, ``compute_loss`` :262-403; the trainer's ``mismatch_kl/all`` :496-512 of ``trainer/rl/train.py``; the
statistics of ``Tensors.compute_stats`` and the keys ``filter_rl_trainer_tensor_stats_for_wandb`` keeps,
``trainer/utils.py:238-319``).

prime-rl has no separate old-policy recompute: its loss compares the trainer's log-probs with the inference
engine's directly (rcdiag's ``old_log_prob`` and ``rollout_log_prob``; a prime-rl token export writes them as
``trainer_logprobs`` and ``inference_logprobs``). ``mismatch_kl = exp(d) - d - 1`` with ``d = trainer - inference``
in float32, over the flat valid tokens of the step: logged as ``mismatch_kl/all/mean``, ``/std`` (torch's unbiased)
and ``/max`` (the median and min it also computes are filtered out before logging). The loss's per-sample metrics
(each sample's mean, then ``/mean`` and ``/max`` over the step's samples): under the IPO loss (``loss.type =
"ipo"``) a token is masked when ``|exp(trainer) - exp(inference)| > ipo_threshold``, whatever the advantage
(``is_masked``, ``masked_mismatch_kl``, ``unmasked_mismatch_kl``); the default DPPO loss (``default_loss_fn``
:109-159) masks by the advantage's sign (a rise above ``dppo_mask_high`` under a positive one, a fall below
``-dppo_mask_low`` otherwise), so its keys (those three, ``is_masked_high|low``, ``masked_advantage_positive|
negative``) are computed when the dump has the advantages (a prime-rl export holds them per token) and left out
with a note otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rcdiag.catalogue.metrics import framework_note
from rcdiag.frameworks.base import Framework, FrameworkMetrics, MetricKey, Needs, Option, TokenRows, exp32, weight_keys
from rcdiag.frameworks.correction import NO_CLAMP_QUIRK, Band, Correction, Form, Weight
from rcdiag.metrics.base import MetricValue, Moments, Reduce, VerlCrash
from rcdiag.runtime.errors import ConfigError

NAME = "prime-rl"
LOSS = "loss"
KL = "mismatch_kl/all/"
KL_KEYS = (KL + "mean", KL + "std", KL + "max")
SAMPLE = ("is_masked", "masked_mismatch_kl", "unmasked_mismatch_kl")
"""The IPO loss's per-sample metrics, in the (sorted) order ``compute_stats`` gives them."""
DEFAULT_SAMPLE = (
    "is_masked",
    "is_masked_high",
    "is_masked_low",
    "masked_advantage_negative",
    "masked_advantage_positive",
    "masked_mismatch_kl",
    "unmasked_mismatch_kl",
)
"""The default loss's per-sample metrics (from the advantages' sign), in the order ``compute_stats`` gives them."""
FIELDS = {
    "default": ("dppo_mask_low", "dppo_mask_high", "adv_tau", "kl_tau"),
    "ipo": ("ipo_threshold", "adv_tau", "kl_tau"),
}
BLOCK_FIELDS = (
    Option("type", "choice", "default", "default (DPPO-Binary-TV + KL) or ipo", choices=("default", "ipo")),
    Option("dppo_mask_low", "number", 0.2, "default: mask a token whose probability fell more (negative A)"),
    Option("dppo_mask_high", "number", 0.2, "default: mask a token whose probability rose more (positive A)"),
    Option("ipo_threshold", "number", 0.1, "ipo: mask a token whose |probability change| exceeds this"),
    Option("adv_tau", "number", 1.0, "temperature of the advantage term"),
    Option("kl_tau", "number", 1e-3, "temperature of the KL term"),
)


@dataclass(frozen=True)
class PrimeRLSettings:
    kind: str
    threshold: float | None
    block: tuple[tuple[str, Any], ...]

    @property
    def ipo(self) -> bool:
        return self.kind == "ipo"

    def new_metrics(self) -> PrimeRLMetrics:
        return PrimeRLMetrics(self)

    def sample_keys(self) -> tuple[str, ...]:
        """The per-sample metrics of this loss (the default loss's only with the advantages)."""
        return SAMPLE if self.ipo else DEFAULT_SAMPLE

    def needs(self) -> tuple[Needs, ...]:
        if self.ipo:
            return ()
        return (Needs(tuple(f"{name}/{s}" for name in DEFAULT_SAMPLE for s in ("mean", "max")), ("advantages",)),)

    def notes(self) -> tuple[str, ...]:
        notes = [
            "mismatch_kl/all/* are over the valid tokens of the whole step (every micro-batch and rank); prime-rl "
            "also logs mismatch_kl/ENV/* per environment, which a dump does not record",
        ]
        notes.append(
            ("" if self.ipo else "with the advantages, ")
            + f"{', '.join(self.sample_keys())} are each sample's mean, then the /mean and /max over the step's "
            "samples (an empty sample counts, as 0)"
        )
        mask = "IPO mask" if self.ipo else "DPPO mask (by each token's advantage sign)"
        notes.append(
            framework_note(
                NAME,
                f"the unclipped ratio exp(trainer - inference) on each valid token the {mask} keeps, 0 where it masks",
            )
        )
        return tuple(notes)

    def to_dict(self) -> dict[str, Any]:
        return {LOSS: dict(self.block)}

    def correction(self) -> Correction:
        """The IPO loss: each token's own ratio, 0 where |p_train - p_inference| exceeds ``ipo_threshold`` (a band
        on the probability difference; none at 1 or more, which no difference exceeds). The default loss's mask
        reads the advantages' sign: nothing a dump can say."""
        if not self.ipo:
            text = "loss.type default: DPPO masks a token by its advantage's sign and probability change"
            return Correction(Weight("one"), other=(text,))
        assert self.threshold is not None
        label = f"loss.type ipo, ipo_threshold {self.threshold:g}: each ratio, 0 where |p_train - p_inference| > it"
        bands = (Band("diff", -self.threshold, self.threshold, label=label),) if self.threshold < 1 else ()
        return Correction(Weight("token", label=label), bands, quirks=(NO_CLAMP_QUIRK,)).normal()


class PrimeRLMetrics(FrameworkMetrics):
    """One step's ``mismatch_kl/all/*`` and, under the IPO loss, its per-sample metrics."""

    NAME = NAME
    STATES: ClassVar[dict[str, Reduce]] = {
        **FrameworkMetrics.WEIGHT_STATES,
        "kl": "moments",
        "kl_max": "max",
        "samples": "sum",
        **{f"{name}_sum": "sum" for name in DEFAULT_SAMPLE},
        **{f"{name}_max": "max" for name in DEFAULT_SAMPLE},
    }
    settings: PrimeRLSettings

    def update(self, block: Any) -> None:
        rows = TokenRows(block)
        d = rows.diff
        kl = exp32(d) - d - np.float32(1.0)
        if rows.n_tokens:
            x = kl.astype(np.float64)
            mean = float(x.mean())
            self.add(kl=Moments(float(x.size), mean, float(((x - mean) ** 2).sum())), kl_max=float(kl.max()))
        if self.settings.ipo:
            assert self.settings.threshold is not None
            masked = np.abs(exp32(rows.old) - exp32(rows.rollout)) > np.float32(self.settings.threshold)
            flags: dict[str, np.ndarray] = {"is_masked": masked}
        elif rows.advantages is not None:
            flags = self._dppo(rows, rows.advantages)
            masked = flags["is_masked"]
        else:
            return
        n = rows.counts.astype(np.float64)
        n_masked = rows.row_sum(masked.astype(np.float64))
        per_sample = {
            name: rows.row_sum(values.astype(np.float64)) / np.maximum(n, 1.0) for name, values in flags.items()
        }
        if not self.settings.ipo:  # the advantage's sign among the dropped tokens
            for name in ("masked_advantage_negative", "masked_advantage_positive"):
                per_sample[name] = rows.row_sum((flags[name] & masked).astype(np.float64)) / np.maximum(n_masked, 1.0)
        masked_kl = rows.row_sum(np.where(masked, kl, np.float32(0.0)))
        per_sample["masked_mismatch_kl"] = masked_kl / np.maximum(n_masked, 1.0)
        per_sample["unmasked_mismatch_kl"] = rows.row_sum(np.where(masked, np.float32(0.0), kl)) / np.maximum(
            n - n_masked, 1
        )
        self.add(samples=float(rows.n_rows))
        for name in self.settings.sample_keys():
            self.add_spread(name, per_sample[name])
        self.add_weights(np.where(masked, np.float32(0.0), exp32(d)), rows, None)

    def _dppo(self, rows: TokenRows, advantages: np.ndarray) -> dict[str, np.ndarray]:
        """The default loss's masks (``default_loss_fn``): the probability change against its bound on the side of
        the advantage's sign (a zero advantage takes the low side, as ``torch.where(A > 0, high, low)`` does)."""
        block = dict(self.settings.block)
        diff = exp32(rows.old) - exp32(rows.rollout)
        high = diff > np.float32(block["dppo_mask_high"])
        low = diff < -np.float32(block["dppo_mask_low"])
        positive, negative = advantages > 0, advantages < 0
        return {
            "is_masked": np.where(positive, high, low),
            "is_masked_high": positive & high,
            "is_masked_low": negative & low,
            "masked_advantage_negative": negative,
            "masked_advantage_positive": positive,
        }

    def keys(self) -> list[str]:
        """In ``compute_stats``' sorted order: the per-sample keys before ``mismatch_kl/all``, then
        ``unmasked_mismatch_kl``."""
        names = self.settings.sample_keys()
        head = [f"{name}/{s}" for name in names[:-1] for s in ("mean", "max")]
        return [*head, *KL_KEYS, f"{names[-1]}/mean", f"{names[-1]}/max", *self.weight_keys()]

    def compute(self) -> tuple[dict[str, MetricValue], list[VerlCrash]]:
        """prime-rl's values (NaN, here ``None``, for a step without a valid token) and rcdiag's."""
        st = self.state
        moments: Moments = st["kl"]
        n = moments.n
        values: dict[str, MetricValue] = {
            KL_KEYS[0]: moments.mean if n else None,
            KL_KEYS[1]: math.sqrt(max(moments.m2, 0.0) / (n - 1)) if n > 1 else None,
            KL_KEYS[2]: st["kl_max"] if n else None,
        }
        samples = st["samples"]
        if not samples and not self.settings.ipo:  # the default loss without the advantages
            return values, []
        for name in self.settings.sample_keys():
            values[f"{name}/mean"] = st[f"{name}_sum"] / samples if samples else None
            values[f"{name}/max"] = st[f"{name}_max"] if samples else None
        ordered = {key: values[key] for key in self.keys() if key in values}
        return {**ordered, **self.weight_values()}, []


def settings(values: Mapping[str, Any], given: frozenset[str] = frozenset()) -> PrimeRLSettings:
    """pydantic's checks of ``DefaultLossConfig`` / ``IPOLossConfig``: each field >= 0, no field of the other type
    (set to other than its default)."""
    block = dict(values[LOSS])
    kind = block["type"]
    defaults = {f.key: f.default for f in BLOCK_FIELDS}
    for field in sorted({*FIELDS["default"], *FIELDS["ipo"]}):
        if field not in FIELDS[kind] and block[field] != defaults[field]:
            raise ConfigError(f"{LOSS}.{field}: Extra inputs are not permitted (the {kind} loss has no {field})")
        if block[field] < 0:
            raise ConfigError(f"{LOSS}.{field}: Input should be greater than or equal to 0, got {block[field]}")
    kept = {"type": kind, **{field: block[field] for field in FIELDS[kind]}}
    return PrimeRLSettings(kind, block["ipo_threshold"] if kind == "ipo" else None, tuple(kept.items()))


def _ipo(low: float | None, high: float | None) -> dict[str, Any] | None:
    """A band on p_train - p_inference as IPO's threshold: symmetric (the wider side's bound), 1 for none."""
    sides = [abs(b) for b in (low, high) if b is not None]
    threshold = min(max(sides), 1.0) if sides else 1.0
    return {LOSS: {"type": "ipo", "ipo_threshold": threshold}}


FORMS = (
    Form("token", "band", _ipo, statistic="diff"),
    Form("token", "none", lambda low, high: _ipo(None, None)),
)
"""The IPO loss (its threshold 1 masks nothing); the default loss's mask needs the advantages."""

FRAMEWORK = Framework(
    name=NAME,
    title="prime-rl",
    release="559b4477",
    source=(
        "src/prime_rl/trainer/rl/loss.py:100-106, 163-196, 262-403; src/prime_rl/trainer/rl/train.py:496-512; "
        "src/prime_rl/trainer/utils.py:263-276, 284-321; packages/prime-rl-configs/src/prime_rl/configs/trainer.py:"
        "494-520"
    ),
    options=(
        Option(
            LOSS, "block", {f.key: f.default for f in BLOCK_FIELDS}, "the RL loss (trainer.loss)", fields=BLOCK_FIELDS
        ),
    ),
    keys=(
        MetricKey(
            "is_masked/mean",
            "mean over samples of the share of each one's valid tokens the mask drops",
            "loss.type ipo; default with the advantages",
        ),
        MetricKey("is_masked/max", "largest such share", "loss.type ipo; default with the advantages"),
        MetricKey(
            "is_masked_high/mean",
            "mean over samples of the share of valid tokens masked for a rise above dppo_mask_high (A > 0)",
            "loss.type default, with the advantages",
        ),
        MetricKey("is_masked_high/max", "largest such share", "loss.type default, with the advantages"),
        MetricKey(
            "is_masked_low/mean",
            "mean over samples of the share of valid tokens masked for a fall below -dppo_mask_low (A < 0)",
            "loss.type default, with the advantages",
        ),
        MetricKey("is_masked_low/max", "largest such share", "loss.type default, with the advantages"),
        MetricKey(
            "masked_advantage_negative/mean",
            "mean over samples of the share of masked tokens with a negative advantage",
            "loss.type default, with the advantages",
        ),
        MetricKey("masked_advantage_negative/max", "largest such share", "loss.type default, with the advantages"),
        MetricKey(
            "masked_advantage_positive/mean",
            "mean over samples of the share of masked tokens with a positive advantage",
            "loss.type default, with the advantages",
        ),
        MetricKey("masked_advantage_positive/max", "largest such share", "loss.type default, with the advantages"),
        MetricKey(
            "masked_mismatch_kl/mean",
            "mean over samples of each one's mismatch_kl on the masked tokens",
            "loss.type ipo; default with the advantages",
        ),
        MetricKey("masked_mismatch_kl/max", "largest such mean", "loss.type ipo; default with the advantages"),
        MetricKey(KL_KEYS[0], "mean of exp(d) - d - 1, d = trainer - inference, over the step's valid tokens"),
        MetricKey(KL_KEYS[1], "its standard deviation (unbiased)"),
        MetricKey(KL_KEYS[2], "its largest value"),
        MetricKey(
            "unmasked_mismatch_kl/mean",
            "mean over samples of each one's mismatch_kl on the kept tokens",
            "loss.type ipo; default with the advantages",
        ),
        MetricKey("unmasked_mismatch_kl/max", "largest such mean", "loss.type ipo; default with the advantages"),
        *weight_keys(NAME, "prime-rl", "loss-mask token", "prime-rl's IPO mask"),
    ),
    settings=settings,
    prefixes=("trainer.",),
    left_out=(
        "left out: mismatch_kl per environment (the dump has no environment names), kl_ent_ratio and entropy "
        "(the entropy) and loss (the whole loss)"
    ),
    batching="one training step (every micro-batch and rank of it)",
    forms=FORMS,
    spelling="toml",
)
