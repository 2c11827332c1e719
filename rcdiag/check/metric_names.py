"""Which metrics a configuration computes, how a rule's metric name resolves, and rule validation.

Everything here works from the configuration alone, so a rule on a missing metric fails before any dump is read,
with an error that says which option would compute it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rcdiag.check.rules import RELATIVE_KINDS, Rule
from rcdiag.config import RS_OPTIONS, CorrectionConfig, ResolvedConfig
from rcdiag.errors import ConfigError

PREFIXES = ("rollout_corr/", "rcdiag/")


def metric_names(resolved: ResolvedConfig) -> list[str]:
    """The full names of every metric ``resolved`` computes, in report order (no data needed)."""
    from rcdiag.metrics.batch import PREFIX, BatchMetrics

    keys = [key for group in BatchMetrics(resolved).groups() for key in group.keys()]  # noqa: SIM118 (an Accumulator, not a dict)
    return [key if key.startswith("rcdiag/") else PREFIX + key for key in keys]


def _every_metric() -> list[str]:
    full = CorrectionConfig(
        rollout_is="token",
        rollout_is_threshold="0.5_2",
        rollout_is_batch_normalize=True,
        rollout_rs=",".join(RS_OPTIONS),
        rollout_rs_threshold="2",
    )
    return metric_names(full.resolve())


def resolve_metric(name: str, available: Sequence[str]) -> str | None:
    """The full name ``name`` refers to among ``available``, or ``None``."""
    candidates = [name] if "/" in name else [prefix + name for prefix in PREFIXES]
    return next((c for c in candidates if c in available), None)


def _unknown_metric(rule: Rule, available: Sequence[str]) -> ConfigError:
    short = [k.removeprefix("rollout_corr/") for k in available]
    known = resolve_metric(rule.metric, _every_metric())
    if known is None:
        why = "is not a metric rcdiag computes"
    else:
        name = known.removeprefix("rollout_corr/")
        need = (
            "IS metrics need --is token|sequence"
            if name.startswith("rollout_is_")
            else "RS metrics need --rs with that option and --rs-threshold"
            if name.startswith("rollout_rs_")
            else "it needs another configuration"
        )
        if name in ("rollout_is_oob_ratio", "rollout_is_batch_norm_factor"):
            need = "it needs an IcePop --is-threshold L_U" if "oob" in name else "it needs --batch-normalize"
        why = f"is not computed for this configuration ({need}, or a preset)"
    return ConfigError(
        f"rule '{rule.describe()}' ({rule.source}): '{rule.metric}' {why}. Available: {', '.join(short)}."
    )


def validate_rules(rules: Iterable[Rule], available: Sequence[str], *, has_baseline: bool) -> None:
    """Raise ``ConfigError`` for a rule on a metric the configuration lacks, or a relative rule without baseline."""
    for rule in rules:
        if resolve_metric(rule.metric, available) is None and not rule.optional:
            raise _unknown_metric(rule, available)
        if rule.kind in RELATIVE_KINDS and not has_baseline:
            raise ConfigError(f"rule '{rule.describe()}' ({rule.source}) compares against a baseline: give --baseline.")
