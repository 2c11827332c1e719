"""OpenRLHF 0.11.0's vLLM importance-sampling correction (``openrlhf/models/loss.py:116-230``, ``PolicyLoss``; the
logging in ``openrlhf/trainer/ray/ppo_actor.py:197-221, 306-317``).

With ``--algo.advantage.is_correction_enable`` (off by default) and the PPO loss, each token's loss is multiplied
by a coefficient from ``r = exp(old - rollout)`` (float32, no clamp on the log): ``tis`` clamps r to [low, high],
``icepop`` zeroes it outside [low, high], ``seq-mask-tis`` keeps the raw token r where the row's geometric mean
ratio ``exp(masked mean of old - rollout)`` lies in [low, high] and zeroes the row otherwise. The one key it logs
is ``vllm_kl``: the masked mean of ``rollout - old`` (signed k1, no clamp), per micro-batch, which the actor
weights by each micro-batch's action tokens, so a step's value is the token mean of the step, however it was cut.

With the current policy's log-probs and the advantages, ``policy_loss``: ``PolicyLoss``'s own loss (the clipped
surrogate, dual-clip with ``actor.dual_clip``, times the correction's coefficient where it applies), aggregated as
``aggregate_loss`` does for the step as one micro-batch and one optimizer step: the token mean for ppo, the mean
over the responses with an action token of each one's token mean for gspo.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rcdiag.catalogue.metrics import framework_note
from rcdiag.core import formulas
from rcdiag.frameworks.base import (
    Framework,
    FrameworkMetrics,
    MetricKey,
    Needs,
    Option,
    TokenRows,
    exp32,
    weight_keys,
)
from rcdiag.frameworks.correction import NO_CLAMP_QUIRK, Band, Correction, Form, Weight
from rcdiag.frameworks.loss import ppo_clip
from rcdiag.metrics.base import MetricValue, Reduce, VerlCrash
from rcdiag.runtime.errors import ConfigError

TYPES = ("tis", "icepop", "seq-mask-tis")
ENABLE = "algo.advantage.is_correction_enable"
THRESHOLD = "algo.advantage.is_correction_threshold"
TYPE = "algo.advantage.is_correction_type"
LOSS = "actor.policy_loss_type"
EPS = "actor.eps_clip"
EPS_PAIR = "actor.eps_clip_low_high"
VLLM_KL = "vllm_kl"
CLIP_RATIO = "ppo_clip_ratio"
PPO_KL = "ppo_kl"
POLICY_LOSS = "policy_loss"
DUAL_CLIP = "actor.dual_clip"
NEEDS = (Needs((PPO_KL,), ("log_prob",)), Needs((POLICY_LOSS, CLIP_RATIO), ("log_prob", "advantages")))


@dataclass(frozen=True)
class OpenRLHFSettings:
    enable: bool
    low: float
    high: float
    kind: str
    loss: str
    eps_low: float = 0.2
    eps_high: float = 0.2
    dual_clip: float | None = None

    @property
    def corrects(self) -> bool:
        """``PolicyLoss`` applies the correction (and returns ``vllm_kl``) only for the PPO loss."""
        return self.enable and self.loss == "ppo"

    def new_metrics(self) -> OpenRLHFMetrics:
        """Always: ``ppo_kl`` and ``ppo_clip_ratio`` are logged whatever the correction (from the loss inputs)."""
        return OpenRLHFMetrics(self)

    def needs(self) -> tuple[Needs, ...]:
        return NEEDS

    def notes(self) -> tuple[str, ...]:
        loss = (
            f"{PPO_KL} and {CLIP_RATIO} are token means of the step, as {VLLM_KL}; OpenRLHF averages them over its "
            "max_epochs passes, each with the policy of that pass: rcdiag's are of the current policy the dump holds",
            f"{POLICY_LOSS} is aggregate_loss's for the step as one micro-batch and one optimizer step; OpenRLHF "
            "divides each micro-batch's masked sum by the optimizer step's action tokens (gspo: responses), so a step "
            "cut into several micro-batches or optimizer steps logs other numbers",
        )
        if not self.enable:
            return (f"{ENABLE} is false (OpenRLHF's default): it corrects nothing and logs no mismatch key", *loss)
        if self.loss != "ppo":
            return (
                f"{LOSS}={self.loss}: OpenRLHF 0.11.0 applies its IS correction and logs vllm_kl only for ppo "
                "(gspo's ratio then starts from the rollout's log-probs)",
                *loss,
            )
        return (
            *loss,
            "vllm_kl is the token mean of the step (OpenRLHF weights each micro-batch's mean by its action tokens); "
            "a micro-batch without an action token would make OpenRLHF's value NaN",
            framework_note("openrlhf", "the coefficient PolicyLoss puts on each action token's loss"),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            ENABLE: self.enable,
            THRESHOLD: [self.low, self.high],
            TYPE: self.kind,
            LOSS: self.loss,
            EPS_PAIR: [self.eps_low, self.eps_high],
            DUAL_CLIP: self.dual_clip,
        }

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
    """One step's ``vllm_kl``, rcdiag's token-weighted reading of the coefficients, and the loss's ``ppo_kl`` and
    ``ppo_clip_ratio`` where the dump has their inputs."""

    NAME = "openrlhf"
    STATES: ClassVar[dict[str, Reduce]] = {
        **FrameworkMetrics.WEIGHT_STATES,
        "kl_sum": "sum",
        "loss_tokens": "sum",
        "loss_seen": "sum",
        "ppo_kl_sum": "sum",
        "clip_seen": "sum",
        "clipped": "sum",
        "loss_sum": "sum",
        "loss_rows": "sum",
    }
    settings: OpenRLHFSettings

    def update(self, block: Any) -> None:
        rows = TokenRows(block)
        weight = self.settings.weights(rows) if self.settings.corrects else None
        if rows.current is not None:
            self._loss(rows, rows.current, rows.advantages, weight)
        if weight is None:
            return
        self.add(kl_sum=float((rows.rollout - rows.old).astype(np.float64).sum()))
        changed = None
        if self.settings.kind == "tis":  # where the clamp moved the ratio
            ratio = exp32(rows.diff)
            changed = (weight != ratio) & ~np.isnan(ratio)
        self.add_weights(weight, rows, changed)

    def _loss(
        self, rows: TokenRows, current: np.ndarray, advantages: np.ndarray | None, weight: np.ndarray | None
    ) -> None:
        """``PolicyLoss``'s ``ppo_kl`` (the mean of ``-(current - old)``) and, with the advantages, its clip flags
        ``surr2 < surr1`` (float32, the bounds rounded to float32 as torch's clamp does) and its loss (times the
        correction's coefficient ``weight`` where it applies; gspo: each response's token mean)."""
        s = self.settings
        raw = current - rows.old
        self.add(
            loss_seen=float(rows.n_rows),
            loss_tokens=float(rows.n_tokens),
            ppo_kl_sum=float((-raw).astype(np.float64).sum()),
        )
        if advantages is None:
            return
        if s.loss == "ppo":
            ratio = exp32(formulas.clamp_log_ratio(np, raw).astype(np.float32))  # PolicyLoss's clamp at +-20
        else:  # gspo: one ratio per response, exp of its mean log-ratio (against the rollout where it corrects)
            ratio = rows.per_token(exp32(rows.row_mean(current - rows.rollout if s.enable else raw)))
        loss, binds = ppo_clip(ratio, advantages, s.eps_low, s.eps_high)
        if s.dual_clip is not None:  # -max(min(surr1, surr2), dual_clip * A) where A < 0
            loss = np.where(advantages < 0, np.minimum(loss, -(np.float32(s.dual_clip) * advantages)), loss)
        if weight is not None:
            loss = weight * loss
        if s.loss == "ppo":
            total, counted = float(loss.astype(np.float64).sum()), float(rows.n_tokens)
        else:
            filled = rows.counts > 0
            means = rows.row_sum(loss)[filled] / rows.counts[filled]
            total, counted = float(means.sum()), float(np.count_nonzero(filled))
        self.add(
            clip_seen=float(rows.n_rows), clipped=float(np.count_nonzero(binds)), loss_sum=total, loss_rows=counted
        )

    def keys(self) -> list[str]:
        own = [VLLM_KL, *self.weight_keys()] if self.settings.corrects else []
        return [POLICY_LOSS, CLIP_RATIO, PPO_KL, *own]

    def compute(self) -> tuple[dict[str, MetricValue], list[VerlCrash]]:
        """A step without a valid token is NaN in OpenRLHF (0/0); ``None`` here. The loss's keys only where every
        block had their inputs."""
        st = self.state
        values: dict[str, MetricValue] = {}
        loss_n = st["loss_tokens"]
        if st["loss_seen"] and st["clip_seen"] == st["loss_seen"]:
            values[POLICY_LOSS] = st["loss_sum"] / st["loss_rows"] if st["loss_rows"] else None
            values[CLIP_RATIO] = st["clipped"] / loss_n if loss_n else None
        if st["loss_seen"]:
            values[PPO_KL] = st["ppo_kl_sum"] / loss_n if loss_n else None
        if self.settings.corrects:
            n = st["tokens"]
            values.update({VLLM_KL: st["kl_sum"] / n if n else None, **self.weight_values()})
        return values, []


def settings(values: Mapping[str, Any], given: frozenset[str] = frozenset()) -> OpenRLHFSettings:
    """``train_ppo_ray``'s resolution of the clip: ``eps_clip_low_high`` where given, else ``eps_clip`` both sides."""
    low, high = values[THRESHOLD]
    pair = values[EPS_PAIR]
    eps_low, eps_high = (values[EPS], values[EPS]) if pair is None else pair
    dual = values[DUAL_CLIP]
    if dual is not None and not dual > 1.0:
        raise ConfigError(f"{DUAL_CLIP}={dual:g}: dual_clip must be > 1.0 (PolicyLoss asserts it)")
    return OpenRLHFSettings(values[ENABLE], low, high, values[TYPE], values[LOSS], eps_low, eps_high, dual)


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
    source="openrlhf/models/loss.py:11-39, 116-230 (aggregate_loss, PolicyLoss); "
    "openrlhf/trainer/ray/ppo_actor.py:197-221, 306-317",
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
        Option(EPS, "number", 0.2, "PPO clip range, both sides (where eps_clip_low_high is not given)"),
        Option(EPS_PAIR, "pair", None, "PPO clip [low, high]: the ratio clamped to [1 - low, 1 + high]", nullable=True),
        Option(
            DUAL_CLIP, "number", None, "dual-clip PPO's bound (above 1) on a negative advantage's loss", nullable=True
        ),
    ),
    keys=(
        MetricKey(VLLM_KL, "token mean of rollout - old: ~KL(rollout||train), signed, not clamped"),
        MetricKey(
            CLIP_RATIO,
            "token mean of surr2 < surr1: the share of action tokens whose PPO clip binds (ratio current/old beyond "
            "[1 - eps_low, 1 + eps_high] on the advantage's side)",
            "with the current policy and the advantages, whatever the correction",
        ),
        MetricKey(
            POLICY_LOSS,
            "PolicyLoss's loss: -min(surr1, surr2) (dual-clip with actor.dual_clip) times the correction's "
            "coefficient, the token mean (gspo: the mean of each response's token mean)",
            "with the current policy and the advantages, whatever the correction",
        ),
        MetricKey(
            PPO_KL,
            "token mean of old - current (k1 of the old policy against the current one)",
            "with the current policy, whatever the correction",
        ),
        *weight_keys("openrlhf", "OpenRLHF", "action token", "OpenRLHF's correction"),
    ),
    settings=settings,
    left_out="left out: kl (the reference model's log-probs) and entropy_loss (the entropies)",
    batching="one PPO training step (ppo_train over the step's experience; micro-batches token-weighted)",
    forms=FORMS,
    spelling="flags",
)
