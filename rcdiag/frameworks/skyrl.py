"""SkyRL's off-policy correction (NovaSky-AI/SkyRL a9564572e: ``compute_off_policy_correction``,
``skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py:257-348``, called by every policy loss of
``ppo_utils.py``; its metrics logged under ``policy/loss_metrics/``) and the trainer's
``policy/rollout_train_logprobs_abs_diff_*`` (``skyrl/train/trainer.py:1383-1406``).

Per token ``ratio = exp(clamp(old - rollout, -20, 20))`` in float32 (``safe_exp_delta``). With any of the
corrections set (``trainer.algorithm.off_policy_correction``: all off by default) SkyRL logs ``is_ratio_mean`` (a
masked token mean) and ``is_ratio_std|max|min`` of ``ratio * loss_mask`` over the whole padded (B, T) tensor, each
pad a 0 (padding-dependent: rcdiag pads the step to its longest row), then in this order: the outlier veto (a row
with any valid token's ratio outside [low, high] leaves the loss mask), the per-token mask (a token outside
[low, high] leaves it), the truncated weight (``token``: each ratio clamped from above; ``sequence``: the row's
``exp(clamp(sum))`` clamped from above, both on the mask left by the two before) and the sequence mask
(``geometric``: ``exp(clamp(sum / count))``; ``product``: ``exp(clamp(sum))``, a row outside [low, high] leaves
the mask). Every fraction of rows is over all B rows of the batch (an empty row's ratio is 1). The trainer logs
the four ``rollout_train_logprobs_abs_diff`` keys of |old - rollout| over the valid tokens of the whole training
batch whatever the correction (none when it has no valid token; torch's unbiased std).

With the current policy's log-probs in the dump (``--current-col``), the worker's
``policy/minibatch_rollout_logprobs_abs_diff_*`` (``compute_minibatch_rollout_logprob_diff_metrics``,
``skyrl/backends/skyrl_train/workers/worker_utils.py:34-58``, called at ``worker.py:1125-1127``), whatever the
correction: |current - rollout| per micro-batch (the step as one), ``_mean`` its masked token mean (0 without a valid
token), ``_max`` and ``_min`` of ``|current - rollout| * loss_mask`` over the padded (B, T) tensor (every pad and
masked position a 0), and ``_std`` as the trainer rebuilds it from the float32 mean and mean square
(``finalize_minibatch_rollout_logprob_diff_std``, ``skyrl/train/utils/trainer_utils.py:38-53``):
``sqrt(max(0, sq_mean - mean^2))``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from rcdiag.catalogue.metrics import framework_note
from rcdiag.core.limits import SAFETY_BOUND
from rcdiag.frameworks.base import (
    Framework,
    FrameworkMetrics,
    MetricKey,
    Needs,
    Option,
    TokenRows,
    exp32,
    f32,
    weight_keys,
)
from rcdiag.frameworks.correction import CLAMP_QUIRK, Band, Correction, Form, Weight, within_clamp
from rcdiag.metrics.base import MetricValue, Moments, Reduce, VerlCrash

BLOCK = "trainer.algorithm.off_policy_correction"
USE_TIS = "trainer.algorithm.use_tis"
CAP = "trainer.algorithm.tis_imp_ratio_cap"
LOSS = "policy/loss_metrics/"
DIFF = "policy/rollout_train_logprobs_abs_diff_"
DIFF_KEYS = tuple(DIFF + s for s in ("max", "min", "mean", "std"))
IS_KEYS = tuple(f"{LOSS}is_ratio_{s}" for s in ("mean", "std", "max", "min"))
MINIBATCH = "policy/minibatch_rollout_logprobs_abs_diff_"
MINIBATCH_KEYS = tuple(MINIBATCH + s for s in ("mean", "max", "min", "std"))
"""In the order the trainer logs them (the worker's mean, max, min; the std rebuilt from the moments last)."""
NEEDS = (Needs(MINIBATCH_KEYS, ("log_prob",)),)
OUTLIER_KEYS = tuple(f"{LOSS}outlier_seq_{s}_ratio" for s in ("masked", "over_high", "under_low"))
TOKEN_MASK = LOSS + "token_mask_ratio"
TIS_KEYS = {"token": LOSS + "tis_token_clip_high_ratio", "sequence": LOSS + "tis_seq_clip_high_ratio"}
SEQ_PREFIX = {"geometric": "geo", "product": "product"}
FIELDS = (
    Option("tis_ratio_type", "choice", None, "truncated IS weight: token or sequence; null: off",
           choices=("token", "sequence"), nullable=True),
    Option("token_tis_ratio_clip_high", "number", 2.0, "upper clamp of the token weight"),
    Option("sequence_tis_ratio_clip_high", "number", 5.0, "upper clamp of the sequence weight"),
    Option("sequence_mask_metric", "choice", None, "mask rows by their geometric-mean or product ratio; null: off",
           choices=("geometric", "product"), nullable=True),
    Option("geo_mask_high", "number", 1.01, "geometric: upper bound"),
    Option("geo_mask_low", "number", 0.99, "geometric: lower bound"),
    Option("product_mask_high", "number", 2.0, "product: upper bound"),
    Option("product_mask_low", "number", 0.5, "product: lower bound"),
    Option("outlier_token_is_threshold_low", "number", None, "veto a row with a token ratio below", nullable=True),
    Option("outlier_token_is_threshold_high", "number", None, "veto a row with a token ratio above", nullable=True),
    Option("token_mask_is_threshold_low", "number", None, "mask a token whose ratio is below (with high)",
           nullable=True),
    Option("token_mask_is_threshold_high", "number", None, "mask a token whose ratio is above (with low)",
           nullable=True),
)  # fmt: skip


@dataclass(frozen=True)
class SkyRLSettings:
    """``OffPolicyCorrectionConfig`` after ``validate_cfg`` (the deprecated ``use_tis`` folded in)."""

    tis: str | None
    token_cap: float
    sequence_cap: float
    sequence_mask: str | None
    mask_low: float
    mask_high: float
    outlier_low: float | None
    outlier_high: float | None
    token_low: float | None
    token_high: float | None
    block: tuple[tuple[str, Any], ...]

    @property
    def outlier(self) -> bool:
        return self.outlier_low is not None or self.outlier_high is not None

    @property
    def token_mask(self) -> bool:
        return self.token_low is not None and self.token_high is not None

    @property
    def enabled(self) -> bool:
        """``off_policy_correction_enabled``: any correction set (else SkyRL logs no ``loss_metrics`` key)."""
        return self.tis is not None or self.sequence_mask is not None or self.outlier or self.token_mask

    def new_metrics(self) -> SkyRLMetrics:
        return SkyRLMetrics(self)

    def needs(self) -> tuple[Needs, ...]:
        return NEEDS

    def notes(self) -> tuple[str, ...]:
        notes = [
            "policy/rollout_train_logprobs_abs_diff_* are over the valid tokens of the whole training batch (the "
            "dump step); SkyRL logs none for a batch without a valid token",
            "policy/minibatch_rollout_logprobs_abs_diff_* (with the current policy) are SkyRL's per micro-batch "
            "values, averaged over the step's micro-batches, mini-batches and epochs (min of _min, max of _max, "
            "the std rebuilt from the averaged moments), each with the policy of its pass: rcdiag gives the step as "
            "one micro-batch of the one current policy the dump holds; _max and _min are over the padded (B, T) "
            "tensor with every pad and masked position a 0",
        ]
        if not self.enabled:
            notes.append(
                f"no {BLOCK} setting is on (SkyRL's default): it corrects nothing and logs no loss_metrics key"
            )
            return tuple(notes)
        notes.append(
            "loss_metrics/* are SkyRL's per micro-batch values, averaged over the step's micro-batches (min of the "
            "_min keys, max of the _max keys) and data-parallel ranks: rcdiag gives the step as one micro-batch; "
            "is_ratio_std, is_ratio_max and is_ratio_min are over the padded (B, T) tensor with every pad and "
            "masked position a 0, so they depend on the padding: rcdiag pads the step to its longest row (and "
            "all steps pooled to the longest of the dump)"
        )
        notes.append(framework_note("skyrl", "the truncated weight times the loss mask SkyRL keeps, per token"))
        return tuple(notes)

    def to_dict(self) -> dict[str, Any]:
        return {BLOCK: dict(self.block)}

    def correction(self) -> Correction:
        """Its weight (token or sequence TIS: clamped from above) and masks (the outlier veto on every token's
        ratio, the token mask, the geometric or product sequence mask), each a band; the log-ratio clamped at +-20
        as verl's; what it masks leaves the loss mask."""
        quirks = (CLAMP_QUIRK, "takes a masked token out of the loss mask (its token mean divides by the kept ones)")
        label = f"{BLOCK}: " + ", ".join(f"{k}={_shown(v)}" for k, v in self.block if v != _DEFAULTS[k])
        if not self.enabled:
            return Correction(Weight("one", label=f"{BLOCK}: every correction off (no weight, nothing masked)"))
        weight = Weight("one", label=label)
        if self.tis == "token":
            weight = Weight("token", None, self.token_cap, label=label)
        elif self.tis == "sequence":
            weight = Weight("product", None, self.sequence_cap, label=label)
        bands = []
        if self.outlier:
            bands.append(Band("all_ratios", self.outlier_low, self.outlier_high, label=label))
        if self.token_mask:
            bands.append(Band("ratio", self.token_low, self.token_high, label=label))
        if self.sequence_mask is not None:
            statistic = "geomean" if self.sequence_mask == "geometric" else "product"
            bands.append(Band(statistic, self.mask_low, self.mask_high, label=label))
        other: tuple[str, ...] = ()
        if self.token_mask and (self.tis == "sequence" or self.sequence_mask is not None):
            other = (f"{label}: the sequence weight or mask over the tokens its token mask keeps, not the response",)
        weight = replace(weight, high=None) if weight.high is not None and weight.high > CLAMP_HIGH else weight
        return Correction(weight, tuple(within_clamp(b) for b in bands), other=other, quirks=quirks).normal()


class SkyRLMetrics(FrameworkMetrics):
    """One step's ``policy/rollout_train_logprobs_abs_diff_*`` and ``policy/loss_metrics/*`` keys."""

    NAME = "skyrl"
    STATES: ClassVar[dict[str, Reduce]] = {
        **FrameworkMetrics.WEIGHT_STATES,
        "rows": "sum",
        "width": "max",
        "diff_sum": "sum",
        "diff_min": "min",
        "diff_max": "max",
        "diff": "moments",
        "ratio_sum": "sum",
        "ratio": "moments",
        "ratio_min": "min",
        "ratio_max": "max",
        "outlier_masked": "sum",
        "outlier_high": "sum",
        "outlier_low": "sum",
        "token_masked": "sum",
        "token_valid": "sum",
        "tis_clipped": "sum",
        "tis_valid": "sum",
        "seq_masked": "sum",
        "seq_high": "sum",
        "seq_low": "sum",
        "current_seen": "sum",
        "current_sum": "sum",
        "current_sq_sum": "sum",
        "current_max": "max",
        "current_min": "min",
    }
    settings: SkyRLSettings

    def update(self, block: Any) -> None:
        rows = TokenRows(block)
        diff = rows.diff
        absdiff = np.abs(diff)
        width = float(rows.raw_counts.max()) if rows.n_rows else -math.inf
        self.add(rows=float(rows.n_rows), width=width)
        if rows.current is not None:
            self._minibatch(np.abs(rows.current - rows.rollout), rows.n_rows)
        if rows.n_tokens:
            self.add(
                diff_sum=float(absdiff.astype(np.float64).sum()),
                diff_min=float(absdiff.min()),
                diff_max=float(absdiff.max()),
                diff=_moments(absdiff),
            )
        if not self.settings.enabled:
            self.add_weights(np.ones(rows.n_tokens, dtype=np.float32), rows, None)
            return
        ratio = _safe_exp(diff)
        if rows.n_tokens:
            self.add(
                ratio_sum=float(ratio.astype(np.float64).sum()),
                ratio=_moments(ratio),
                ratio_min=float(ratio.min()),
                ratio_max=float(ratio.max()),
            )
        self.add_weights(*self._correct(rows, diff, ratio))

    def _minibatch(self, absdiff: np.ndarray, n_rows: int) -> None:
        """The valid tokens' |current - rollout| (float32, as the worker subtracts): its sum, sum of squares and
        extremes."""
        x = absdiff.astype(np.float64)
        self.add(
            current_seen=float(n_rows),  # rows, not blocks: a state is the same however the rows were cut
            current_sum=float(x.sum()),
            current_sq_sum=float(np.square(absdiff).astype(np.float64).sum()),
        )
        if absdiff.size:
            self.add(current_max=float(absdiff.max()), current_min=float(absdiff.min()))

    def _correct(
        self, rows: TokenRows, diff: np.ndarray, ratio: np.ndarray
    ) -> tuple[np.ndarray, TokenRows, np.ndarray | None]:
        """Apply SkyRL's corrections in its order, adding their counts; the weight on each valid token's loss, the
        rows, and where the truncation moved the weight."""
        s = self.settings
        keep = np.ones(rows.n_tokens, dtype=bool)
        if s.outlier:
            high = ratio > f32(s.outlier_high) if s.outlier_high is not None else np.zeros_like(keep)
            low = ratio < f32(s.outlier_low) if s.outlier_low is not None else np.zeros_like(keep)
            over, under = rows.row_any(high), rows.row_any(low)
            vetoed = rows.row_any(high | low)
            self.add(outlier_masked=float(vetoed.sum()), outlier_high=float(over.sum()), outlier_low=float(under.sum()))
            keep &= ~rows.per_token(vetoed)
        if s.token_mask:
            inside = (ratio >= f32(s.token_low)) & (ratio <= f32(s.token_high))
            self.add(token_masked=float(np.count_nonzero(keep & ~inside)), token_valid=float(np.count_nonzero(keep)))
            keep &= inside
        weight = np.ones(rows.n_tokens, dtype=np.float32)
        moved = None
        kept_diff = np.where(keep, diff, np.float32(0.0))
        seq_sum = rows.row_sum(kept_diff).astype(np.float32)  # torch's float32 sum of (log-ratio * loss_mask)
        if s.tis == "token":
            cap = np.float32(s.token_cap)
            self.add(tis_clipped=float(np.count_nonzero((ratio > cap) & keep)), tis_valid=float(np.count_nonzero(keep)))
            weight = np.minimum(ratio, cap)
            moved = ratio > cap
        elif s.tis == "sequence":
            seq_ratio = _safe_exp(seq_sum)
            cap = np.float32(s.sequence_cap)
            self.add(tis_clipped=float(np.count_nonzero(seq_ratio > cap)))
            weight = rows.per_token(np.minimum(seq_ratio, cap))
            moved = rows.per_token(seq_ratio > cap)
        if s.sequence_mask is not None:
            if s.sequence_mask == "geometric":
                count = np.maximum(rows.row_sum(keep.astype(np.float64)), 1.0).astype(np.float32)
                seq = _safe_exp((seq_sum / count).astype(np.float32))
            else:
                seq = _safe_exp(seq_sum)
            over, under = seq > f32(s.mask_high), seq < f32(s.mask_low)
            self.add(
                seq_masked=float(np.count_nonzero(over | under)),
                seq_high=float(np.count_nonzero(over)),
                seq_low=float(np.count_nonzero(under)),
            )
            keep &= ~rows.per_token(over | under)
        return np.where(keep, weight, np.float32(0.0)), rows, None if moved is None else moved & keep

    def keys(self) -> list[str]:
        s = self.settings
        keys = list(DIFF_KEYS)
        if s.enabled:
            keys.extend(IS_KEYS)
            if s.outlier:
                keys.extend(OUTLIER_KEYS)
            if s.token_mask:
                keys.append(TOKEN_MASK)
            if s.tis is not None:
                keys.append(TIS_KEYS[s.tis])
            if s.sequence_mask is not None:
                prefix = f"{LOSS}{SEQ_PREFIX[s.sequence_mask]}_sequence_mask_"
                keys.extend(prefix + part for part in ("masked_ratio", "over_high_ratio", "under_low_ratio"))
        return [*keys, *MINIBATCH_KEYS, *self.weight_keys()]

    def compute(self) -> tuple[dict[str, MetricValue], list[VerlCrash]]:
        """SkyRL's values (``None`` where it logs none or crashes: a key of an empty batch) and rcdiag's."""
        st, s = self.state, self.settings
        n, rows = st["tokens"], st["rows"]
        values: dict[str, MetricValue] = dict.fromkeys(DIFF_KEYS)
        if n:
            diff = (st["diff_max"], st["diff_min"], st["diff_sum"] / n, _std(st["diff"]))
            values.update(zip(DIFF_KEYS, diff, strict=True))
        if s.enabled:
            values.update(zip(IS_KEYS, self._padded_ratio(), strict=True))
            per_row = rows if rows else math.nan
            if s.outlier:
                parts = (st["outlier_masked"], st["outlier_high"], st["outlier_low"])
                values.update(zip(OUTLIER_KEYS, (v / per_row for v in parts), strict=True))
            if s.token_mask:
                values[TOKEN_MASK] = st["token_masked"] / max(st["token_valid"], 1.0)
            if s.tis == "token":
                values[TIS_KEYS["token"]] = st["tis_clipped"] / max(st["tis_valid"], 1.0)
            elif s.tis == "sequence":
                values[TIS_KEYS["sequence"]] = st["tis_clipped"] / per_row
            if s.sequence_mask is not None:
                prefix = f"{LOSS}{SEQ_PREFIX[s.sequence_mask]}_sequence_mask_"
                parts = (st["seq_masked"], st["seq_high"], st["seq_low"])
                for part, value in zip(("masked_ratio", "over_high_ratio", "under_low_ratio"), parts, strict=True):
                    values[prefix + part] = value / per_row
        if st["current_seen"] and st["current_seen"] == st["rows"]:
            values.update(zip(MINIBATCH_KEYS, self._minibatch_values(), strict=True))
        return {**values, **self.weight_values()}, []

    def _minibatch_values(self) -> tuple[MetricValue, MetricValue, MetricValue, MetricValue]:
        """``compute_minibatch_rollout_logprob_diff_metrics`` on the step padded to its longest row, its float32
        mean and mean square (``.item()``) making the std (``None`` for an empty tensor, whose max raises)."""
        st = self.state
        n, size = st["tokens"], self._padded_size()
        if size == 0:
            return None, None, None, None
        mean = float(np.float32(st["current_sum"] / max(n, 1.0)))
        square = float(np.float32(st["current_sq_sum"] / max(n, 1.0)))
        top, bottom = self._padded_extremes("current", size)
        return mean, top, bottom, math.sqrt(max(0.0, square - mean**2))

    def _padded_size(self) -> float:
        """Positions in the step padded to its longest row (rows x width)."""
        st = self.state
        return st["rows"] * (st["width"] if st["width"] > 0 else 0.0)

    def _padded_extremes(self, name: str, size: float) -> tuple[float, float]:
        """The max and min of ``{name}_max``/``{name}_min`` over the padded step, each pad and masked position a 0."""
        st = self.state
        n = st["tokens"]
        top, bottom = (st[f"{name}_max"], st[f"{name}_min"]) if n else (0.0, 0.0)
        if size > n:
            top, bottom = max(top, 0.0), min(bottom, 0.0)
        return top, bottom

    def _padded_ratio(self) -> tuple[MetricValue, MetricValue, MetricValue, MetricValue]:
        """``is_ratio_mean`` (masked) and the std, max and min of ``ratio * loss_mask`` over the step padded to
        its longest row, each pad and masked position a 0."""
        st = self.state
        n, size = st["tokens"], self._padded_size()
        mean = st["ratio_sum"] / max(n, 1.0)
        if size == 0:
            return mean, None, None, None  # SkyRL's max of an empty tensor raises
        zeros = size - n
        padded = st["ratio"].merge(Moments(zeros, 0.0, 0.0)) if zeros else st["ratio"]
        std = math.sqrt(padded.m2 / (size - 1)) if size > 1 else math.nan
        top, bottom = self._padded_extremes("ratio", size)
        return mean, std, top, bottom


CURRENT_WHEN = "with the current policy (--current-col), whatever the correction"
CLAMP_HIGH = math.exp(SAFETY_BOUND)
OPEN_LOW, OPEN_HIGH = 1e-9, 1e9
"""Bounds beyond SkyRL's +-20 clamp: a missing bound written so it bounds nothing."""


def _shown(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def _field(**fields: Any) -> dict[str, Any]:
    """``off_policy_correction`` fields, each its own option (so two forms combine into one setting)."""
    return {f"{BLOCK}.{key}": value for key, value in fields.items()}


def _tis(level: str) -> Callable[[float | None, float | None], dict[str, Any] | None]:
    cap = "token_tis_ratio_clip_high" if level == "token" else "sequence_tis_ratio_clip_high"

    def options(low: float | None, high: float | None) -> dict[str, Any] | None:
        return None if high is None else _field(tis_ratio_type=level, **{cap: high})

    return options


def _mask(metric: str | None) -> Callable[[float | None, float | None], dict[str, Any] | None]:
    """A band as SkyRL's token mask (``None``), or its geometric or product sequence mask (both bounds: a missing
    one written beyond the +-20 clamp)."""

    def options(low: float | None, high: float | None) -> dict[str, Any] | None:
        low, high = low or OPEN_LOW, high or OPEN_HIGH
        if metric is None:
            return _field(token_mask_is_threshold_low=low, token_mask_is_threshold_high=high)
        prefix = SEQ_PREFIX[metric]
        return _field(sequence_mask_metric=metric, **{f"{prefix}_mask_low": low, f"{prefix}_mask_high": high})

    return options


FORMS = (
    Form("one", "none", lambda low, high: _field(tis_ratio_type=None)),
    Form("token", "clamp", _tis("token")),
    Form("product", "clamp", _tis("sequence")),
    Form("token", "none", lambda low, high: _field(tis_ratio_type="token", token_tis_ratio_clip_high=OPEN_HIGH)),
    Form(
        "product", "none", lambda low, high: _field(tis_ratio_type="sequence", sequence_tis_ratio_clip_high=OPEN_HIGH)
    ),
    Form("one", "band", _mask(None), statistic="ratio"),
    Form("one", "band", _mask("geometric"), statistic="geomean"),
    Form("one", "band", _mask("product"), statistic="product"),
    Form(
        "one",
        "band",
        lambda low, high: _field(outlier_token_is_threshold_low=low, outlier_token_is_threshold_high=high),
        statistic="all_ratios",
    ),
)
"""Each correction as its own fields (a truncated weight, the token mask, a sequence mask, the outlier veto): SkyRL
applies them together, so they combine; a missing bound is written beyond its +-20 clamp (it bounds nothing)."""


def _safe_exp(d: np.ndarray) -> np.ndarray:
    """``safe_exp_delta``: exp of ``d`` clamped to [-20, 20], in float32."""
    bound = np.float32(SAFETY_BOUND)
    return exp32(np.clip(d.astype(np.float32), -bound, bound))


def _moments(values: np.ndarray) -> Moments:
    x = values.astype(np.float64)
    mean = float(x.mean())
    return Moments(float(x.size), mean, float(((x - mean) ** 2).sum()))


def _std(moments: Moments) -> float:
    """torch's unbiased std (NaN for one value)."""
    return math.sqrt(max(moments.m2, 0.0) / (moments.n - 1)) if moments.n > 1 else math.nan


def settings(values: Mapping[str, Any], given: frozenset[str] = frozenset()) -> SkyRLSettings:
    """``validate_cfg``: the deprecated ``use_tis`` becomes token TIS with ``tis_imp_ratio_cap`` as its cap."""
    block = dict(values[BLOCK])
    if values[USE_TIS]:
        block["tis_ratio_type"] = "token"
        block["token_tis_ratio_clip_high"] = values[CAP]
    metric = block["sequence_mask_metric"]
    prefix = SEQ_PREFIX.get(metric or "product")
    return SkyRLSettings(
        tis=block["tis_ratio_type"],
        token_cap=block["token_tis_ratio_clip_high"],
        sequence_cap=block["sequence_tis_ratio_clip_high"],
        sequence_mask=metric,
        mask_low=block[f"{prefix}_mask_low"],
        mask_high=block[f"{prefix}_mask_high"],
        outlier_low=block["outlier_token_is_threshold_low"],
        outlier_high=block["outlier_token_is_threshold_high"],
        token_low=block["token_mask_is_threshold_low"],
        token_high=block["token_mask_is_threshold_high"],
        block=tuple(block.items()),
    )


_DEFAULTS = {f.key: f.default for f in FIELDS}
_BLOCK = Option(BLOCK, "block", _DEFAULTS, "SkyRL's off-policy correction", fields=FIELDS)
FRAMEWORK = Framework(
    name="skyrl",
    title="SkyRL",
    release="a9564572e",
    source=(
        "skyrl/backends/skyrl_train/utils/off_policy_correction_utils.py:9-348; "
        "skyrl/backends/skyrl_train/utils/torch_utils.py:180-192; skyrl/train/trainer.py:1383-1406; "
        "skyrl/backends/skyrl_train/workers/worker_utils.py:34-58; skyrl/train/utils/trainer_utils.py:38-53"
    ),
    options=(
        _BLOCK,
        Option(USE_TIS, "bool", False, "deprecated: token TIS with tis_imp_ratio_cap as its cap"),
        Option(CAP, "number", -1.0, "deprecated: the cap use_tis takes"),
    ),
    keys=(
        MetricKey(DIFF_KEYS[0], "largest |old - rollout| over the batch's valid tokens"),
        MetricKey(DIFF_KEYS[1], "smallest |old - rollout|"),
        MetricKey(DIFF_KEYS[2], "mean |old - rollout|"),
        MetricKey(DIFF_KEYS[3], "standard deviation of |old - rollout| (unbiased)"),
        MetricKey(
            IS_KEYS[0], "mean token ratio exp(clamp(old - rollout, +-20)) over the valid tokens", "a correction is on"
        ),
        MetricKey(
            IS_KEYS[1], "std of ratio * mask over the padded batch, pads 0 (padding-dependent)", "a correction is on"
        ),
        MetricKey(
            IS_KEYS[2], "largest ratio * mask over the padded batch (0 if every ratio is below)", "a correction is on"
        ),
        MetricKey(
            IS_KEYS[3], "smallest ratio * mask over the padded batch: 0 wherever there is a pad", "a correction is on"
        ),
        MetricKey(
            OUTLIER_KEYS[0],
            "share of rows vetoed: a valid token's ratio outside the outlier bounds",
            "outlier bounds set",
        ),
        MetricKey(OUTLIER_KEYS[1], "share of rows with a token ratio above the high bound", "outlier bounds set"),
        MetricKey(OUTLIER_KEYS[2], "share of rows with a token ratio below the low bound", "outlier bounds set"),
        MetricKey(
            TOKEN_MASK, "share of the tokens still in the mask that the token mask drops", "token mask bounds set"
        ),
        MetricKey(
            TIS_KEYS["token"],
            "share of the tokens still in the mask whose ratio exceeds the cap",
            "tis_ratio_type token",
        ),
        MetricKey(
            TIS_KEYS["sequence"],
            "share of rows whose exp(sum of kept log-ratios) exceeds the cap",
            "tis_ratio_type sequence",
        ),
        *(
            MetricKey(
                f"{LOSS}{prefix}_sequence_mask_{part}",
                f"share of rows whose {what} ratio is {where}",
                f"sequence_mask_metric {metric}",
            )
            for metric, prefix in SEQ_PREFIX.items()
            for what in (("geometric-mean",) if metric == "geometric" else ("product",))
            for part, where in (
                ("masked_ratio", "outside the bounds"),
                ("over_high_ratio", "above the high bound"),
                ("under_low_ratio", "below the low bound"),
            )
        ),
        MetricKey(MINIBATCH_KEYS[0], "mean |current - rollout| over the valid tokens (0 for none)", CURRENT_WHEN),
        MetricKey(MINIBATCH_KEYS[1], "largest |current - rollout| * mask over the padded batch", CURRENT_WHEN),
        MetricKey(
            MINIBATCH_KEYS[2],
            "smallest |current - rollout| * mask over the padded batch: 0 wherever there is a pad",
            CURRENT_WHEN,
        ),
        MetricKey(MINIBATCH_KEYS[3], "sqrt(max(0, mean square - mean^2)) of |current - rollout|", CURRENT_WHEN),
        *weight_keys("skyrl", "SkyRL", "loss-mask token", "SkyRL's correction"),
    ),
    settings=settings,
    prefixes=("trainer.algorithm.", BLOCK + "."),
    left_out=(
        "left out: clip_ratio, policy_loss, policy_kl and entropy need the whole loss, the reference model or the "
        "current policy's entropies, which rcdiag does not compute"
    ),
    batching="one training step (its batch as one micro-batch, padded to its longest row)",
    forms=FORMS,
)
