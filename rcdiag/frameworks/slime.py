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

With the current policy's log-probs in the dump (``--current-col``) and the TIS function running, ``ois``
(``loss.py:1063``, reported at ``:1159``): exp(current - old) in float32 (``(-ppo_kl).exp()``, ``ppo_kl = old -
current``), reduced as the others with the original masks. With that column, whatever the TIS function, ``ppo_kl``
(``loss.py:1033``, reduced at ``:1107``), and with the advantages too (``--advantages-col``) the PPO loss's
``pg_clipfrac`` and ``pg_loss`` (``compute_policy_loss``, ``slime/utils/ppo_utils.py:125-148``: the clipped
surrogate with ``eps_clip`` / ``eps_clip_high``, dual-clip with ``eps_clip_c``; ``pg_loss`` times the TIS
function's weight): reduced, as the abs diff, over the mask the TIS function returns (``loss.py:1094-1107``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rcdiag.catalogue.metrics import framework_note
from rcdiag.core import formulas
from rcdiag.core.limits import SAFETY_BOUND
from rcdiag.frameworks.base import (
    Framework,
    FrameworkMetrics,
    MetricKey,
    Needs,
    Option,
    TokenRows,
    exp32,
    merge_options,
    scalar,
    weight_keys,
)
from rcdiag.frameworks.correction import (
    CLAMP_QUIRK,
    NO_CLAMP_QUIRK,
    UNIT_STATISTIC,
    Band,
    Correction,
    Form,
    Unit,
    Weight,
    within_clamp,
)
from rcdiag.frameworks.loss import ppo_clip
from rcdiag.metrics.base import Accumulator, MetricValue, Reduce, VerlCrash
from rcdiag.runtime.errors import ConfigError

PREFIX = "train/"
ABS_DIFF = PREFIX + "train_rollout_logprob_abs_diff"
OIS = PREFIX + "ois"
PG_LOSS, PG_CLIPFRAC, PPO_KL = (PREFIX + k for k in ("pg_loss", "pg_clipfrac", "ppo_kl"))
LOSS_KEYS = (PG_LOSS, PG_CLIPFRAC, PPO_KL)
"""The PPO loss's keys in slime's order, before the abs diff."""
NEEDS = (Needs((PPO_KL,), ("log_prob",)), Needs((PG_LOSS, PG_CLIPFRAC), ("log_prob", "advantages")))
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
    eps_clip: float = 0.2
    eps_clip_high: float = 0.2
    eps_clip_c: float | None = None

    @property
    def runs_tis(self) -> bool:
        """``policy_loss_function`` calls the TIS function (``get_mismatch_metrics or use_tis``)."""
        return self.mismatch or self.use_tis

    def keys(self) -> list[str]:
        """The keys of the dump's two engines in the order slime reports them (``ois``, from the current policy,
        placed by ``SlimeMetrics.keys``)."""
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

    def needs(self) -> tuple[Needs, ...]:
        """The loss's keys from the current policy (and the advantages); ``ois`` too where the TIS function runs."""
        return (*NEEDS, *((Needs((OIS,), ("log_prob",)),) if self.runs_tis else ()))

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
        notes.append(
            framework_note(
                "slime", "the weight the TIS function puts on each valid token's loss times the mask it returns"
            )
        )
        return tuple(notes)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.given)

    def correction(self) -> Correction:
        """slime's default TIS function (a two-sided clamp), ``icepop_function`` (a band on each ratio) or the MIS
        helper (a weight at token, sequence or geometric level, truncated, clipped or masked; its rejection band,
        its veto on every token's ratio; batch normalisation)."""
        if not self.runs_tis:
            return Correction(Weight("one", label="use_tis and get_mismatch_metrics false (slime's default)"))
        bounds = f"[{self.clip_low:g}, {self.clip:g}]"
        if self.function is None:
            weight = Weight("token", self.clip_low, self.clip, label=f"the TIS function {bounds}: each ratio clamped")
            return Correction(weight, quirks=(NO_CLAMP_QUIRK,)).normal()
        if self.function == ICEPOP:
            label = f"icepop_function {bounds}: a ratio outside set to 0"
            band = Band("ratio", self.clip_low, self.clip, label=label)
            return Correction(Weight("token", label=label), (band,), quirks=(NO_CLAMP_QUIRK,)).normal()
        mis = self.mis
        assert mis is not None
        if not self.use_tis:
            return Correction(Weight("one", label="the MIS helper without use_tis: its metrics only"))
        unit = MIS_UNITS[mis.tis_level]
        label = f"MIS tis_level {mis.tis_level}, tis_mode {mis.tis_mode} [{mis.tis_lower:g}, {mis.tis_upper:g}]"
        bands = []
        if mis.tis_mode == "mask":
            weight = Weight(unit, label=label)
            bands.append(Band(UNIT_STATISTIC[unit], mis.tis_lower, mis.tis_upper, label=label))
        else:
            low = mis.tis_lower if mis.tis_mode == "clip" else None
            weight = Weight(unit, low, mis.tis_upper if mis.tis_upper <= CLAMP_HIGH else None, label=label)
        if mis.use_rs:
            rs = f"MIS use_rs rs_level {mis.rs_level} [{mis.rs_lower:g}, {mis.rs_upper:g}]"
            bands.append(Band(UNIT_STATISTIC[MIS_UNITS[mis.rs_level]], mis.rs_lower, mis.rs_upper, label=rs))
            if mis.veto is not None:
                bands.append(Band("all_ratios", mis.veto, None, label=f"MIS rs_veto_threshold {mis.veto:g}"))
        bands = [within_clamp(b) for b in bands]
        return Correction(weight, tuple(bands), mis.batch_normalize, quirks=(CLAMP_QUIRK,)).normal()


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
        "ois_seen": "sum",
        "ois_sample": "sum",
        "ois_token": "sum",
        "kl_seen": "sum",
        "loss_seen": "sum",
        "loss_sample": "sums",
        "loss_token": "sums",
    }
    settings: SlimeSettings

    def __init__(self, settings: SlimeSettings) -> None:
        self.settings = settings
        size = len(settings.keys())
        n = len(LOSS_KEYS)
        Accumulator.__init__(self, {"sample": size, "token": size, "loss_sample": n, "loss_token": n})

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
        if self.settings.runs_tis and rows.current is not None:
            ois = rows.row_sum(exp32(rows.current - rows.old))  # (-ppo_kl).exp(), ppo_kl = old - current
            self.add(
                ois_seen=float(rows.n_rows), ois_sample=float((ois / denominator).sum()), ois_token=float(ois.sum())
            )
        if rows.current is not None:
            self._loss(rows, rows.current, weight, kept, denominator)
        self.add_weights(weight * kept, rows, self._truncated(per_token, kept))

    def _loss(
        self, rows: TokenRows, current: np.ndarray, weight: np.ndarray, kept: np.ndarray, denominator: np.ndarray
    ) -> None:
        """``pg_loss`` (the PPO loss times the TIS function's weight), ``pg_clipfrac`` (``surr2 > surr1``) and
        ``ppo_kl`` (old - current) per token, summed over the mask the TIS function returns (``pg_loss``'s factor
        of batch normalisation applied in ``compute``)."""
        s = self.settings
        ppo_kl = rows.old - current
        per_token = [np.zeros(rows.n_tokens, dtype=np.float32)] * 2 + [ppo_kl]
        advantages = rows.advantages
        if advantages is not None:
            loss, binds = ppo_clip(exp32(-ppo_kl), advantages, s.eps_clip, s.eps_clip_high)
            if s.eps_clip_c is not None:  # dual-clip: a negative advantage's loss at most -eps_clip_c * A
                loss = np.where(advantages < 0, np.minimum(-np.float32(s.eps_clip_c) * advantages, loss), loss)
            per_token[:2] = [loss * weight, binds.astype(np.float32)]
        sums = np.array([rows.row_sum(np.where(kept != 0, v, np.float32(0.0))) for v in per_token])
        self.add(
            kl_seen=float(rows.n_rows),  # rows, not blocks: a state is the same however the rows were cut
            loss_seen=float(rows.n_rows) if advantages is not None else 0.0,
            loss_sample=(sums / denominator).sum(axis=1),
            loss_token=sums.sum(axis=1),
        )

    def _truncated(self, per_token: dict[str, np.ndarray], kept: np.ndarray) -> np.ndarray | None:
        """Where the TIS function's clamp moved a kept token's weight (``None`` where it only masks)."""
        s = self.settings
        if not s.runs_tis or s.function == ICEPOP:
            return None
        if s.function is None:
            return (per_token[PREFIX + "tis_clipfrac"] != 0) & (kept != 0)
        mis = s.mis
        if mis is None or not s.use_tis or mis.tis_mode == "mask":
            return None
        before, after = (per_token[f"{PREFIX}mis_tis_weight_{w}_bound"] for w in ("before", "after"))
        return (before != after) & (kept != 0)

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
        mean_train, mean_rollout = rows.row_mean(rows.old), rows.row_mean(rows.rollout)
        log_ppl_diff = mean_rollout - mean_train
        rho = exp32(np.clip(d, -bound, bound))
        chi2_token = rows.row_mean(rho * rho) - one
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
            return rows.per_token(seq_sum if name == "sequence" else rows.row_mean(d))

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
                named[f"{PREFIX}mis_{key}"] = rows.row_mean(weights)
            else:
                empty = np.float32(0.0)
                named[f"{PREFIX}mis_{key}"] = _row_reduce(rows, weights, function, empty)
        if mis.batch_normalize:
            named[f"{PREFIX}mis_batch_norm_factor"] = np.zeros(rows.n_rows, dtype=np.float32)  # set in compute()
        return per_token, named, weights, kept

    def keys(self) -> list[str]:
        """slime's order: the loss's keys before the abs diff, ``ois`` after it, before the TIS function's keys."""
        keys = self.settings.keys()
        ois = [OIS] if self.settings.runs_tis else []
        return [*LOSS_KEYS, *keys[:1], *ois, *keys[1:], *self.weight_keys()]

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
        total, over = ("loss_token", "denominator") if s.per_token else ("loss_sample", "rows")
        seen = {PG_LOSS: "loss_seen", PG_CLIPFRAC: "loss_seen", PPO_KL: "kl_seen"}
        for i, key in enumerate(LOSS_KEYS):
            if st["rows"] and st[seen[key]] == st["rows"]:
                value = st[total][i] / st[over] if st["rows"] else None
                values[key] = value / factor if value is not None and key == PG_LOSS else value
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
            if key == ABS_DIFF and s.runs_tis and st["rows"] and st["ois_seen"] == st["rows"]:
                total, over = ("ois_token", "denominator") if s.per_token else ("ois_sample", "rows")
                values[OIS] = st[total] / st[over] if st["rows"] else None
        values.update(self.weight_values())
        mean = self.weight_keys()[0]
        weight_mean = values[mean]
        values[mean] = None if weight_mean is None else weight_mean / factor  # the ESS and shares: scale-free
        return values, []


MIS_UNITS: dict[str, Unit] = {"token": "token", "sequence": "product", "geometric": "geomean"}
"""The MIS helper's weight levels as weights."""
CLAMP_HIGH = math.exp(SAFETY_BOUND)
OPEN_LOW, OPEN_HIGH = 1e-9, 1e9
"""Bounds beyond the MIS helper's +-20 clamp: a missing bound written so it bounds nothing."""


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
    eps_c = values["eps_clip_c"]
    if eps_c is not None and not eps_c > 1.0:
        raise ConfigError(f"eps_clip_c={eps_c:g} must be above 1: compute_policy_loss asserts it at every step")
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
        eps_clip=values["eps_clip"],
        eps_clip_high=values["eps_clip"] if values["eps_clip_high"] is None else values["eps_clip_high"],
        eps_clip_c=eps_c,
    )


OPTIONS = (
    Option("use_tis", "bool", False, "--use-tis: truncated importance sampling (and the TIS function's keys)"),
    Option("tis_clip", "number", 2.0, "--tis-clip: upper clamp of the ratio"),
    Option("tis_clip_low", "number", 0.0, "--tis-clip-low: lower clamp"),
    Option("get_mismatch_metrics", "bool", False, "--get-mismatch-metrics: run the TIS function for its keys"),
    Option("calculate_per_token_loss", "bool", False, "--calculate-per-token-loss: token means, not sample means"),
    Option("custom_tis_function_path", "choice", None, "--custom-tis-function-path: null (slime's default), "
           "icepop_function or the MIS helper", choices=(ICEPOP, MIS), nullable=True),
    Option("eps_clip", "number", 0.2, "--eps-clip: PPO clip range (pg_loss, pg_clipfrac)"),
    Option("eps_clip_high", "number", None, "--eps-clip-high: upper clip range (null: eps_clip)", nullable=True),
    Option("eps_clip_c", "number", None, "--eps-clip-c: dual-clip PPO's bound (above 1)", nullable=True),
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
_BASE = tuple(o.key for o in OPTIONS[:9])
_MIS = tuple(o.key for o in OPTIONS[9:])


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
        MetricKey(
            PG_LOSS,
            "the PPO clipped surrogate (dual-clip with eps_clip_c) times the TIS function's weight",
            "with the current policy and the advantages, whatever the TIS function",
        ),
        MetricKey(
            PG_CLIPFRAC,
            "share of tokens whose PPO clip binds (surr2 > surr1)",
            "with the current policy and the advantages, whatever the TIS function",
        ),
        MetricKey(
            PPO_KL,
            "old - current (k1 of the old policy against the current one)",
            "with the current policy, whatever the TIS function",
        ),
        MetricKey(ABS_DIFF, "|old - rollout| (the numerator on the tokens the TIS function keeps)"),
        MetricKey(
            OIS,
            "exp(current - old), the current policy against the old one (sample mean)",
            "the TIS function runs, with the current policy (--current-col)",
        ),
        *(MetricKey(PREFIX + key, reading, "the TIS function runs") for key, reading in readings.items()),
        *weight_keys("slime", "slime", "loss-mask token", "the TIS function"),
    )


def _tis(function: str | None) -> Callable[[float | None, float | None], dict[str, Any] | None]:
    """--use-tis with the default TIS function (a clamp) or icepop_function (a band), the bounds given."""

    def options(low: float | None, high: float | None) -> dict[str, Any] | None:
        if high is None and function is None:
            return None
        return {"use_tis": True, "custom_tis_function_path": function, "tis_clip": high or OPEN_HIGH,
                "tis_clip_low": low or 0.0}  # fmt: skip

    return options


def _mis(level: str, mode: str, normalize: bool) -> Callable[[float | None, float | None], dict[str, Any] | None]:
    """The MIS helper's weight at ``level`` in ``mode``, alone (no rejection, no veto: a rejection form adds them)."""

    def options(low: float | None, high: float | None) -> dict[str, Any] | None:
        if (mode == "clip" and low is None) or (mode == "truncate" and high is None):
            return None
        return {
            "use_tis": True, "custom_tis_function_path": MIS, "tis_level": level, "tis_mode": mode,
            "tis_lower_bound": low or OPEN_LOW, "tis_upper_bound": high or OPEN_HIGH, "use_rs": False,
            "rs_veto_threshold": None, "tis_batch_normalize": normalize,
        }  # fmt: skip

    return options


def _unclamped(level: str, normalize: bool) -> Callable[[float | None, float | None], dict[str, Any] | None]:
    """The MIS weight truncated beyond its +-20 clamp: not truncated."""
    return lambda low, high: _mis(level, "truncate", normalize)(None, OPEN_HIGH)


def _rs(level: str) -> Callable[[float | None, float | None], dict[str, Any] | None]:
    def options(low: float | None, high: float | None) -> dict[str, Any] | None:
        return {"use_tis": True, "custom_tis_function_path": MIS, "use_rs": True, "rs_level": level,
                "rs_lower_bound": low or OPEN_LOW, "rs_upper_bound": high or OPEN_HIGH}  # fmt: skip

    return options


def _veto(low: float | None, high: float | None) -> dict[str, Any] | None:
    if low is None or high is not None:
        return None
    return {"use_tis": True, "custom_tis_function_path": MIS, "use_rs": True, "rs_veto_threshold": low}


SWITCHES = {"use_rs": False, "rs_veto_threshold": None, "tis_batch_normalize": False}
"""MIS fields a weight form turns off and another form may turn on: on wins when two forms combine."""


def combine(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Forms as one setting: the MIS weight, its rejection and veto together (a switch one form turns on is on)."""
    merged = merge_options([{k: v for k, v in part.items() if k not in SWITCHES} for part in parts])
    if merged is None:
        return None
    for key, off in SWITCHES.items():
        values = [part[key] for part in parts if key in part]
        on = [v for v in values if v != off]
        if len(set(map(repr, on))) > 1:
            return None
        if values:
            merged[key] = on[0] if on else off
    return merged


def paste(options: Mapping[str, Any]) -> str:
    """slime's arguments as its flags (``--use-tis``), the MIS helper's fields as mis.yaml's lines."""
    flags = [
        f"--{key.replace('_', '-')}" + ("" if value is True else f" {value}")
        for key, value in options.items()
        if key in _BASE and value is not None and value is not False
    ]
    mis = [f"  {key}: {scalar(value)}" for key, value in options.items() if key in _MIS]
    return "\n".join([*flags, *(["mis.yaml:", *mis] if mis else [])]) + "\n"


FORMS = (
    Form("one", "none", lambda low, high: {"use_tis": False, "get_mismatch_metrics": False}),
    Form("token", "clamp", _tis(None)),
    Form("token", "band", _tis(ICEPOP), statistic="ratio"),
    *(
        form
        for normalize in (False, True)
        for level, unit in MIS_UNITS.items()
        for form in (
            Form(unit, "clamp", _mis(level, "truncate", normalize), normalize=normalize),
            Form(unit, "clamp", _mis(level, "clip", normalize), normalize=normalize),
            Form(unit, "band", _mis(level, "mask", normalize), statistic=UNIT_STATISTIC[unit], normalize=normalize),
            Form(unit, "none", _unclamped(level, normalize)),
        )
    ),
    *(Form("one", "band", _rs(level), statistic=UNIT_STATISTIC[unit]) for level, unit in MIS_UNITS.items()),
    Form("one", "band", _veto, statistic="all_ratios"),
)
"""slime's TIS functions and the MIS helper's weights, rejection and veto (which combine); a missing bound is
written beyond the helper's +-20 clamp."""

FRAMEWORK = Framework(
    name="slime",
    title="slime",
    release="624b824a",
    source=(
        "slime/backends/megatron_utils/loss.py:884-931, 964, 1031-1044, 1050-1107, 1136-1163, 1317; "
        "slime/utils/ppo_utils.py:125-148; "
        "slime/backends/megatron_utils/cp_utils.py:47-124; slime/observability/train_metric_utils.py:18-59; "
        "examples/train_infer_mismatch_helper/mis.py, mis.yaml"
    ),
    options=OPTIONS,
    keys=_keys(),
    settings=settings,
    left_out=(
        "left out: loss, entropy_loss and kl_loss (the whole loss, its entropies and the reference "
        "model), and train_rollout_logprob_abs_diff with use_rollout_logprobs (against the current policy), which "
        "rcdiag does not compute"
    ),
    batching="one training step (its samples as one micro-batch; each sample its own rollout)",
    forms=FORMS,
    combine=combine,
    spelling=paste,
)
