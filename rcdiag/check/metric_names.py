"""Which metrics a configuration computes, how a rule's metric name resolves, and rule validation.

Everything here works from the configuration alone, so a rule on a missing metric fails before any dump is read,
with an error that says which option would compute it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from rcdiag.catalogue import EXTRA_PREFIX, PREFIX, every_key, full_key, metric, short_key
from rcdiag.catalogue.metrics import DEBUG_PREFIX
from rcdiag.check.rules import RELATIVE_KINDS, Rule
from rcdiag.runtime.errors import ConfigError
from rcdiag.settings.correction import ResolvedConfig

if TYPE_CHECKING:
    from rcdiag.frameworks.registry import Chosen

PREFIXES = (PREFIX, DEBUG_PREFIX, EXTRA_PREFIX)


def metric_names(resolved: ResolvedConfig) -> list[str]:
    """The full names of every metric ``resolved`` computes, in report order (no data needed)."""
    from rcdiag.metrics.batch import BatchMetrics

    keys = [key for group in BatchMetrics(resolved).groups() for key in group.keys()]  # noqa: SIM118 (an Accumulator, not a dict)
    return [full_key(key) for key in keys]


def resolve_metric(name: str, available: Sequence[str]) -> str | None:
    """The full name ``name`` refers to among ``available``, or ``None``."""
    candidates = [name] if "/" in name else [full_key(name), full_key(EXTRA_PREFIX + name), name]
    return next((c for c in candidates if c in available), None)


def _unknown_metric(rule: Rule, available: Sequence[str]) -> ConfigError:
    short = [short_key(k) for k in available]
    known = resolve_metric(rule.metric, every_key())
    spec = metric(known) if known is not None else None
    if spec is None:
        why = "is not a metric rcdiag computes"
    else:
        why = f"is not computed for this configuration ({spec.how_to_compute()}, or a preset)"
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


def refuse_unlogged(rules: Sequence[Rule], chosen: Chosen) -> None:
    """A rule on a key the framework logs, but not under these settings: say why (its notes), not "unknown"."""
    declared = {key.key for key in chosen.framework.keys}
    logged = set(chosen.keys())
    for rule in rules:
        if rule.metric in declared and rule.metric not in logged and not rule.optional:
            why = "; ".join(chosen.settings.notes()[:1])
            raise ConfigError(
                f"rule '{rule.describe()}' ({rule.source}): {chosen.framework.label} does not log '{rule.metric}' "
                f"with these options: {why}"
            )
