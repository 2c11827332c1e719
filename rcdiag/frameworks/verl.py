"""verl (``--as verl``, the default): its options are ``algorithm.rollout_correction``'s fields, which configure
rcdiag's own verl engine (``rcdiag.config``, every ``rollout_corr/*`` key), and the actor engine's
``router_replay`` block, read only to refuse what verl refuses.

verl 0.9.1 refuses ``router_replay.mode: R2`` together with ``rollout_correction.bypass_mode: true``
(``verl/utils/config.py``, ``_validate_router_replay_config``): R2 records the MoE routes while the actor recomputes
``old_log_probs``, and bypass mode skips that forward. rcdiag refuses it wherever it reads such a configuration
(``refuse_router_replay``), under releases that do, with verl's message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rcdiag.config import IS_LEVELS, CorrectionConfig, refuse_router_replay
from rcdiag.frameworks.base import Framework, MetricKey, Option
from rcdiag.versions import DEFAULT_VERSION

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
        MetricKey("rollout_corr/*", "every key of verl's rollout correction (docs/metrics.md)"),
        MetricKey("training/rollout_probs_diff_*", "verl's debug metrics", when="decoupled mode"),
    ),
    settings=settings,
    prefixes=(BLOCK + ".", "algorithm.", "actor_rollout_ref.actor.megatron.", "actor_rollout_ref.actor."),
    batching="one training step (the batch verl's trainer corrects at once; --verl-version picks the release)",
)
