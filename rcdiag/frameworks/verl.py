"""verl (``--as verl``, the default): its options are ``algorithm.rollout_correction``'s fields, which configure
rcdiag's own verl engine (``rcdiag.settings.correction``, every ``rollout_corr/*`` key), and the actor engine's
``router_replay`` block, read only to refuse what verl refuses.

verl 0.9.1 refuses ``router_replay.mode: R2`` together with ``rollout_correction.bypass_mode: true``
(``verl/utils/config.py``, ``_validate_router_replay_config``): R2 records the MoE routes while the actor recomputes
``old_log_probs``, and bypass mode skips that forward. rcdiag refuses it wherever it reads such a configuration
(``refuse_router_replay``), under releases that do, with verl's message.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rcdiag.catalogue.keys import PREFIX
from rcdiag.frameworks.base import Framework, MetricKey, Option, merge_options
from rcdiag.frameworks.correction import (
    CLAMP_QUIRK,
    Band,
    Correction,
    Form,
    Unit,
    Weight,
    k_bound,
    ratio_band,
    within_clamp,
)
from rcdiag.settings.correction import IS_LEVELS, CorrectionConfig, RSOption, refuse_router_replay
from rcdiag.settings.versions import DEFAULT_VERSION

BLOCK = "algorithm.rollout_correction"
ROUTER_REPLAY = ("actor_rollout_ref.actor.megatron.router_replay", "actor_rollout_ref.actor.veomni.router_replay")
"""The actor engines whose config has a ``router_replay`` block (verl 0.9.1's generated trainer configs)."""
ROUTER_MODES = ("disabled", "R2", "R3")
FIELDS = (
    Option("rollout_is", "choice", None, "IS weight level; null: off", choices=IS_LEVELS, nullable=True),
    Option("rollout_is_threshold", "text", 2.0, "U (TIS) or 'L_U' (IcePop)", nullable=True),
    Option("rollout_is_batch_normalize", "bool", False, "normalise IS weights to mean 1"),
    Option("rollout_rs", "text", None, "comma-separated RS options; null: off", nullable=True),
    Option("rollout_rs_threshold", "text", None, "one spec or one per option", nullable=True),
    Option("bypass_mode", "bool", False, "use the rollout's log-probs as old_log_probs (no recompute)"),
    Option("loss_type", "choice", "ppo_clip", "the bypass-mode loss", choices=("ppo_clip", "reinforce")),
)
_ROUTER_FIELDS = (Option("mode", "choice", "disabled", "MoE router replay", choices=ROUTER_MODES),)


@dataclass(frozen=True)
class VerlSettings:
    """The fields given (``algorithm.rollout_correction``), put on top of the flags' configuration, and the router
    replay mode."""

    fields: tuple[tuple[str, Any], ...]
    router_replay: str = "disabled"

    def config(self, base: CorrectionConfig | None = None) -> CorrectionConfig:
        """``base`` (the flags' and preset's configuration) with the given fields on top, resolved; a
        ``ConfigError`` with verl's message for what verl refuses (R2 with bypass mode under 0.9.1)."""
        config = (base or CorrectionConfig()).replace(**dict(self.fields))
        config.resolve()
        refuse_router_replay(self.router_replay, config.bypass_mode, config.verl_version)
        return config

    def new_metrics(self) -> None:
        return None  # verl's keys are rcdiag's engine's

    def notes(self) -> tuple[str, ...]:
        return ()

    def to_dict(self) -> dict[str, Any]:
        return {**{f"{BLOCK}.{k}": v for k, v in self.fields}, f"{ROUTER_REPLAY[0]}.mode": self.router_replay}

    def correction(self) -> Correction:
        return correction(self.config())


BYPASS = (
    "bypass_mode: the rollout's log-probs stand for old_log_probs (no recompute), and the correction moves into "
    "the policy loss against the current policy, which a dump of the two engines cannot show"
)


def correction(config: CorrectionConfig) -> Correction:
    """A verl configuration in the shared vocabulary (``rcdiag.frameworks.correction``): its IS weight (TIS a
    clamp from above, IcePop a band on the weight's own ratio) and each RS option as a band. A k1 band ``"L_U"``
    bounds k1 = -d, so it keeps the ratio in [1/U, 1/L] (inverted); a bound on one token's k2 or k3 is a band on
    its ratio."""
    resolved = config.resolve()
    spec = resolved.is_spec
    bands: list[Band] = []
    if spec is None:
        weight = Weight("one", label="rollout_is: null (no IS weight)")
    else:
        unit: Unit = "token" if spec.level == "token" else "product"
        what = "each token's ratio" if spec.level == "token" else "the product of a response's ratios"
        if spec.lower is None:
            label = f"rollout_is {spec.level}, threshold {_spec(spec.upper)} (TIS: {what} clamped from above)"
            weight = Weight(unit, None, spec.upper, label=label)
        else:
            band = f"{_spec(spec.lower)}_{_spec(spec.upper)}"
            label = f"rollout_is {spec.level}, threshold {band} (IcePop: {what} set to 0 outside [L, U])"
            weight = Weight(unit, label=label)
            bands.append(Band("ratio" if unit == "token" else "product", spec.lower, spec.upper, label=label))
    bands.extend(_band(option) for option in resolved.rs_options)
    other = (BYPASS,) if config.bypass_mode else ()
    normalize = spec is not None and spec.batch_normalize
    return Correction(weight, tuple(within_clamp(b) for b in bands), normalize, other, (CLAMP_QUIRK,)).normal()


OPEN_LOW, OPEN_HIGH = 1e-9, 1e9
"""Bounds beyond verl's clamp, written where a band of another framework has no bound on that side."""


def _band(option: RSOption) -> Band:
    label = f"rollout_rs {option.name} "
    if option.is_k1:
        assert option.lower is not None
        low, high = 1.0 / option.upper, 1.0 / option.lower
        statistic = {"token": "ratio", "sum": "product", "mean": "geomean"}[option.agg]
        what = {"ratio": "the ratio", "product": "a response's product of ratios", "geomean": "its geometric mean"}
        label += (
            f"{_spec(option.lower)}_{_spec(option.upper)} (keeps {what[statistic]} pi_train/pi_rollout in "
            f"[{low:.6g}, {high:.6g}]: verl's k1 band is inverted)"
        )
        return Band(statistic, low, high, label=label)
    label += _spec(option.upper)
    if option.agg == "token":
        low, high = ratio_band(option.estimator, option.upper)
        label += f" (keeps a token whose {option.estimator} <= {option.upper:g}: its ratio in [{low:.6g}, {high:.6g}])"
        return Band("ratio", low, high, label=label)
    return Band(f"{option.agg}_{option.estimator}", None, option.upper, label=label)


def _spec(value: float) -> str:
    """The shortest decimal that reads back within 1e-12 of ``value`` (a bound that went through 1/x)."""
    for digits in range(6, 18):
        text = f"{value:.{digits}g}"
        if math.isclose(float(text), value, rel_tol=1e-12):
            return text
    return repr(value)


def _is(level: str, icepop: bool, normalize: bool) -> Callable[[float | None, float | None], dict[str, Any] | None]:
    def options(low: float | None, high: float | None) -> dict[str, Any] | None:
        if icepop:
            low, high = low or OPEN_LOW, high or OPEN_HIGH
        if high is None:
            return None
        threshold: Any = f"{_spec(low)}_{_spec(high)}" if icepop and low is not None else high
        out: dict[str, Any] = {"rollout_is": level, "rollout_is_threshold": threshold}
        if normalize:
            out["rollout_is_batch_normalize"] = True
        return out

    return options


def _rs(name: str) -> Callable[[float | None, float | None], dict[str, Any] | None]:
    def options(low: float | None, high: float | None) -> dict[str, Any] | None:
        if high is None and not name.endswith("k1"):
            return None
        if not name.endswith("k1"):
            return {"rollout_rs": name, "rollout_rs_threshold": high}
        low, high = low or OPEN_LOW, high or OPEN_HIGH
        return {"rollout_rs": name, "rollout_rs_threshold": f"{_spec(1.0 / high)}_{_spec(1.0 / low)}"}

    return options


def _every_token(kind: str) -> Callable[[float | None, float | None], dict[str, Any] | None]:
    """A band on every token's ratio as ``seq_max_<kind>``: the largest k of a response at most the bound that
    reaches the band's bounds."""

    def options(low: float | None, high: float | None) -> dict[str, Any] | None:
        bound = k_bound(kind, low, high)
        return None if bound is None else {"rollout_rs": f"seq_max_{kind}", "rollout_rs_threshold": bound}

    return options


RS_KEYS = ("rollout_rs", "rollout_rs_threshold")


def combine(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """One IS setting and any RS options as one ``rollout_correction`` block: the RS names and their thresholds
    comma-separated, in order."""
    merged = merge_options([{k: v for k, v in part.items() if k not in RS_KEYS} for part in parts])
    chosen = [(part["rollout_rs"], part["rollout_rs_threshold"]) for part in parts if part.get("rollout_rs")]
    if merged is None or (chosen and any("rollout_rs" in p and not p["rollout_rs"] for p in parts)):
        return None
    if chosen:
        merged["rollout_rs"] = ",".join(name for name, _ in chosen)
        merged["rollout_rs_threshold"] = ",".join(t if isinstance(t, str) else _spec(t) for _, t in chosen)
    elif any("rollout_rs" in part for part in parts):
        merged["rollout_rs"] = None
    return merged


LEVEL_UNITS: tuple[tuple[str, Unit], ...] = (("token", "token"), ("sequence", "product"))
FORMS = (
    Form("one", "none", lambda low, high: {"rollout_is": None, "rollout_rs": None}),
    *(
        form
        for normalize in (False, True)
        for level, unit in LEVEL_UNITS
        for form in (
            Form(unit, "clamp", _is(level, False, normalize), normalize=normalize),
            Form(
                unit,
                "band",
                _is(level, True, normalize),
                statistic="ratio" if unit == "token" else unit,
                normalize=normalize,
            ),
        )
    ),
    Form("token", "none", lambda low, high: _is("token", True, False)(OPEN_LOW, OPEN_HIGH)),
    Form("product", "none", lambda low, high: _is("sequence", True, False)(OPEN_LOW, OPEN_HIGH)),
    Form("one", "band", _rs("token_k1"), statistic="ratio"),
    Form("one", "band", _rs("seq_sum_k1"), statistic="product"),
    Form("one", "band", _rs("seq_mean_k1"), statistic="geomean"),
    *(
        Form("one", "band", _rs(f"seq_{agg}_{kind}"), statistic=f"{agg}_{kind}")
        for kind in ("k2", "k3")
        for agg in ("sum", "mean")
    ),
    *(Form("one", "band", _every_token(kind), statistic="all_ratios") for kind in ("k2", "k3")),
)
"""verl's IS (TIS, IcePop; batch-normalised or not) and RS options (a k1 band for a ratio band, written inverted)."""


def settings(values: Mapping[str, Any], given: frozenset[str] = frozenset()) -> VerlSettings:
    """The ``rollout_correction`` fields given and the router replay mode (R2 if either engine's block says so)."""
    block = values[BLOCK] or {}
    fields = tuple((name, block[name]) for name in block if f"{BLOCK}.{name}" in given)
    modes = [(values[key] or {}).get("mode", "disabled") for key in ROUTER_REPLAY]
    return VerlSettings(fields, next((mode for mode in modes if mode != "disabled"), "disabled"))


FRAMEWORK = Framework(
    name="verl",
    title="verl",
    release=DEFAULT_VERSION,
    source="verl/trainer/ppo/rollout_corr_helper.py, verl/utils/debug/metrics.py, verl/utils/config.py:74-85",
    options=(
        Option(BLOCK, "block", {f.key: f.default for f in FIELDS}, "verl's rollout correction", fields=FIELDS),
        *(
            Option(key, "block", {"mode": "disabled"}, "the actor engine's router replay", fields=_ROUTER_FIELDS)
            for key in ROUTER_REPLAY
        ),
    ),
    keys=(
        MetricKey(PREFIX + "*", "every key of verl's rollout correction (docs/metrics.md)"),
        MetricKey("training/rollout_probs_diff_*", "verl's debug metrics", when="decoupled mode"),
    ),
    settings=settings,
    prefixes=(BLOCK + ".", "algorithm.", "actor_rollout_ref.actor.megatron.", "actor_rollout_ref.actor."),
    batching="one training step (the batch verl's trainer corrects at once; --verl-version picks the release)",
    forms=FORMS,
    combine=combine,
)
