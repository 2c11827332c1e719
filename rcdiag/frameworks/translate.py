"""What a verl setting means in another framework's terms (``rcdiag translate SETTING --to NAME``).

Each part of a verl configuration (its IS weight; each RS option) is translated on its own into the target's
options, marked ``same`` (the target's code puts the same weight on every token), ``same_rejections`` (it rejects or
zeroes the same tokens or responses, but weights the kept ones otherwise), ``nearest`` (the closest it has, with
what differs) or ``none`` (nothing alike); tests run both on dumps and compare each claim. Where the
semantics differ it says how: one- and two-sided clamps, products and geometric means, a rejection (verl's RS: the
token leaves the loss, the kept ones keep weight 1) and a weight (a masked ratio: the kept ones carry their ratio),
and verl's k1 band, which keeps the ratio pi_train/pi_rollout in [1/U, 1/L] for ``"L_U"``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from rcdiag.config import CorrectionConfig, ISSpec, RSOption
from rcdiag.core.limits import SAFETY_BOUND
from rcdiag.errors import ConfigError
from rcdiag.frameworks.registry import choose

Match = Literal["same", "same_rejections", "nearest", "none"]
"""``same``: the same weight on every token; ``same_rejections``: the same tokens (or responses) rejected or
zeroed, the kept ones weighted differently (said how); ``nearest``: the closest it has; ``none``: nothing alike."""
TARGETS = ("trl", "openrlhf", "areal", "skyrl")
"""The frameworks a verl setting translates to."""


@dataclass(frozen=True)
class Translation:
    """One part of the verl setting in the target's terms."""

    part: str
    """The verl part, in words (``IS token TIS 2``, ``RS seq_mean_k1 0.999_1.001``)."""
    match: Match
    options: dict[str, Any] = field(default_factory=dict)
    """The target's options to give (``--as-option KEY=VALUE``); empty for ``none``."""
    meaning: str = ""

    def as_options(self) -> list[str]:
        """The options as ``KEY=VALUE`` texts (JSON values)."""
        import json

        return [
            f"{key}={value if isinstance(value, str) else json.dumps(value)}" for key, value in self.options.items()
        ]

    def to_dict(self) -> dict[str, Any]:
        return {"part": self.part, "match": self.match, "options": self.options, "meaning": self.meaning}


def combined(parts: list[Translation]) -> dict[str, Any] | None:
    """Every part's options as one setting of the target, or ``None`` where two parts need different values of one
    option (the target applies one of them at a time)."""
    merged: dict[str, Any] = {}
    for part in parts:
        for key, value in part.options.items():
            if key in merged and merged[key] != value:
                return None
            merged[key] = value
    return merged


def translate(config: CorrectionConfig, to: str) -> list[Translation]:
    """Each part of ``config`` (verl's) in the terms of ``to`` (``TARGETS``); every option set is
    checked by that framework's own validation (``choose``)."""
    target = to.strip().lower()
    if target not in TARGETS:
        raise ConfigError(f"--to {to}: rcdiag translates verl's settings to {', '.join(TARGETS)}")
    resolved = config.resolve()
    parts: list[Translation] = []
    if resolved.is_spec is not None:
        parts.append(_is(resolved.is_spec, target))
        if resolved.is_spec.batch_normalize:
            parts.append(Translation("IS batch normalization", "none", meaning=_NO_NORMALIZE))
    parts.extend(_rs(option, target) for option in resolved.rs_options)
    if config.bypass_mode:
        parts.append(Translation("bypass_mode", "none", meaning=_BYPASS[target]))
    if not parts:
        parts.append(Translation("metrics only (no IS, no RS)", "same", _OFF[target], _OFF_MEANING[target]))
    for part in parts:
        if part.options:
            choose(target, part.options)  # the framework's own checks: a translation it refuses is a bug here
    return parts


_NO_NORMALIZE = (
    "none of TRL 1.16.0, OpenRLHF 0.11.0, AReaL 1.0.4 and SkyRL a9564572e normalises the weights of a batch to mean 1"
)
_BYPASS = {
    "trl": "TRL always recomputes the old log-probs when it corrects (vllm_importance_sampling_correction)",
    "openrlhf": "OpenRLHF recomputes the old log-probs; its correction compares them with vLLM's",
    "areal": "AReaL without actor.use_decoupled_loss trains on one engine's log-probs, which is bypass mode's view",
    "skyrl": "SkyRL recomputes the old log-probs whenever an off-policy correction is on; its rollout_is and cispo "
    "(cispo_anchor rollout) losses are the nearest to bypass mode, outside off_policy_correction",
}
_OFF: dict[str, dict[str, Any]] = {
    "trl": {"vllm_importance_sampling_correction": False},
    "openrlhf": {"algo.advantage.is_correction_enable": False},
    "areal": {"actor.rejection_sampling": None},
    "skyrl": {},
}
_OFF_MEANING = {
    "trl": "no correction: TRL then logs no sampling/* key (verl still logs its off-policy metrics)",
    "openrlhf": "no correction (OpenRLHF's default): no vllm_kl either",
    "areal": "no rejection sampling (AReaL's default): no behave_* key either",
    "skyrl": "no off-policy correction (SkyRL's default): it still logs policy/rollout_train_logprobs_abs_diff_*",
}
_DECOUPLED = {"actor.use_decoupled_loss": True}
_AREAL_KEPT = "AReaL weights the kept ones by exp(prox - behave) (verl's RS alone keeps weight 1)"
_RS_WEIGHT = {
    "trl": "TRL's mask zeroes the ratio of the same tokens but weights the kept ones by their ratio (verl's RS "
    "alone keeps weight 1)",
    "openrlhf": "OpenRLHF zeroes the coefficient of the same tokens but weights the kept ones by their ratio (verl's "
    "RS alone keeps weight 1)",
    "areal": "AReaL drops the same tokens from the loss but weights the kept ones by exp(prox - behave) (verl's RS "
    "alone keeps weight 1)",
}


def _is(spec: ISSpec, target: str) -> Translation:
    upper, lower = spec.upper, spec.lower
    if spec.level == "token":
        if lower is None:
            part = f"IS token TIS {upper:g} (each token's ratio clamped from above)"
            clamp = "; verl clamps the log-ratio at +-20 first (a difference only beyond e^20)"
            if target == "skyrl":
                return _skyrl_is(part, "token", None, upper)
            if target == "trl":
                options = _trl("token_truncate", None, upper)
                return Translation(part, "same", options, "token_truncate clamps each ratio at C_max" + clamp)
            if target == "openrlhf":
                options = _openrlhf("tis", 0.0, upper)
                meaning = "OpenRLHF's tis clamps from both sides: a lower bound 0 makes it one-sided, as verl's"
                return Translation(part, "same", options, meaning + clamp)
            if upper <= 1.0:
                return Translation(part, "none", meaning="AReaL refuses a ratio bound upper <= 1")
            options = {**_DECOUPLED, "actor.rejection_sampling": _areal("token", "clamp", "ratio", "mean", upper)}
            return Translation(part, "same", options, "AReaL's clamp takes lower 0 by default: one-sided" + clamp)
        part = f"IS token IcePop {lower:g}_{upper:g} (a ratio outside [L, U] weighted 0)"
        if target == "skyrl":
            return _skyrl_is(part, "token", lower, upper)
        if target == "trl":
            options = _trl("token_mask", lower, upper)
            return Translation(part, "same", options, "token_mask zeroes a ratio outside [C_min, C_max], inclusive")
        if target == "openrlhf":
            return Translation(part, "same", _openrlhf("icepop", lower, upper), "icepop keeps [low, high], inclusive")
        if upper <= 1.0:
            return Translation(part, "none", meaning="AReaL refuses a ratio bound upper <= 1")
        options = {**_DECOUPLED, "actor.rejection_sampling": _areal("token", "mask", "ratio", "mean", upper, lower)}
        meaning = (
            "AReaL drops the token from the loss but still divides by the original token count: the gradient of a "
            "zero weight"
        )
        return Translation(part, "same", options, meaning)
    if lower is None:
        part = f"IS sequence TIS {upper:g} (the product of a response's ratios clamped from above)"
        if target == "skyrl":
            return _skyrl_is(part, "sequence", None, upper)
        if target == "trl":
            options = _trl("sequence_truncate", None, upper)
            return Translation(part, "same", options, "TRL does not clamp the log of the product (verl: +-20)")
        if target == "openrlhf":
            return Translation(part, "none", meaning="OpenRLHF 0.11.0 has no sequence-level weight")
        meaning = (
            "AReaL's sequence weight is the geometric mean of the ratios, not their product: these options clamp "
            "the geometric-mean weight of the responses whose product exceeds the bound"
        )
        if upper <= 1.0:
            return Translation(part, "none", meaning="AReaL refuses a ratio bound upper <= 1")
        options = {**_DECOUPLED, "actor.rejection_sampling": _areal("sequence", "clamp", "ratio", "sum", upper)}
        return Translation(part, "nearest", options, meaning)
    part = f"IS sequence IcePop {lower:g}_{upper:g} (a response whose ratio product is outside [L, U] weighted 0)"
    if target == "skyrl":
        return _skyrl_is(part, "sequence", lower, upper)
    if target == "trl":
        options = _trl("sequence_mask", lower, upper)
        return Translation(part, "same", options, "sequence_mask zeroes a product outside [C_min, C_max]")
    if target == "openrlhf":
        meaning = "OpenRLHF's seq-mask-tis bounds the geometric mean, not the product (and keeps token ratios)"
        return Translation(part, "nearest", _openrlhf("seq-mask-tis", lower, upper), meaning)
    if upper <= 1.0:
        return Translation(part, "none", meaning="AReaL refuses a ratio bound upper <= 1")
    options = {**_DECOUPLED, "actor.rejection_sampling": _areal("sequence", "mask", "ratio", "sum", upper, lower)}
    meaning = "the same responses dropped (product outside [L, U]); AReaL weights the kept ones by the geometric mean"
    return Translation(part, "nearest", options, meaning)


def _rs(option: RSOption, target: str) -> Translation:
    spec = f"{option.lower:g}_{option.upper:g}" if option.is_k1 and option.lower is not None else f"{option.upper:g}"
    part = f"RS {option.name} {spec}"
    if option.is_k1:
        assert option.lower is not None
        low, high = 1.0 / option.upper, 1.0 / option.lower  # verl's inverted band: ratio kept in [1/U, 1/L]
        part += f" (keeps the ratio pi_train/pi_rollout in [{low:.6g}, {high:.6g}]: verl's k1 band is inverted)"
        if option.agg == "token":
            return _token_band(part, low, high, target, f"a token whose ratio is outside [{low:.6g}, {high:.6g}]")
        if target == "skyrl" and option.agg in ("mean", "sum"):
            return _skyrl_rows(part, "geometric" if option.agg == "mean" else "product", low, high)
        if option.agg == "mean":
            if target == "areal":
                rejection = _areal("sequence", "mask", "ratio", "mean", high, low)
                options = {**_DECOUPLED, "actor.rejection_sampling": rejection}
                return Translation(
                    part, "same_rejections", options, "the same responses dropped (geometric mean); " + _AREAL_KEPT
                )
            if target == "openrlhf":
                return Translation(part, "same_rejections", _openrlhf("seq-mask-tis", low, high), _RS_WEIGHT[target])
            meaning = "TRL 1.16.0 has no geometric-mean mask (its sequence_mask bounds the product, which grows)"
            return Translation(part, "none", meaning=meaning)
        # seq_sum_k1: the product, each token's log-ratio clamped at +-20 first
        if target == "trl":
            options = _trl("sequence_mask", low, high)
            return Translation(part, "same_rejections", options, "the same responses zeroed; " + _RS_WEIGHT[target])
        if target == "areal":
            options = {**_DECOUPLED, "actor.rejection_sampling": _areal("sequence", "mask", "ratio", "sum", high, low)}
            meaning = "the same responses dropped; AReaL weights the kept ones by their geometric-mean ratio"
            return Translation(part, "same_rejections", options, meaning + " (verl's RS alone keeps weight 1)")
        return Translation(part, "none", meaning="OpenRLHF 0.11.0 bounds no product of ratios")
    estimator = option.estimator
    if option.agg == "token":
        a, b = _band(estimator, option.upper)
        what = f"a token whose {estimator} exceeds {option.upper:g} (its ratio outside [{a:.6g}, {b:.6g}])"
        return _token_band(part, a, b, target, what)
    if target == "skyrl" and option.agg == "max":
        a, b = _band(estimator, option.upper)
        options = _skyrl(outlier_token_is_threshold_low=a, outlier_token_is_threshold_high=b)
        meaning = (
            f"a response with any token whose {estimator} exceeds {option.upper:g} (its ratio outside [{a:.6g}, "
            f"{b:.6g}]) vetoed by SkyRL's outlier bounds; the kept ones keep weight 1, as with verl's RS"
        )
        return Translation(part, "same_rejections", options, meaning)
    if target != "areal":
        return Translation(part, "none", meaning=f"{target} has no per-response KL bound")
    kl = "kl_k2" if estimator == "k2" else "kl_k3"
    options = {**_DECOUPLED, "actor.rejection_sampling": _areal("sequence", "mask", kl, option.agg, option.upper)}
    if estimator == "k2":
        meaning = f"the same responses dropped (the {option.agg} of lr^2/2); " + _AREAL_KEPT
        return Translation(part, "same_rejections", options, meaning)
    meaning = (
        "AReaL's kl_k3 is exp(-lr) - 1 + lr, verl's k3 is exp(lr) - 1 - lr: the KL in the other direction, so the "
        "same bound drops other responses"
    )
    return Translation(part, "nearest", options, meaning)


def _token_band(part: str, low: float, high: float, target: str, what: str) -> Translation:
    """A per-token ratio band as each target's token mask."""
    if target == "skyrl":
        options = _skyrl(token_mask_is_threshold_low=low, token_mask_is_threshold_high=high)
        return Translation(part, "same_rejections", options, f"{what} masked by SkyRL's token mask; {_SKYRL_KEPT}")
    if target == "trl":
        options = _trl("token_mask", low, high)
        return Translation(part, "same_rejections", options, f"{what} zeroed; " + _RS_WEIGHT[target])
    if target == "openrlhf":
        return Translation(
            part, "same_rejections", _openrlhf("icepop", low, high), f"{what} zeroed; " + _RS_WEIGHT[target]
        )
    if high <= 1.0:
        return Translation(part, "none", meaning="AReaL refuses a ratio bound upper <= 1")
    options = {**_DECOUPLED, "actor.rejection_sampling": _areal("token", "mask", "ratio", "mean", high, low)}
    return Translation(part, "same_rejections", options, f"{what} dropped; " + _AREAL_KEPT)


def _band(estimator: str, upper: float) -> tuple[float, float]:
    """The ratio band ``[e^a, e^b]`` where verl's k2 (d^2/2) or k3 (e^d - 1 - d) of ``d = log ratio`` stays <= upper
    (d clamped at +-20)."""
    if estimator == "k2":
        root = math.sqrt(2.0 * upper)
        return math.exp(-min(root, SAFETY_BOUND)), math.exp(min(root, SAFETY_BOUND))

    def k3(d: float) -> float:
        return math.expm1(d) - d

    a = -SAFETY_BOUND if k3(-SAFETY_BOUND) <= upper else _bisect(k3, upper, 0.0, -SAFETY_BOUND)
    b = SAFETY_BOUND if k3(SAFETY_BOUND) <= upper else _bisect(k3, upper, 0.0, SAFETY_BOUND)
    return math.exp(a), math.exp(b)


def _bisect(f: Any, level: float, inside: float, outside: float) -> float:
    """The point between ``inside`` (f <= level) and ``outside`` (f > level) where f crosses ``level``."""
    for _ in range(200):
        mid = (inside + outside) / 2
        if f(mid) <= level:
            inside = mid
        else:
            outside = mid
    return inside


def _trl(mode: str, low: float | None, high: float) -> dict[str, Any]:
    return {
        "vllm_importance_sampling_mode": mode,
        "vllm_importance_sampling_clip_min": low,
        "vllm_importance_sampling_clip_max": high,
    }


def _openrlhf(kind: str, low: float, high: float) -> dict[str, Any]:
    return {
        "algo.advantage.is_correction_enable": True,
        "algo.advantage.is_correction_type": kind,
        "algo.advantage.is_correction_threshold": [low, high],
    }


def _areal(level: str, action: str, metric: str, agg: str, upper: float, lower: float | None = None) -> dict[str, Any]:
    return {"level": level, "action": action, "metric": metric, "agg": agg, "upper": upper, "lower": lower}


_SKYRL_KEPT = "the kept ones keep weight 1, as with verl's RS"
_SKYRL_MASK = (
    "SkyRL takes what it masks out of its loss mask, so its token-mean loss divides by the kept tokens (verl's "
    "IcePop weights them 0 and keeps them in the mask)"
)


def _skyrl(**fields: Any) -> dict[str, Any]:
    """SkyRL's ``off_policy_correction`` fields, each as its own option (so parts combine)."""
    return {f"trainer.algorithm.off_policy_correction.{key}": value for key, value in fields.items()}


def _skyrl_is(part: str, level: str, lower: float | None, upper: float) -> Translation:
    """verl's IS weight as SkyRL's truncated weight, and IcePop's band as its token or product mask."""
    if level == "token":
        options = _skyrl(tis_ratio_type="token", token_tis_ratio_clip_high=upper)
        if lower is None:
            meaning = "tis_ratio_type token clamps each ratio at its cap; SkyRL clamps the log-ratio at +-20, as verl"
            return Translation(part, "same", options, meaning)
        options.update(_skyrl(token_mask_is_threshold_low=lower, token_mask_is_threshold_high=upper))
        meaning = (
            f"the token mask drops a ratio outside [L, U] and the token weight at cap U keeps the rest; {_SKYRL_MASK}"
        )
        return Translation(part, "same", options, meaning)
    options = _skyrl(tis_ratio_type="sequence", sequence_tis_ratio_clip_high=upper)
    if lower is None:
        meaning = "tis_ratio_type sequence clamps exp(clamp(sum of log-ratios, +-20)) at its cap, as verl"
        return Translation(part, "same", options, meaning)
    options.update(_skyrl(sequence_mask_metric="product", product_mask_low=lower, product_mask_high=upper))
    meaning = f"the product mask drops a response outside [L, U], the sequence weight keeps the rest; {_SKYRL_MASK}"
    return Translation(part, "same", options, meaning)


def _skyrl_rows(part: str, metric: str, low: float, high: float) -> Translation:
    """A band on each response's geometric-mean or product ratio as SkyRL's sequence mask."""
    prefix = "geo" if metric == "geometric" else "product"
    options = _skyrl(sequence_mask_metric=metric, **{f"{prefix}_mask_low": low, f"{prefix}_mask_high": high})
    meaning = f"the same responses masked by SkyRL's {metric} sequence mask; {_SKYRL_KEPT}"
    return Translation(part, "same_rejections", options, meaning)
