"""slime's importance-sampling correction and mismatch metrics (THUDM/slime 624b824a: ``policy_loss_function`` and
``vanilla_tis_function`` / ``icepop_function`` in ``slime/backends/megatron_utils/loss.py``, the MIS helper
``examples/train_infer_mismatch_helper/mis.py``, reduced by ``get_sum_of_sample_mean``
(``backends/megatron_utils/cp_utils.py``) and ``reduce_train_step_metrics``
(``slime/observability/train_metric_utils.py``), logged as ``train/KEY``).

Every key is a per-token value reduced the same way: each sample's masked mean (its sum over the loss mask divided
by its valid-token count, at least 1), averaged over the step's samples (an empty one counts as 0); with
``calculate_per_token_loss`` the masked sum over the step divided by the sum of every sample's count (each at
least 1). ``train_rollout_logprob_abs_diff`` (|old - rollout|) is logged always; with ``use_tis`` or
``get_mismatch_metrics`` the TIS function runs: slime's default (``tis`` = exp(old - rollout), unclamped;
``tis_clipfrac``: where clamp(tis, tis_clip_low, tis_clip) changed it; ``tis_abs`` = |tis - 1|; the clamped tis
weighs the loss, with ``get_mismatch_metrics`` alone too), ``icepop_function`` (the same keys, a ratio outside
[tis_clip_low, tis_clip] weighted 0) or the MIS helper (``mis_*``: verl's off-policy metrics per sample, then with
``use_tis`` its truncate / clip / mask weight at token, sequence or geometric level, rejection sampling with a veto,
and batch normalisation over the step). The abs diff's numerator uses the mask the TIS function returns (the MIS
helper's rejections), its denominators the original counts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rcdiag.core import formulas
from rcdiag.core.limits import SAFETY_BOUND
from rcdiag.errors import ConfigError
from rcdiag.frameworks.base import Framework, FrameworkMetrics, MetricKey, Option, TokenRows, exp32, weight_keys
from rcdiag.metrics.base import Accumulator, MetricValue, Reduce, VerlCrash

PREFIX = "train/"
ABS_DIFF = PREFIX + "train_rollout_logprob_abs_diff"
ICEPOP = "slime.backends.megatron_utils.loss.icepop_function"
MIS = "examples.train_infer_mismatch_helper.mis.compute_mis_weights_with_cp"
PPL_KEYS = (
    "training_log_ppl", "training_ppl", "rollout_log_ppl", "rollout_ppl", "kl", "k3_kl", "log_ppl_diff",
    "log_ppl_abs_diff", "ppl_ratio", "chi2_token", "chi2_seq",
)  # fmt: skip
MODE_KEYS = {
    "truncate": ("tis_truncate_fraction",),
    "clip": ("tis_clip_fraction_low", "tis_clip_fraction_high"),
    "mask": ("tis_mask_fraction_low", "tis_mask_fraction_high"),
}
FINAL = ("is_ratio_mean_final", "is_ratio_min_final", "is_ratio_max_final")
LEVELS = ("token", "sequence", "geometric")


@dataclass(frozen=True)
class Mis:
    """mis.yaml's fields (the MIS helper's ``args``), bounds resolved as ``compute_mis_weights`` resolves them."""

    use_rs: bool
    tis_level: str
    rs_level: str
    tis_mode: str
    tis_lower: float
    tis_upper: float
    rs_lower: float
    rs_upper: float
    veto: float | None
    batch_normalize: bool


@dataclass(frozen=True)
class SlimeSettings:
    use_tis: bool
    clip: float
    clip_low: float
    mismatch: bool
    per_token: bool
    function: str | None
    mis: Mis | None
    given: tuple[tuple[str, Any], ...]

    @property
    def runs_tis(self) -> bool:
        """``policy_loss_function`` calls the TIS function (``get_mismatch_metrics or use_tis``)."""
        return self.mismatch or self.use_tis

    def keys(self) -> list[str]:
        """The keys in the order slime reports them (``ois`` left out)."""
        if not self.runs_tis:
            return [ABS_DIFF]
        if self.function != MIS:
            return [ABS_DIFF, *(PREFIX + k for k in ("tis", "tis_clipfrac", "tis_abs"))]
        return [ABS_DIFF, *(PREFIX + "mis_" + k for k in self.mis_keys())]

    def mis_keys(self) -> list[str]:
        mis = self.mis
        assert mis is not None
        keys = list(PPL_KEYS)
        if not self.use_tis:
            return keys
        keys += ["tis_weight_before_bound", *MODE_KEYS[mis.tis_mode], "tis_weight_after_bound"]
        if mis.use_rs:
            keys += ["rs_mask_fraction_low", "rs_mask_fraction_high"]
            if mis.veto is not None:
                keys += ["rs_catastrophic_token_fraction", "rs_catastrophic_seq_fraction"]
        keys.append("is_ratio_mean_after_tis_rs")
        if mis.batch_normalize:
            keys.append("batch_norm_factor")
        return [*keys, *FINAL]

    def new_metrics(self) -> SlimeMetrics:
        return SlimeMetrics(self)

    def notes(self) -> tuple[str, ...]:
        mean = (
            "the masked sum over the step divided by the sum of the samples' valid-token counts (each at least 1)"
            if self.per_token
            else "the mean over the step's samples of each one's masked mean (an empty sample counts as 0)"
        )
        notes = [
            f"every key is {mean}; a dump row is a sample and its own rollout (slime divides by the per-rollout "
            "mask totals of samples sharing a rollout_id, and by the step's rollout count); a dump step is one "
            "training step (num_steps_per_rollout steps of one rollout are separate steps)",
        ]
        if not self.runs_tis:
            notes.append("use_tis and get_mismatch_metrics are false (slime's default): it logs only "
                         "train_rollout_logprob_abs_diff")  # fmt: skip
        elif self.function is None and not self.use_tis:
            notes.append("get_mismatch_metrics alone still runs slime's default TIS function, whose clamped weight "
                         "multiplies the loss")  # fmt: skip
        if self.function == MIS and self.mis is not None and self.mis.batch_normalize and self.use_tis:
            notes.append("tis_batch_normalize normalises over the micro-batch: rcdiag takes the step (pooled: "
                         "every step) as one micro-batch")  # fmt: skip
        notes.append("rcdiag/slime/* are rcdiag's: the weight the TIS function puts on each valid token's loss "
                     "times the mask it returns")  # fmt: skip
        return tuple(notes)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.given)


def _per_row(rows: TokenRows, values: np.ndarray) -> np.ndarray:
    """A per-row float32 value as the per-token tensor slime expands it to."""
    return rows.per_token(values.astype(np.float32))


class SlimeMetrics(FrameworkMetrics):
    """One training step's ``train/*`` keys: per key the sum over samples of each one's masked mean and the
    masked sum over the step (the two reductions), and what batch normalisation needs."""

    NAME = "slime"
    STATES: ClassVar[dict[str, Reduce]] = {
        **FrameworkMetrics.WEIGHT_STATES,
        "rows": "sum",
        "filled_rows": "sum",
        "denominator": "sum",
        "sample": "sums",
        "token": "sums",
    }
    settings: SlimeSettings

    def __init__(self, settings: SlimeSettings) -> None:
        self.settings = settings
        size = len(settings.keys())
        Accumulator.__init__(self, {"sample": size, "token": size})

    def update(self, block: Any) -> None:
        rows = TokenRows(block)
        counts = rows.counts.astype(np.float64)
        per_token, per_row, weight, kept = self._values(rows)
        keys = self.settings.keys()
        sample = np.zeros(len(keys))
        token = np.zeros(len(keys))
        denominator = np.maximum(counts, 1.0)
        for i, key in enumerate(keys):
            if key in per_row:
                row_values = per_row[key].astype(np.float64)
                sums = row_values * counts
            else:
                values = per_token[key]
                if key == ABS_DIFF:
                    values = np.where(kept, values, np.float32(0.0))
                sums = rows.row_sum(values)
            token[i] = sums.sum()
            sample[i] = (sums / denominator).sum()
        self.add(
            rows=float(rows.n_rows),
            filled_rows=float(np.count_nonzero(counts)),
            denominator=float(denominator.sum()),
            sample=sample,
            token=token,
        )
        self.add_weights(weight * kept)

    def _values(self, rows: TokenRows) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """(per-token values, per-row values, the weight before normalisation, the mask returned) by key."""
        s = self.settings
        d = rows.diff
        one = np.float32(1.0)
        per_token = {ABS_DIFF: np.abs(d)}
        ones = np.ones(rows.n_tokens, dtype=np.float32)
        if not s.runs_tis:
            return per_token, {}, ones, ones
        if s.function != MIS:
            ratio = exp32(d)
            if s.function == ICEPOP:
                inside = (ratio >= np.float32(s.clip_low)) & (ratio <= np.float32(s.clip))
                weight = np.where(inside, ratio, np.float32(0.0))
            else:
                weight = np.minimum(np.maximum(ratio, np.float32(s.clip_low)), np.float32(s.clip))
            per_token[PREFIX + "tis"] = ratio
            per_token[PREFIX + "tis_clipfrac"] = (weight != ratio).astype(np.float32)
            per_token[PREFIX + "tis_abs"] = np.abs(exp32(d) - one)
            return per_token, {}, weight, ones
        return self._mis(rows, per_token)

    def _mis(
        self, rows: TokenRows, per_token: dict[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray, np.ndarray]:
        s = self.settings
        mis = s.mis
        assert mis is not None
        d, one, bound = rows.diff, np.float32(1.0), np.float32(SAFETY_BOUND)
        count = np.maximum(rows.counts, 1).astype(np.float32)
        mean_train = (rows.row_sum(rows.old).astype(np.float32) / count).astype(np.float32)
        mean_rollout = (rows.row_sum(rows.rollout).astype(np.float32) / count).astype(np.float32)
        log_ppl_diff = mean_rollout - mean_train
        rho = exp32(np.clip(d, -bound, bound))
        chi2_token = (rows.row_sum(rho * rho).astype(np.float32) / count).astype(np.float32) - one
        seq_sum = rows.row_sum(d).astype(np.float32)
        per_row = {
            "training_log_ppl": -mean_train,
            "training_ppl": exp32(-mean_train),
            "rollout_log_ppl": -mean_rollout,
            "rollout_ppl": exp32(-mean_rollout),
            "log_ppl_diff": log_ppl_diff,
            "log_ppl_abs_diff": np.abs(log_ppl_diff),
            "ppl_ratio": exp32(log_ppl_diff),
            "chi2_token": chi2_token,
            "chi2_seq": exp32(np.float32(2.0) * np.clip(seq_sum, -bound, bound)) - one,
        }
        named = {f"{PREFIX}mis_{k}": v for k, v in per_row.items()}
        per_token[f"{PREFIX}mis_kl"] = rows.rollout - rows.old
        per_token[f"{PREFIX}mis_k3_kl"] = exp32(d) - d - one
        ones = np.ones(rows.n_tokens, dtype=np.float32)
        if not s.use_tis:
            return per_token, named, ones, ones

        def level(name: str) -> np.ndarray:
            if name == "token":
                return d
            return rows.per_token(seq_sum if name == "sequence" else (seq_sum / count).astype(np.float32))

        def put(key: str, values: np.ndarray) -> None:
            per_token[f"{PREFIX}mis_{key}"] = values.astype(np.float32)

        log_tis = level(mis.tis_level)
        weights = exp32(np.clip(log_tis, -bound, bound))
        put("tis_weight_before_bound", weights)
        low, high = np.float32(mis.tis_lower), np.float32(mis.tis_upper)
        kept = ones.copy()
        if mis.tis_mode == "truncate":
            put("tis_truncate_fraction", weights > high)
            weights = np.minimum(np.maximum(weights, np.float32(0.0)), high)
        elif mis.tis_mode == "clip":
            put("tis_clip_fraction_low", weights < low)
            put("tis_clip_fraction_high", weights > high)
            weights = np.minimum(np.maximum(weights, low), high)
        else:
            put("tis_mask_fraction_low", weights < low)
            put("tis_mask_fraction_high", weights > high)
            kept = formulas.rs_keep(weights, low, high, True).astype(np.float32)
        put("tis_weight_after_bound", weights)
        if mis.use_rs:
            log_rs = log_tis if mis.rs_level == mis.tis_level else level(mis.rs_level)
            rs = exp32(np.clip(log_rs, -bound, bound))
            rs_low, rs_high = np.float32(mis.rs_lower), np.float32(mis.rs_upper)
            put("rs_mask_fraction_low", rs < rs_low)
            put("rs_mask_fraction_high", rs > rs_high)
            kept = kept * formulas.rs_keep(rs, rs_low, rs_high, True).astype(np.float32)
            if mis.veto is not None:
                catastrophic = d < np.log(np.float32(mis.veto))
                vetoed = rows.row_any(catastrophic)
                put("rs_catastrophic_token_fraction", catastrophic)
                named[f"{PREFIX}mis_rs_catastrophic_seq_fraction"] = vetoed.astype(np.float32)
                kept = kept * rows.per_token(~vetoed).astype(np.float32)
        put("is_ratio_mean_after_tis_rs", weights)
        for key in FINAL:  # divided by the batch-normalisation factor in compute()
            reduce = {"is_ratio_mean_final": None, "is_ratio_min_final": np.minimum, "is_ratio_max_final": np.maximum}
            function = reduce[key]
            if function is None:
                named[f"{PREFIX}mis_{key}"] = (rows.row_sum(weights).astype(np.float32) / count).astype(np.float32)
            else:
                empty = np.float32(0.0)
                named[f"{PREFIX}mis_{key}"] = _row_reduce(rows, weights, function, empty)
        if mis.batch_normalize:
            named[f"{PREFIX}mis_batch_norm_factor"] = np.zeros(rows.n_rows, dtype=np.float32)  # set in compute()
        return per_token, named, weights, kept

    def keys(self) -> list[str]:
        return [*self.settings.keys(), *self.weight_keys()]

    def _factor(self) -> float:
        """``compute_mis_weights``'s batch-normalisation mean (1 when off, or when the mean is not above 1e-8)."""
        s = self.settings
        if s.function != MIS or s.mis is None or not (s.use_tis and s.mis.batch_normalize):
            return 1.0
        st, keys = self.state, s.keys()
        at = keys.index(f"{PREFIX}mis_tis_weight_after_bound")
        if s.mis.tis_level == "token":
            mean = st["token"][at] / max(st["tokens"], 1.0)
        else:
            mean = st["sample"][at] / st["rows"] if st["rows"] else math.nan
        return mean if mean > 1e-8 else 1.0

    def compute(self) -> tuple[dict[str, MetricValue], list[VerlCrash]]:
        """slime's values (``None`` without a sample) and rcdiag's readings."""
        st, s = self.state, self.settings
        factor = self._factor()
        values: dict[str, MetricValue] = {}
        for i, key in enumerate(s.keys()):
            if s.per_token:
                value = st["token"][i] / st["denominator"] if st["rows"] else None
            else:
                value = st["sample"][i] / st["rows"] if st["rows"] else None
            if value is not None and key.endswith(FINAL):
                value /= factor
            if value is not None and key.endswith("batch_norm_factor"):
                filled = st["filled_rows"] if not s.per_token else st["tokens"]
                value = factor * filled / (st["rows"] if not s.per_token else st["denominator"])
            values[key] = value
        n = st["tokens"]
        mean, zeroed = self.weight_keys()
        values[mean] = st["weight_sum"] / factor / n if n else None
        values[zeroed] = st["zeroed"] / n if n else None
        return values, []


def _row_reduce(rows: TokenRows, values: np.ndarray, function: Any, empty: np.float32) -> np.ndarray:
    out = np.full(rows.n_rows, empty, dtype=np.float32)
    if rows.n_tokens:
        starts = np.zeros(rows.n_rows, dtype=np.int64)
        np.cumsum(rows.counts[:-1], out=starts[1:])
        filled = rows.counts > 0
        out[filled] = function.reduceat(values, starts[filled])
    return out


def settings(values: Mapping[str, Any], given: frozenset[str] = frozenset()) -> SlimeSettings:
    """slime's arguments and mis.yaml's fields, refused where slime's own assertions or errors would stop it."""
    function = values["custom_tis_function_path"]
    mis = None
    if function == MIS:
        upper = values["tis_upper_bound"]
        lower = values["tis_lower_bound"] if values["tis_lower_bound"] is not None else 1.0 / upper
        rs_lower = values["rs_lower_bound"] if values["rs_lower_bound"] is not None else lower
        rs_upper = values["rs_upper_bound"] if values["rs_upper_bound"] is not None else upper
        mis = Mis(
            use_rs=values["use_rs"],
            tis_level=values["tis_level"],
            rs_level=values["rs_level"],
            tis_mode=values["tis_mode"],
            tis_lower=lower,
            tis_upper=upper,
            rs_lower=rs_lower,
            rs_upper=rs_upper,
            veto=values["rs_veto_threshold"],
            batch_normalize=values["tis_batch_normalize"],
        )
        if values["use_tis"]:
            if mis.tis_mode in ("clip", "mask") and not lower < upper:
                raise ConfigError(f"tis_mode={mis.tis_mode} needs tis_lower_bound < tis_upper_bound: slime's "
                                  "assertion `lower_bound < upper_bound` stops the step")  # fmt: skip
            if mis.use_rs and not rs_lower < rs_upper:
                raise ConfigError("use_rs needs rs_lower_bound < rs_upper_bound: slime's assertion "
                                  "`lower_bound < upper_bound` stops the step")  # fmt: skip
            if mis.batch_normalize and mis.tis_level == "geometric":
                raise ConfigError("Unsupported tis_level: geometric (slime's MIS helper raises it at the first step "
                                  "with tis_batch_normalize true)")  # fmt: skip
    shown = {key: values[key] for key in _BASE}
    if function == MIS:
        shown.update({key: values[key] for key in _MIS})
    return SlimeSettings(
        use_tis=values["use_tis"],
        clip=values["tis_clip"],
        clip_low=values["tis_clip_low"],
        mismatch=values["get_mismatch_metrics"],
        per_token=values["calculate_per_token_loss"],
        function=function,
        mis=mis,
        given=tuple(shown.items()),
    )


OPTIONS = (
    Option("use_tis", "bool", False, "--use-tis: truncated importance sampling (and the TIS function's keys)"),
    Option("tis_clip", "number", 2.0, "--tis-clip: upper clamp of the ratio"),
    Option("tis_clip_low", "number", 0.0, "--tis-clip-low: lower clamp"),
    Option("get_mismatch_metrics", "bool", False, "--get-mismatch-metrics: run the TIS function for its keys"),
    Option("calculate_per_token_loss", "bool", False, "--calculate-per-token-loss: token means, not sample means"),
    Option("custom_tis_function_path", "choice", None, "--custom-tis-function-path: null (slime's default), "
           "icepop_function or the MIS helper", choices=(ICEPOP, MIS), nullable=True),
    Option("use_rs", "bool", True, "MIS (mis.yaml): rejection sampling"),
    Option("tis_level", "choice", "token", "MIS: weight level", choices=LEVELS),
    Option("rs_level", "choice", "token", "MIS: rejection level", choices=LEVELS),
    Option("tis_mode", "choice", "truncate", "MIS: truncate, clip or mask", choices=("truncate", "clip", "mask")),
    Option("tis_lower_bound", "number", 0.5, "MIS: lower bound (null: 1 / upper)", nullable=True),
    Option("tis_upper_bound", "number", 2.0, "MIS: upper bound"),
    Option("rs_lower_bound", "number", None, "MIS: rejection lower bound (null: the IS one)", nullable=True),
    Option("rs_upper_bound", "number", None, "MIS: rejection upper bound (null: the IS one)", nullable=True),
    Option("rs_veto_threshold", "number", 1e-4, "MIS: reject a sample with a token ratio below", nullable=True),
    Option("tis_batch_normalize", "bool", True, "MIS: normalise the weights to mean 1 over the batch"),
)  # fmt: skip
_BASE = tuple(o.key for o in OPTIONS[:6])
_MIS = tuple(o.key for o in OPTIONS[6:])


def _keys() -> tuple[MetricKey, ...]:
    readings = {
        "tis": "exp(old - rollout), unclamped (sample mean)",
        "tis_clipfrac": "share of tokens whose weight the clamp (or IcePop's zero) changed",
        "tis_abs": "|exp(old - rollout) - 1|",
        "mis_training_log_ppl": "-(sample's mean old log-prob)",
        "mis_training_ppl": "exp of it",
        "mis_rollout_log_ppl": "-(sample's mean rollout log-prob)",
        "mis_rollout_ppl": "exp of it",
        "mis_kl": "rollout - old (k1 of KL(rollout||train))",
        "mis_k3_kl": "exp(d) - d - 1, d = old - rollout",
        "mis_log_ppl_diff": "mean rollout - mean old log-prob of the sample",
        "mis_log_ppl_abs_diff": "its absolute value",
        "mis_ppl_ratio": "exp(log_ppl_diff)",
        "mis_chi2_token": "sample's mean exp(clamp(d))^2 - 1",
        "mis_chi2_seq": "exp(2 clamp(sum d)) - 1",
        "mis_tis_weight_before_bound": "the MIS weight before its bound",
        "mis_tis_truncate_fraction": "share above the upper bound (truncate)",
        "mis_tis_clip_fraction_low": "share below the lower bound (clip)",
        "mis_tis_clip_fraction_high": "share above the upper bound (clip)",
        "mis_tis_mask_fraction_low": "share below the lower bound (mask)",
        "mis_tis_mask_fraction_high": "share above the upper bound (mask)",
        "mis_tis_weight_after_bound": "the weight after truncate / clip (mask: unchanged)",
        "mis_rs_mask_fraction_low": "share below the rejection lower bound",
        "mis_rs_mask_fraction_high": "share above the rejection upper bound",
        "mis_rs_catastrophic_token_fraction": "share of tokens whose ratio is below the veto",
        "mis_rs_catastrophic_seq_fraction": "share of samples vetoed",
        "mis_is_ratio_mean_after_tis_rs": "the weight before batch normalisation",
        "mis_batch_norm_factor": "the batch mean the weights are divided by",
        "mis_is_ratio_mean_final": "sample mean of the final weight",
        "mis_is_ratio_min_final": "sample's smallest final weight",
        "mis_is_ratio_max_final": "sample's largest final weight",
    }
    return (
        MetricKey(ABS_DIFF, "|old - rollout| (the numerator on the tokens the TIS function keeps)"),
        *(MetricKey(PREFIX + key, reading, "the TIS function runs") for key, reading in readings.items()),
        *weight_keys("slime", "slime", "loss-mask token", "the TIS function"),
    )


FRAMEWORK = Framework(
    name="slime",
    title="slime",
    release="624b824a",
    source=(
        "slime/backends/megatron_utils/loss.py:884-931, 1050-1092, 1136-1163, 1317; "
        "slime/backends/megatron_utils/cp_utils.py:47-124; slime/observability/train_metric_utils.py:18-59; "
        "examples/train_infer_mismatch_helper/mis.py, mis.yaml"
    ),
    options=OPTIONS,
    keys=_keys(),
    settings=settings,
    left_out=(
        "left out: ois compares the current policy with the old one, and pg_loss, pg_clipfrac, ppo_kl, "
        "entropy_loss and kl_loss need the current policy and advantages (so does "
        "train_rollout_logprob_abs_diff with use_rollout_logprobs, which rcdiag does not take): a dump of the two "
        "engines holds neither"
    ),
    batching="one training step (its samples as one micro-batch; each sample its own rollout)",
)
