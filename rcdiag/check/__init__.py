"""``check``: rules on metrics, evaluated per training step, for a CI gate.

A rule bounds one metric (verl's short name ``kl``, its full name ``rollout_corr/kl``, or an ``rcdiag/*`` extra)
with ``max``/``min``/``max_abs``, or relative to a baseline run with ``max_increase``/``max_decrease`` (an
absolute amount or a percentage of the baseline's value). It applies to every step by default (each step is one
batch, as verl logs it); ``steps="last"`` or ``"mean"`` look at the last step or the mean over steps, and
``tolerate`` lets a fraction of steps fail. Rule packs encode thresholds documented by verl, NeMo-RL and Miles.
Rules come from code, the command line, or TOML (docs/check.md).

The package splits by concern: ``rules`` (the rule model and ``NAME=VALUE`` bounds), ``results`` (outcomes),
``packs``, ``metric_names`` (metric resolution and validation), ``evaluate`` (rules over a report's steps) and
``rules_file`` (TOML). This module re-exports the public API and runs ``check``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import rcdiag.outputs as outputs
from rcdiag.api import ProgressCallback, analyze
from rcdiag.check.evaluate import evaluate_rules
from rcdiag.check.findings_gate import ANALYZE_PACK, ANALYZE_PACK_GATE, FindingGate, parse_fail_on
from rcdiag.check.metric_names import PREFIXES, metric_names, resolve_metric, validate_rules
from rcdiag.check.packs import PACK_SOURCES, describe_packs, pack, packs_and_gate
from rcdiag.check.results import CheckResult, RuleResult
from rcdiag.check.rules import (
    RELATIVE_KINDS,
    RULE_KINDS,
    STEP_MODES,
    Rule,
    RuleKind,
    Status,
    StepMode,
    parse_assignment,
)
from rcdiag.check.rules_file import CONFIG_TABLE, RuleFile, find_project_rules, load_rules
from rcdiag.config import CorrectionConfig
from rcdiag.errors import ConfigError
from rcdiag.options import ReadOptions

if TYPE_CHECKING:
    from rcdiag.frameworks.registry import Chosen

BASELINE_INPUT = "the baseline {source}"
"""How a refused output names the baseline dump (rcdiag.outputs.Ledger)."""

__all__ = [
    "ANALYZE_PACK",
    "ANALYZE_PACK_GATE",
    "CONFIG_TABLE",
    "PACK_SOURCES",
    "PREFIXES",
    "RELATIVE_KINDS",
    "RULE_KINDS",
    "STEP_MODES",
    "CheckResult",
    "FindingGate",
    "Rule",
    "RuleFile",
    "RuleKind",
    "RuleResult",
    "Status",
    "StepMode",
    "analyze",
    "check",
    "describe_packs",
    "evaluate_rules",
    "find_project_rules",
    "load_rules",
    "metric_names",
    "pack",
    "packs_and_gate",
    "parse_assignment",
    "parse_fail_on",
    "resolve_metric",
    "validate_rules",
]


def _refuse_unlogged(rules: Sequence[Rule], chosen: Chosen) -> None:
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


def check(
    path: str | Path,
    rules: Sequence[Rule],
    config: CorrectionConfig | None = None,
    read: ReadOptions | None = None,
    *,
    baseline: str | Path | None = None,
    on_chunk: ProgressCallback | None = None,
    fail_on: FindingGate | None = None,
    framework: Chosen | None = None,
    exact: bool = False,
    **options: Any,
) -> CheckResult:
    """Analyse ``path`` (and ``baseline``, read the same way) with ``config`` and evaluate ``rules``.

    Rules are validated against the configuration before any file is read: a rule on a metric the configuration
    does not compute raises ``ConfigError`` listing the available names (rule-pack rules are skipped instead).
    ``read`` and the keyword ``ReadOptions`` fields say how to read the dumps, as for ``rcdiag.analyze``.
    ``fail_on`` also fails the check on the dump's findings (``FindingGate``; a named ``--explain`` code runs
    analyze's explain detectors). ``framework`` (``--as NAME``): its keys may be named by rules too (in full:
    ``sampling/importance_sampling_ratio/mean``); ``--as verl``'s options are put on ``config``.
    ``exact`` also fails it unless the two log-prob columns are bitwise identical at every valid token
    (``CheckResult.exact_failure`` names the first differing response and position).
    """
    if not rules and fail_on is None and not exact:
        raise ConfigError(
            "no rules to check: give --max/--min/--max-abs NAME=VALUE, --pack NAME, --fail-on SEVERITY|CODES, "
            "--exact, --rules FILE, or a [tool.rcdiag.check] table in pyproject.toml."
        )
    rules = list(dict.fromkeys(rules))  # an identical rule (same metric, bound, mode, source) is checked once
    riding = None
    if framework is not None:
        config, riding = framework.split(config)
    config = config or CorrectionConfig()
    resolved = config.resolve()
    available = [*(riding.keys() if riding is not None else []), *metric_names(resolved)]
    if riding is not None:
        _refuse_unlogged(rules, riding)
    validate_rules(rules, available, has_baseline=baseline is not None)
    outputs.reads(path)  # both dumps are the run's inputs before either is read (rcdiag.outputs.Ledger)
    outputs.reads(baseline, what=BASELINE_INPUT)
    read = ReadOptions.of(read, options)
    explain = fail_on is not None and fail_on.explain
    report = analyze(path, config, read, on_chunk=on_chunk, explain=explain, framework=riding)
    base = analyze(baseline, config, read, on_chunk=on_chunk, framework=riding) if baseline is not None else None
    return CheckResult(report, base, evaluate_rules(report, rules, base), fail_on, exact)
