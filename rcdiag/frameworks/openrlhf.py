"""OpenRLHF 0.11.0's vLLM importance-sampling correction (``openrlhf/models/loss.py:116-230``, ``PolicyLoss``; the
logging in ``openrlhf/trainer/ray/ppo_actor.py:197-221, 306-317``).

With ``--algo.advantage.is_correction_enable`` (off by default) and the PPO loss, each token's loss is multiplied
by a coefficient from ``r = exp(old - rollout)`` (float32, no clamp on the log): ``tis`` clamps r to [low, high],
``icepop`` zeroes it outside [low, high], ``seq-mask-tis`` keeps the raw token r where the row's geometric mean
ratio ``exp(masked mean of old - rollout)`` lies in [low, high] and zeroes the row otherwise. The one key it logs
is ``vllm_kl``: the masked mean of ``rollout - old`` (signed k1, no clamp), per micro-batch, which the actor
weights by each micro-batch's action tokens, so a step's value is the token mean of the step, however it was cut.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rcdiag.core import formulas
from rcdiag.frameworks.base import Framework, FrameworkMetrics, MetricKey, Option, TokenRows, exp32, weight_keys
from rcdiag.frameworks.correction import NO_CLAMP_QUIRK, Band, Correction, Form, Weight
from rcdiag.metrics.base import MetricValue, Reduce, VerlCrash

TYPES = ("tis", "icepop", "seq-mask-tis")
ENABLE = "algo.advantage.is_correction_enable"
THRESHOLD = "algo.advantage.is_correction_threshold"
TYPE = "algo.advantage.is_correction_type"
LOSS = "actor.policy_loss_type"
VLLM_KL = "vllm_kl"


@dataclass(frozen=True)
class OpenRLHFSettings:
    enable: bool
    low: float
    high: float
    kind: str
    loss: str

    @property
    def corrects(self) -> bool:
        """``PolicyLoss`` applies the correction (and returns ``vllm_kl``) only for the PPO loss."""
        return self.enable and self.loss == "ppo"

    def new_metrics(self) -> OpenRLHFMetrics | None:
        return OpenRLHFMetrics(self) if self.corrects else None

    def notes(self) -> tuple[str, ...]:
        if not self.enable:
            return (f"{ENABLE} is false (OpenRLHF's default): it corrects nothing and logs no mismatch key",)
        if self.loss != "ppo":
            return (f"{LOSS}={self.loss}: OpenRLHF 0.11.0 applies its IS correction and logs vllm_kl only for ppo",)
        return (
            "vllm_kl is the token mean of the step (OpenRLHF weights each micro-batch's mean by its action tokens); "
            "a micro-batch without an action token would make OpenRLHF's value NaN",
            "rcdiag/openrlhf/* are rcdiag's: the coefficient PolicyLoss puts on each action token's loss",
        )

    def to_dict(self) -> dict[str, Any]:
        return {ENABLE: self.enable, THRESHOLD: [self.low, self.high], TYPE: self.kind, LOSS: self.loss}

    def correction(self) -> Correction:
        if not self.enable:
            return Correction(Weight("one", label=f"{ENABLE}: false (no correction)"))
        if self.loss != "ppo":
            return Correction(Weight("one", label=f"{LOSS}: {self.loss} (no IS correction)"))
        label = f"is_correction_type {self.kind} [{self.low:g}, {self.high:g}]"
        quirks = (NO_CLAMP_QUIRK,)
        if self.kind == "tis":
            weight = Weight("token", self.low, self.high, label=label + ": each token's ratio clamped (two-sided)")
            return Correction(weight, quirks=quirks).normal()
        statistic = "ratio" if self.kind == "icepop" else "geomean"
        band = Band(statistic, self.low, self.high, label=label)
        return Correction(Weight("token", label=label), (band,), quirks=quirks).normal()

    def weights(self, rows: TokenRows) -> np.ndarray:
        """The coefficient on each valid token's loss (float32, bounds compared in float32 as torch does)."""
        low, high = np.float32(self.low), np.float32(self.high)
        ratio = exp32(rows.diff)
        if self.kind == "tis":
            return np.minimum(np.maximum(ratio, low), high)
        if self.kind == "icepop":
            return ratio * formulas.rs_keep(ratio, low, high, True).astype(np.float32)  # inf * 0 is NaN, as in torch
        mean = (rows.row_sum(rows.diff).astype(np.float32) / rows.counts.astype(np.float32)).astype(np.float32)
        seq = exp32(mean)
        keep = formulas.rs_keep(seq, low, high, True).astype(np.float32)
        return rows.per_token(keep) * ratio


class OpenRLHFMetrics(FrameworkMetrics):
    """One step's ``vllm_kl`` and rcdiag's token-weighted reading of the coefficients."""

    NAME = "openrlhf"
    STATES: ClassVar[dict[str, Reduce]] = {**FrameworkMetrics.WEIGHT_STATES, "kl_sum": "sum"}
    settings: OpenRLHFSettings

    def update(self, block: Any) -> None:
        rows = TokenRows(block)
        weight = self.settings.weights(rows)
        self.add(kl_sum=float((rows.rollout - rows.old).astype(np.float64).sum()))
        changed = None
        if self.settings.kind == "tis":  # where the clamp moved the ratio
            ratio = exp32(rows.diff)
            changed = (weight != ratio) & ~np.isnan(ratio)
        self.add_weights(weight, rows, changed)

    def keys(self) -> list[str]:
        return [VLLM_KL, *self.weight_keys()]

    def compute(self) -> tuple[dict[str, MetricValue], list[VerlCrash]]:
        """A step without a valid token is NaN in OpenRLHF (0/0); ``None`` here."""
        st = self.state
        n = st["tokens"]
        return {VLLM_KL: st["kl_sum"] / n if n else None, **self.weight_values()}, []


def settings(values: Mapping[str, Any], given: frozenset[str] = frozenset()) -> OpenRLHFSettings:
    low, high = values[THRESHOLD]
    return OpenRLHFSettings(values[ENABLE], low, high, values[TYPE], values[LOSS])


def _kind(kind: str) -> Callable[[float | None, float | None], dict[str, Any] | None]:
    """This correction type with the bounds given (no upper bound: none OpenRLHF can take; no lower bound: 0)."""

    def options(low: float | None, high: float | None) -> dict[str, Any] | None:
        if high is None:
            return None
        return {ENABLE: True, TYPE: kind, THRESHOLD: [0.0 if low is None else low, high]}

    return options


FORMS = (
    Form("one", "none", lambda low, high: {ENABLE: False}),
    Form("token", "clamp", _kind("tis")),
    Form("token", "band", _kind("icepop"), statistic="ratio"),
    Form("token", "band", _kind("seq-mask-tis"), statistic="geomean"),
)

FRAMEWORK = Framework(
    name="openrlhf",
    title="OpenRLHF",
    release="0.11.0",
    source="openrlhf/models/loss.py:116-230 (PolicyLoss); openrlhf/trainer/ray/ppo_actor.py:197-221, 306-317",
    options=(
        Option(ENABLE, "bool", False, "apply the vLLM IS correction (and log vllm_kl)"),
        Option(THRESHOLD, "pair", (0.5, 5.0), "[low, high] bounds of the coefficient"),
        Option(
            TYPE,
            "choice",
            "tis",
            "tis: clamp; icepop: zero outside; seq-mask-tis: zero rows by geometric mean",
            choices=TYPES,
        ),
        Option(LOSS, "choice", "ppo", "the policy loss (the correction applies to ppo only)", choices=("ppo", "gspo")),
    ),
    keys=(
        MetricKey(VLLM_KL, "token mean of rollout - old: ~KL(rollout||train), signed, not clamped"),
        *weight_keys("openrlhf", "OpenRLHF", "action token", "OpenRLHF's correction"),
    ),
    settings=settings,
    left_out=(
        "left out: ppo_kl, ppo_clip_ratio and policy_loss compare the current policy with the old one and "
        "need advantages: a dump of the two engines holds neither"
    ),
    batching="one PPO training step (ppo_train over the step's experience; micro-batches token-weighted)",
    forms=FORMS,
    spelling="flags",
)
