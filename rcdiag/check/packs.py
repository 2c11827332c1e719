"""Rule packs: named sets of thresholds that verl, NeMo-RL and Miles document.

Pack rules are optional: a metric the configuration does not compute is skipped, so one pack fits every
configuration.
"""

from __future__ import annotations

from collections.abc import Mapping

from rcdiag.check.rules import Rule, RuleKind, StepMode
from rcdiag.errors import ConfigError

PACK_SOURCES = {
    "verl": "verl's documented health thresholds (docs/algo/rollout_corr.md)",
    "nemo-rl": "NeMo-RL's acceptance levels (token_mult_prob_error <= 1.05, generation k3 KL < 1e-3)",
    "miles-dense": "upper end of the k3 KL range Miles reports for dense models (1e-5..1e-3)",
    "miles-moe": "upper end of the k3 KL range Miles reports for MoE models (1e-3..1e-1)",
}
_PACK_RULES: dict[str, tuple[tuple[str, RuleKind, float], ...]] = {
    "verl": (
        ("rollout_is_mean", "min", 0.5),
        ("rollout_is_mean", "max", 2.0),
        ("rollout_is_eff_sample_size", "min", 0.3),
        ("rollout_is_std", "max", 1.0),
        ("kl", "max_abs", 0.1),
        ("chi2_token", "max", 1.0),
    ),
    "nemo-rl": (("token_mult_prob_error", "max", 1.05), ("k3_kl", "max", 1e-3)),
    "miles-dense": (("k3_kl", "max", 1e-3),),
    "miles-moe": (("k3_kl", "max", 1e-1),),
}


def pack(name: str, *, steps: StepMode = "every", tolerate: float = 0.0) -> tuple[Rule, ...]:
    """The rules of one pack; a rule whose metric the configuration does not compute is skipped, not an error."""
    try:
        entries = _PACK_RULES[name]
    except KeyError:
        raise ConfigError(f"unknown rule pack '{name}'; packs: {', '.join(_PACK_RULES)}.") from None
    return tuple(
        Rule(metric, kind, bound, steps=steps, tolerate=tolerate, source=f"pack {name}", optional=True)
        for metric, kind, bound in entries
    )


def describe_packs() -> Mapping[str, str]:
    """Pack name -> where its thresholds come from."""
    return PACK_SOURCES
