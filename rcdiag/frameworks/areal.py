"""AReaL 1.0.4's rejection sampling of stale or mismatched tokens (``areal/utils/functional/functional.py``:
``apply_rejection_sampling`` :185-425 and ``ppo_actor_loss_fn`` :429-560; logged by ``grpo_loss_fn`` in
``areal/trainer/ppo/actor.py:530-548`` under ``ppo_actor/update/``).

AReaL's decoupled loss (``actor.use_decoupled_loss``) compares the proximal policy's log-probs (recomputed by the
trainer: rcdiag's ``old_log_prob``) with the behaviour policy's (the inference engine's: rcdiag's
``rollout_log_prob``). Without it the trainer keeps one set of log-probs and the two sides are equal. With
``actor.rejection_sampling`` set, ``lr = prox - behave`` (float32, a non-finite value made 0) gives the weight
``exp(lr)`` (per token; at ``level: sequence`` with ``metric: ratio``, the row's geometric mean on each token); the
metric (the ratio ``exp(lr)``, or ``kl_k1 = lr``, ``kl_k2 = lr^2/2``, ``kl_k3 = exp(-lr) - 1 + lr`` of the raw
log-probs) is compared with ``[lower, upper]`` per token or per row (aggregated by ``sum``, ``mean`` or ``max``, in
log space for the ratio); ``mask`` drops what falls outside from the loss, ``clamp`` clamps the weight there.
Logged: ``behave_imp_weight`` and ``behave_approx_kl`` (``prox - behave``) as ``avg``/``min``/``max`` over the tokens
kept with a weight above 0, that count (``unclipped_behave_tokens``) and ``rs_filtered_fraction``.

With the current policy's log-probs in the dump (``--current-col``), the PPO loss's stats, which ``grpo_loss_fn``
logs whatever the rejection sampling, are computed too (``ppo_actor_loss_fn`` :497-560): over the valid tokens
(``n_valid_tokens``, the loss mask before rejection sampling) the ``avg``/``min``/``max`` of ``importance_weight``
(``exp(current - prox)``, 0 where rejection sampling masked the token; at ``importance_sampling_level: sequence`` the
response's geometric mean over its kept tokens), ``approx_kl`` (``current - prox``) and ``new_logp``; with the
advantages as well (``--advantages-col``; at the sequence level each response's mean over its kept tokens), the
clip flags ``clip_ratio`` and ``dual_clip_ratio`` (and their counts ``clipped_tokens``, ``dual_clipped_tokens``:
tokens kept by rejection sampling whose clipped loss binds) and ``actor_loss`` (each token's clipped loss times the
rejection-sampling weight). The proximal policy is the trainer's log-probs in the decoupled loss, else the inference
engine's (``recompute_logprob`` false, AReaL's default).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rcdiag.catalogue.metrics import framework_note
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
from rcdiag.frameworks.correction import Band, Correction, Form, Unit, Weight, k_bound, ratio_band
from rcdiag.frameworks.loss import ppo_clip
from rcdiag.metrics.base import MetricValue, Reduce, VerlCrash
from rcdiag.runtime.errors import ConfigError

DECOUPLED = "actor.use_decoupled_loss"
REJECTION = "actor.rejection_sampling"
SCOPE = "ppo_actor/update/"
WEIGHT = SCOPE + "behave_imp_weight"
KL = SCOPE + "behave_approx_kl"
KEPT = SCOPE + "unclipped_behave_tokens"
FILTERED = SCOPE + "rs_filtered_fraction"
EPS = "actor.eps_clip"
EPS_HIGH = "actor.eps_clip_higher"
C_CLIP = "actor.c_clip"
LEVEL = "actor.importance_sampling_level"
CLIPPED = SCOPE + "clipped_tokens"
DUAL_CLIPPED = SCOPE + "dual_clipped_tokens"
CURRENT_STATS = ("importance_weight", "approx_kl", "new_logp")
"""The loss's stats from the current policy alone (``grpo_loss_fn``'s order)."""
LOSS_STATS = ("actor_loss", "clip_ratio", "dual_clip_ratio")
"""Those that need the advantages too."""
STATS = (*CURRENT_STATS, *LOSS_STATS)
FIELDS = (
    Option(
        "level",
        "choice",
        "token",
        "token, or sequence (every token of a row shares its fate)",
        choices=("token", "sequence"),
    ),
    Option("action", "choice", "mask", "mask: drop from the loss; clamp: clamp the weight", choices=("mask", "clamp")),
    Option(
        "metric",
        "choice",
        "ratio",
        "ratio, or a KL estimate of prox vs behave",
        choices=("ratio", "kl_k1", "kl_k2", "kl_k3"),
    ),
    Option(
        "agg", "choice", "mean", "a row's metric (level sequence): sum, mean or max", choices=("sum", "mean", "max")
    ),
    Option("upper", "number", 5.0, "upper bound"),
    Option("lower", "number", None, "lower bound", nullable=True),
)


@dataclass(frozen=True)
class Rejection:
    """``RejectionSamplingConfig`` after its ``__post_init__`` (clamp's lower bound defaults to 0)."""

    level: str
    action: str
    metric: str
    agg: str
    upper: float
    lower: float | None

    def band(self) -> Band:
        """What a mask zeroes, in the shared vocabulary: a bound on one token's k1, or on its k2 or k3 from above,
        is a band on its ratio; per response, the aggregate of the ratio (or of k1) is a product, geometric mean or
        largest ratio."""
        label = self.label()
        low: float | None = self.lower
        high: float | None = self.upper
        if self.metric in ("ratio", "kl_k1"):
            if self.metric == "kl_k1":
                low, high = _exp(low), _exp(high)
            statistic = "ratio" if self.level == "token" else SEQUENCE_RATIO[self.agg]
            return Band(statistic, low, high, label=label)
        kind = "k2" if self.metric == "kl_k2" else "k3r"
        if self.level == "sequence":
            return Band(f"{self.agg}_{kind}", low, high, label=label)
        if low is None or low <= 0:
            return Band("ratio", *ratio_band(kind, self.upper, clamp=None), label=label)
        return Band(f"token_{kind}", low, high, label=label)

    def label(self) -> str:
        bounds = f"[{_g(self.lower)}, {_g(self.upper)}]"
        agg = f" {self.agg}" if self.level == "sequence" else ""
        return f"rejection_sampling {self.level} {self.action} {self.metric}{agg} {bounds}"

    def in_bounds(self, metric: np.ndarray) -> np.ndarray:
        """``_check_bounds``: within [lower, upper] (float32 compared with the bounds rounded to float32)."""
        inside = metric <= np.float32(self.upper)
        return inside & (metric >= np.float32(self.lower)) if self.lower is not None else inside


def stat_keys(names: tuple[str, ...]) -> tuple[str, ...]:
    """``ppo_actor/update/NAME/avg|min|max`` of each name."""
    return tuple(f"{SCOPE}{name}/{s}" for name in names for s in ("avg", "min", "max"))


@dataclass(frozen=True)
class ArealSettings:
    decoupled: bool
    rejection: Rejection | None
    eps_clip: float = 0.2
    eps_clip_higher: float | None = None
    c_clip: float | None = None
    level: str = "token"
    """``importance_sampling_level`` of the PPO ratio (``sequence``: GSPO), apart from rejection sampling's."""

    def new_metrics(self) -> ArealMetrics:
        """Always: the loss's stats are logged whatever the rejection sampling (from the loss inputs)."""
        return ArealMetrics(self)

    def needs(self) -> tuple[Needs, ...]:
        return (
            Needs(stat_keys(CURRENT_STATS), ("log_prob",)),
            Needs((CLIPPED, DUAL_CLIPPED, *stat_keys(LOSS_STATS)), ("log_prob", "advantages")),
        )

    def notes(self) -> tuple[str, ...]:
        loss = (
            "the loss's stats (importance_weight, approx_kl, new_logp, actor_loss, clip_ratio, dual_clip_ratio) are "
            "over the step's valid tokens against the proximal policy (the trainer's log-probs in the decoupled loss, "
            "else the inference engine's); AReaL logs them per PPO minibatch with that minibatch's policy: rcdiag's "
            "are of the one current policy the dump holds",
        )
        if self.rejection is None:
            return (f"{REJECTION} is null (AReaL's default): it filters nothing and logs no behave_* key", *loss)
        notes = [
            "rs_filtered_fraction is AReaL's mean over the step's micro-batch calls of each one's filtered share; "
            "rcdiag gives it for the step as one micro-batch (ppo_n_minibatches 1), pooled for all steps as one",
            framework_note("areal", "the weight AReaL puts on each token's loss, 0 where rejection sampling drops it"),
        ]
        if not self.decoupled:
            notes.insert(
                0,
                f"{DECOUPLED} is false (AReaL's default): the trainer keeps one engine's log-probs, so AReaL sees "
                "no mismatch (weights 1, KL 0) whatever the dump holds; set it true to compare the two",
            )
        return (*notes, *loss)

    def correction(self) -> Correction:
        rs = self.rejection
        if rs is None:
            return Correction(Weight("one", label=f"{REJECTION}: null (no rejection sampling)"))
        if not self.decoupled:  # lr = 0 on every token: weight 1, kept unless 0's metric is out of bounds
            zero = np.float32(1.0) if rs.metric == "ratio" else np.float32(0.0)
            if bool(rs.in_bounds(np.asarray([zero]))[0]):
                label = f"{DECOUPLED}: false (one engine's log-probs on both sides: weight 1, nothing rejected)"
                return Correction(Weight("one", label=label))
            what = "dropped" if rs.action == "mask" else "weighted by the clamp's bound"
            text = f"{DECOUPLED}: false with {rs.label()}: every token {what} (a log-ratio of 0 is out of bounds)"
            return Correction(Weight("one"), other=(text,))
        quirks = (
            "makes a non-finite log-ratio 0",
            "drops a zeroed token from the loss but still divides by the original token count",
        )
        label = rs.label()
        if rs.action == "clamp":
            if rs.level == "token" or rs.agg == "mean":
                unit: Unit = "token" if rs.level == "token" else "geomean"
                return Correction(Weight(unit, rs.lower, rs.upper, label=label), quirks=quirks).normal()
            where = SEQUENCE_WORDS[rs.agg]
            text = f"{label}: the geometric-mean weight clamped only in a response whose {where} is outside"
            return Correction(Weight("geomean"), other=(text,), quirks=quirks)
        weighted: Unit = "geomean" if rs.level == "sequence" and rs.metric == "ratio" else "token"
        return Correction(Weight(weighted, label=label), (rs.band(),), quirks=quirks).normal()

    def to_dict(self) -> dict[str, Any]:
        rejection = None if self.rejection is None else self.rejection.__dict__.copy()
        return {
            DECOUPLED: self.decoupled,
            REJECTION: rejection,
            EPS: self.eps_clip,
            EPS_HIGH: self.eps_clip_higher,
            C_CLIP: self.c_clip,
            LEVEL: self.level,
        }

    def apply(self, rows: TokenRows) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """(weight on each valid token, 0 where dropped; ``prox - behave`` per token; the tokens filtered or clamped
        (``rs_filtered_fraction``'s); those clamped, ``None`` where it masks)."""
        rs = self.rejection
        assert rs is not None
        raw = rows.diff if self.decoupled else np.zeros_like(rows.diff)
        lr = np.where(np.isfinite(raw), raw, np.float32(0.0))
        weight = exp32(lr)
        original = weight
        metric = _metric(rs.metric, raw, lr)
        if rs.level == "sequence":
            if rs.metric == "ratio":
                weight = rows.per_token(exp32(rows.row_mean(lr)))
                original = weight
            values = lr if rs.metric == "ratio" else metric
            if rs.agg == "max":
                agg = rows.row_max(values, np.float32(0.0))
            elif rs.agg == "mean":
                agg = rows.row_mean(values)
            else:
                agg = rows.row_sum(values).astype(np.float32)
            row_metric = exp32(agg) if rs.metric == "ratio" else agg
            inside = rows.per_token(rs.in_bounds(row_metric))
        else:
            inside = rs.in_bounds(metric) if rs.action == "mask" else np.ones(rows.n_tokens, dtype=bool)
        if rs.action == "mask":
            return np.where(inside, weight, np.float32(0.0)), raw, ~inside, None
        low = np.float32(rs.lower if rs.lower is not None else 0.0)
        clamped = np.minimum(np.maximum(weight, low), np.float32(rs.upper))
        weight = clamped if rs.level == "token" else np.where(inside, weight, clamped)
        moved = original != weight
        return weight, raw, moved, moved


SEQUENCE_RATIO = {"sum": "product", "mean": "geomean", "max": "max_ratio"}
"""A response's aggregate of log-ratios, as a ratio statistic."""
SEQUENCE_WORDS = {"sum": "product of ratios", "mean": "geometric-mean ratio", "max": "largest token ratio"}


def _exp(value: float | None) -> float | None:
    """A bound on a log-ratio as a bound on the ratio (``inf`` past float64's range)."""
    if value is None:
        return None
    return math.exp(value) if value < 709.0 else math.inf


def _g(value: float | None) -> str:
    return "null" if value is None else f"{value:g}"


def _metric(name: str, raw: np.ndarray, lr: np.ndarray) -> np.ndarray:
    """The rejection metric per token, as ``KLEstimator._compute_approx_kl`` computes it in float32 (unclamped)."""
    if name == "ratio":
        return exp32(lr)
    if name == "kl_k1":
        return raw
    if name == "kl_k2":
        return raw * raw / np.float32(2.0)
    return exp32(-raw) - np.float32(1.0) + raw


class ArealMetrics(FrameworkMetrics):
    """One step's ``ppo_actor/update/behave_*`` keys and rcdiag's token-weighted reading of the weights."""

    NAME = "areal"
    STATES: ClassVar[dict[str, Reduce]] = {
        **FrameworkMetrics.WEIGHT_STATES,
        "loss_seen": "sum",
        "adv_seen": "sum",
        "valid": "sum",
        "clipped": "sum",
        "dual_clipped": "sum",
        **{f"{name}_sum": "sum" for name in STATS},
        **{f"{name}_min": "min" for name in STATS},
        **{f"{name}_max": "max" for name in STATS},
        "kept": "sum",
        "kept_sum": "sum",
        "weight_min": "min",
        "weight_max": "max",
        "kl_sum": "sum",
        "kl_min": "min",
        "kl_max": "max",
        "changed": "sum",
    }
    settings: ArealSettings

    def update(self, block: Any) -> None:
        rows = TokenRows(block)
        if self.settings.rejection is None:
            if rows.current is not None:
                self._loss(rows, rows.current, np.ones(rows.n_tokens, dtype=bool), None)
            return
        weight, raw, changed, clamped = self.settings.apply(rows)
        if rows.current is not None:
            keep = ~changed if self.settings.rejection.action == "mask" else np.ones(rows.n_tokens, dtype=bool)
            self._loss(rows, rows.current, keep, weight)
        behave = weight > 0
        kept_weight = weight[behave].astype(np.float64)
        kl = np.where(behave, raw, np.float32(0.0))[behave].astype(np.float64)
        self.add(
            kept=float(kept_weight.size),
            kept_sum=float(kept_weight.sum()),
            weight_min=float(kept_weight.min()) if kept_weight.size else np.inf,
            weight_max=float(kept_weight.max()) if kept_weight.size else -np.inf,
            changed=float(np.count_nonzero(changed)),
        )
        self.add_spread("kl", kl)
        self.add_weights(weight, rows, clamped)

    def _loss(self, rows: TokenRows, current: np.ndarray, keep: np.ndarray, weight: np.ndarray | None) -> None:
        """``ppo_actor_loss_fn``'s stats (float32, as torch computes them): ``keep``, the tokens rejection sampling
        leaves in the loss mask; ``weight``, its ``behave_imp_weight`` (``None``: off)."""
        s = self.settings
        prox = rows.old if s.decoupled else rows.rollout
        log_ratio = current - prox
        zero = np.float32(0.0)
        advantages = rows.advantages
        if s.level == "sequence":
            ratio = np.where(keep, rows.per_token(exp32(rows.row_mean(log_ratio, keep))), zero)
            if advantages is not None:
                advantages = np.where(keep, rows.per_token(rows.row_mean(advantages, keep)), zero)
        else:
            ratio = np.where(keep, exp32(log_ratio), zero)
        stats = {"importance_weight": ratio, "approx_kl": log_ratio, "new_logp": current}
        self.add(loss_seen=float(rows.n_rows), valid=float(rows.n_tokens))  # rows, not blocks: however cut
        if advantages is not None:
            high = s.eps_clip if s.eps_clip_higher is None else s.eps_clip_higher
            loss, binds = ppo_clip(ratio, advantages, s.eps_clip, high)
            clip = binds & keep
            dual = np.zeros(rows.n_tokens, dtype=bool)
            if s.c_clip is not None:
                loss3 = np.sign(advantages) * np.float32(s.c_clip) * advantages
                dual = (loss3 < loss) & keep
                loss = np.minimum(loss, loss3)
            if weight is not None:
                loss = loss * weight
            stats.update(actor_loss=loss, clip_ratio=clip.astype(np.float32), dual_clip_ratio=dual.astype(np.float32))
            self.add(
                adv_seen=float(rows.n_rows),
                clipped=float(np.count_nonzero(clip)),
                dual_clipped=float(np.count_nonzero(dual)),
            )
        for name, values in stats.items():
            self.add_spread(name, values)

    def _loss_values(self) -> dict[str, MetricValue]:
        """The loss's stats where every block had their inputs, in ``grpo_loss_fn``'s order (the denominators first);
        an average or extreme without a valid token is dropped by AReaL, ``None`` here."""
        st = self.state
        if not st["loss_seen"]:
            return {}
        both = st["adv_seen"] == st["loss_seen"]
        values: dict[str, MetricValue] = {CLIPPED: st["clipped"], DUAL_CLIPPED: st["dual_clipped"]} if both else {}
        n = st["valid"]
        for name in STATS if both else CURRENT_STATS:
            values[f"{SCOPE}{name}/avg"] = st[f"{name}_sum"] / n if n else None
            values[f"{SCOPE}{name}/min"] = st[f"{name}_min"] if n else None
            values[f"{SCOPE}{name}/max"] = st[f"{name}_max"] if n else None
        return values

    def keys(self) -> list[str]:
        loss = [CLIPPED, DUAL_CLIPPED, *stat_keys(STATS)]
        if self.settings.rejection is None:
            return loss
        return [
            *loss,
            KEPT,
            *(f"{key}/{s}" for key in (WEIGHT, KL) for s in ("avg", "min", "max")),
            FILTERED,
            *self.weight_keys(),
        ]

    def compute(self) -> tuple[dict[str, MetricValue], list[VerlCrash]]:
        """AReaL drops a key whose denominator is 0 (and a min/max that stays infinite); ``None`` here."""
        st = self.state
        if self.settings.rejection is None:
            return self._loss_values(), []
        kept, tokens = st["kept"], st["tokens"]
        return {  # in the order AReaL's tracker exports them (the denominator first)
            **self._loss_values(),
            KEPT: kept,
            f"{WEIGHT}/avg": st["kept_sum"] / kept if kept else None,
            f"{WEIGHT}/min": st["weight_min"] if kept else None,
            f"{WEIGHT}/max": st["weight_max"] if kept else None,
            f"{KL}/avg": st["kl_sum"] / kept if kept else None,
            f"{KL}/min": st["kl_min"] if kept else None,
            f"{KL}/max": st["kl_max"] if kept else None,
            FILTERED: st["changed"] / max(tokens, 1.0),
            **self.weight_values(),
        }, []


def settings(values: Mapping[str, Any], given: frozenset[str] = frozenset()) -> ArealSettings:
    """``RejectionSamplingConfig.__post_init__``'s checks, with AReaL's messages."""
    c_clip = values[C_CLIP]
    if c_clip is not None and c_clip <= 1.0:
        raise ConfigError(f"{C_CLIP} must be > 1.0 (AReaL asserts c_clip > 1.0), got {c_clip}")
    loss = {
        "eps_clip": values[EPS],
        "eps_clip_higher": values[EPS_HIGH],
        "c_clip": c_clip,
        "level": values[LEVEL],
    }
    block = values[REJECTION]
    if block is None:
        return ArealSettings(values[DECOUPLED], None, **loss)
    level, action, metric, agg = block["level"], block["action"], block["metric"], block["agg"]
    upper, lower = block["upper"], block["lower"]
    if lower is not None and lower > upper:
        raise ConfigError(f"lower ({lower}) cannot be greater than upper ({upper})")
    if metric == "ratio":
        if upper <= 1.0:
            raise ConfigError(
                "upper must be > 1.0 for 'ratio' metric (otherwise all non-identical policy tokens will be "
                f"filtered), got {upper}"
            )
        if lower is not None and lower <= 0:
            raise ConfigError(f"lower must be positive for 'ratio' metric, got {lower}")
    if metric in ("kl_k2", "kl_k3") and upper <= 0:
        raise ConfigError(f"upper must be positive for '{metric}' metric, got {upper}")
    if action == "clamp" and metric != "ratio":
        raise ConfigError(
            f"action='clamp' only supports metric='ratio' (direct importance weight truncation). Got "
            f"metric='{metric}'. Use action='mask' for KL-based filtering."
        )
    if action == "clamp" and lower is None:
        lower = 0.0
    return ArealSettings(values[DECOUPLED], Rejection(level, action, metric, agg, upper, lower), **loss)


def _form(
    level: str, action: str, metric: str, agg: str = "mean", log: bool = False
) -> Callable[[float | None, float | None], dict[str, Any] | None]:
    """Rejection sampling of this kind with the bounds given (on the ratio; ``log``: written on its log, kl_k1)."""

    def options(low: float | None, high: float | None) -> dict[str, Any] | None:
        if high is None or (log and high <= 0):
            return None
        if log:
            low, high = (None if low is None or low <= 0 else math.log(low)), math.log(high)
        block = {"level": level, "action": action, "metric": metric, "agg": agg, "upper": high, "lower": low}
        return {DECOUPLED: True, REJECTION: block}

    return options


def _every_token(metric: str, kind: str) -> Callable[[float | None, float | None], dict[str, Any] | None]:
    """A band on every token's ratio as the largest k of a response (``agg: max``), at the bound reaching it."""

    def options(low: float | None, high: float | None) -> dict[str, Any] | None:
        bound = k_bound(kind, low, high)
        return None if bound is None else _form("sequence", "mask", metric, "max")(None, bound)

    return options


FORMS = (
    Form("one", "none", lambda low, high: {REJECTION: None}),
    Form("token", "clamp", _form("token", "clamp", "ratio")),
    Form("token", "band", _form("token", "mask", "ratio"), statistic="ratio"),
    Form("token", "band", _form("token", "mask", "kl_k1", log=True), statistic="ratio"),
    Form("token", "band", _form("token", "mask", "kl_k2"), statistic="token_k2"),
    Form("token", "band", _form("token", "mask", "kl_k3"), statistic="token_k3r"),
    Form("geomean", "clamp", _form("sequence", "clamp", "ratio")),
    *(
        Form("geomean", "band", _form("sequence", "mask", "ratio", agg), statistic=s)
        for agg, s in SEQUENCE_RATIO.items()
    ),
    *(
        Form("token", "band", _form("sequence", "mask", "kl_k1", agg, log=True), statistic=s)
        for agg, s in SEQUENCE_RATIO.items()
    ),
    *(
        Form("token", "band", _form("sequence", "mask", metric, agg), statistic=f"{agg}_{kind}")
        for metric, kind in (("kl_k2", "k2"), ("kl_k3", "k3r"))
        for agg in ("sum", "mean", "max")
    ),
    Form("geomean", "band", lambda low, high: _form("sequence", "mask", "ratio", "max")(None, high), "all_ratios"),
    *(
        Form("token", "band", _every_token(metric, kind), statistic="all_ratios")
        for metric, kind in (("kl_k2", "k2"), ("kl_k3", "k3r"))
    ),
)
"""Every kind of rejection sampling, in the decoupled loss (AReaL's own checks refuse a ratio bound upper <= 1:
kl_k1 writes that band on the log-ratio)."""

CURRENT_WHEN = "with the current policy"
LOSS_WHEN = "with the current policy and the advantages"
STAT_READINGS = {
    "importance_weight": "the PPO ratio exp(current - prox), 0 where rejection sampling masks",
    "approx_kl": "current - prox",
    "new_logp": "the current log-prob",
    "actor_loss": "the clipped PPO loss times the rejection weight",
    "clip_ratio": "1 where the PPO clip binds on a kept token, else 0",
    "dual_clip_ratio": "1 where the dual clip binds on a kept token, else 0",
}


def _stat_metric_keys(name: str, reading: str, when: str) -> tuple[MetricKey, ...]:
    """A loss stat's three keys: its mean, least and greatest over the valid tokens."""
    return tuple(
        MetricKey(f"{SCOPE}{name}/{s}", f"{word} over the valid tokens of {reading}", when)
        for s, word in (("avg", "mean"), ("min", "least"), ("max", "greatest"))
    )


FRAMEWORK = Framework(
    name="areal",
    title="AReaL",
    release="1.0.4",
    source="areal/utils/functional/functional.py:185-560; areal/trainer/ppo/actor.py:530-548",
    options=(
        Option(DECOUPLED, "bool", False, "decoupled PPO: proximal (trainer) vs behaviour (inference) log-probs"),
        Option(REJECTION, "block", None, "rejection sampling; null: off", nullable=True, fields=FIELDS),
        Option(EPS, "number", 0.2, "PPO clip: the ratio clamped to [1 - eps_clip, 1 + eps_clip_higher]"),
        Option(EPS_HIGH, "number", None, "PPO clip's upper side (null: eps_clip)", nullable=True),
        Option(C_CLIP, "number", None, "dual clip (> 1): a token's loss at most c_clip |A|; null: off", nullable=True),
        Option(
            LEVEL,
            "choice",
            "token",
            "the PPO ratio per token, or per response (GSPO: the geometric mean over its kept tokens)",
            choices=("token", "sequence"),
        ),
    ),
    keys=(
        MetricKey(KEPT, "tokens kept with a weight above 0 (the denominator of the behave_* averages)"),
        MetricKey(f"{WEIGHT}/avg", "mean weight exp(prox - behave) over the tokens kept with weight > 0"),
        MetricKey(f"{WEIGHT}/min", "smallest kept weight"),
        MetricKey(f"{WEIGHT}/max", "largest kept weight"),
        MetricKey(f"{KL}/avg", "mean prox - behave over the kept tokens (k1 of KL(prox||behave)), signed"),
        MetricKey(f"{KL}/min", "smallest prox - behave kept"),
        MetricKey(f"{KL}/max", "largest prox - behave kept"),
        MetricKey(FILTERED, "share of loss tokens rejection sampling dropped (mask) or clamped (clamp)"),
        MetricKey(CLIPPED, "valid tokens kept whose PPO clip binds", LOSS_WHEN),
        MetricKey(DUAL_CLIPPED, "valid tokens kept whose dual clip binds (0 without c_clip)", LOSS_WHEN),
        *(
            key
            for name, reading in STAT_READINGS.items()
            for key in _stat_metric_keys(name, reading, LOSS_WHEN if name in LOSS_STATS else CURRENT_WHEN)
        ),
        *weight_keys("areal", "AReaL", "loss token", "AReaL's rejection sampling"),
    ),
    settings=settings,
    left_out=(
        "left out: entropy (the current policy's entropies), n_tokens, n_valid_tokens and old_logp (not yet), "
        "SAPO (use_sapo_loss) and M2PO (m2_threshold), which sorts a whole micro-batch"
    ),
    prefixes=("actor.",),
    batching="one PPO update (ppo_update over the step's batch; rs_filtered_fraction per micro-batch call)",
    forms=FORMS,
)
