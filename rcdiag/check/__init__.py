"""``check``: rules on metrics, evaluated per training step, for a CI gate.

A rule bounds one metric (verl's short name ``kl``, its full name ``rollout_corr/kl``, or an ``rcdiag/*`` extra)
with ``max``/``min``/``max_abs``, or relative to a baseline run with ``max_increase``/``max_decrease`` (an
absolute amount or a percentage of the baseline's value). It applies to every step by default (each step is one
batch, as verl logs it); ``steps="last"`` or ``"mean"`` look at the last step or the mean over steps, and
``tolerate`` lets a fraction of steps fail. Rule packs encode thresholds documented by verl, NeMo-RL and Miles.
Rules come from code, the command line, or TOML (docs/check.md).

The package splits by concern: ``rules`` (the rule model and ``NAME=VALUE`` bounds), ``results`` (outcomes),
``packs``, ``metric_names`` (metric resolution and validation), ``evaluate`` (rules over a report's steps) and
``rules_file`` (TOML). This module re-exports them; ``check``, which analyses a dump and evaluates the rules on its
report, is the library's (``rcdiag.api.checking``), importable from here too.
"""

from __future__ import annotations

from rcdiag.check.evaluate import evaluate_rules
from rcdiag.check.findings_gate import ANALYZE_PACK, ANALYZE_PACK_GATE, FindingGate, parse_fail_on
from rcdiag.check.metric_names import PREFIXES, metric_names, refuse_unlogged, resolve_metric, validate_rules
from rcdiag.check.packs import PACK_SOURCES, describe_packs, pack, packs_and_gate
from rcdiag.check.results import CheckResult, RuleResult
from rcdiag.check.rules import RELATIVE_KINDS, RULE_KINDS, Rule, RuleKind, Status, parse_assignment
from rcdiag.check.rules_file import CONFIG_TABLE, RuleFile, find_project_rules, load_rules
from rcdiag.runtime.lazy import exports
from rcdiag.settings.rule_options import STEP_MODES, StepMode

BASELINE_INPUT = "the baseline {source}"
"""How a refused output names the baseline dump (rcdiag.io.outputs.Ledger)."""

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
    "describe_packs",
    "evaluate_rules",
    "find_project_rules",
    "load_rules",
    "metric_names",
    "pack",
    "packs_and_gate",
    "parse_assignment",
    "parse_fail_on",
    "refuse_unlogged",
    "resolve_metric",
    "validate_rules",
]

_API = {"check": "rcdiag.api", "analyze": "rcdiag.api"}
"""The library's entry points users import from here (``from rcdiag.check import check``), found in the library layer
(``rcdiag.api.checking``) when first asked for: this package holds the rules and their evaluation and never imports
the layer above it (tests/lint/test_layering.py pins these names)."""

__getattr__ = exports(__name__, _API)
