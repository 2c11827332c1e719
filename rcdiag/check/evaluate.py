"""Rules evaluated over a report's steps: the step modes, tolerated failures and baseline-relative bounds.

Pure: it takes reports already computed, so ``evaluate_rules`` also serves callers that ran ``analyze``
themselves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rcdiag.check.metric_names import _unknown_metric, resolve_metric
from rcdiag.check.results import RuleResult
from rcdiag.check.rules import RELATIVE_KINDS, Rule, Status
from rcdiag.records.report import Report
from rcdiag.runtime.errors import ConfigError


def evaluate_rules(report: Report, rules: Sequence[Rule], baseline: Report | None = None) -> tuple[RuleResult, ...]:
    """Every rule on ``report``; relative rules read ``baseline``."""
    available = [*report.metrics, *report.extras]
    return tuple(_evaluate(report, rule, available, baseline) for rule in rules)


def _series(report: Report, key: str) -> list[tuple[int | None, float | None]]:
    if report.steps:
        return [(s.step, (s.metrics | s.extras).get(key)) for s in report.steps]
    return [(None, (report.metrics | report.extras).get(key))]


def _baseline_value(baseline: Report, key: str, rule: Rule) -> float | None:
    """The baseline's value under the rule's step mode: its last step, its mean over steps, or (every step) its
    worst step in the rule's direction, so that a run checked against itself passes."""
    values = [v for _, v in _series(baseline, key)]
    if rule.steps == "last":
        return values[-1]
    if any(v is None for v in values):
        return None
    finite = [v for v in values if v is not None]
    if rule.steps == "mean":
        return sum(finite) / len(finite)
    return max(finite) if rule.kind == "max_increase" else min(finite)


def _limit(rule: Rule, base: float | None) -> float | None:
    if rule.kind not in RELATIVE_KINDS:
        return rule.bound
    if base is None:
        return None
    amount = rule.bound * abs(base) if rule.relative else rule.bound
    return base + amount if rule.kind == "max_increase" else base - amount


def _excess(rule: Rule, value: float | None, limit: float) -> float:
    """How far ``value`` is beyond ``limit`` (> 0 fails); infinite for a null value."""
    if value is None:
        return math.inf
    if rule.kind in ("max", "max_increase"):
        return value - limit
    if rule.kind == "max_abs":
        return abs(value) - limit
    return limit - value


def _evaluate(report: Report, rule: Rule, available: list[str], baseline: Report | None) -> RuleResult:
    key = resolve_metric(rule.metric, available)
    if key is None:
        if not rule.optional:
            raise _unknown_metric(rule, available)
        text = f"'{rule.metric}' is not computed for this configuration"
        return RuleResult(rule, None, "skipped", None, None, None, (), 0, None, text)
    base = None
    if rule.kind in RELATIVE_KINDS:
        if baseline is None:
            raise ConfigError(f"rule '{rule.describe()}' compares against a baseline: give --baseline.")
        base = _baseline_value(baseline, key, rule)
    limit = _limit(rule, base)
    series = _series(report, key)
    if limit is None:
        text = f"the baseline's {key} is null (not finite) at a step, so the relative bound is undefined"
        return RuleResult(rule, key, "failed", None, None, None, (), len(series), None, text)
    if rule.steps == "mean":
        nulls = [s for s, v in series if v is None]
        if nulls:
            text = f"null (not finite) at step(s) {_list(nulls)}, so no mean"
            null_steps = tuple(s for s in nulls if s is not None)
            return RuleResult(rule, key, "failed", None, limit, None, null_steps, len(series), base, text)
        mean = sum(v for _, v in series if v is not None) / len(series)
        ok = _excess(rule, mean, limit) <= 0
        text = f"mean over {len(series)} step(s) is {_g(mean)}" + ("" if ok else f", beyond {_g(limit)}")
        return RuleResult(rule, key, "passed" if ok else "failed", mean, limit, None, (), len(series), base, text)
    if rule.steps == "last":
        series = series[-1:]
    failing = [(s, v) for s, v in series if _excess(rule, v, limit) > 0]
    worst_step, worst = max(series, key=lambda item: _excess(rule, item[1], limit))
    allowed = math.floor(rule.tolerate * len(series) + 1e-9)
    ok = len(failing) <= allowed
    where = "" if worst_step is None else f" at step {worst_step}"
    shown = "null (not finite)" if worst is None else _g(worst)
    if not failing:
        if series[0][0] is None:
            scope = "the dump"
        else:
            scope = "the last step" if rule.steps == "last" else f"all {len(series)} steps"
            scope = "the one step" if len(series) == 1 and rule.steps != "last" else scope
        text = f"holds for {scope}; nearest the limit: {shown}{where}"
    else:
        steps = [s for s, _ in failing if s is not None]
        scope = f"fails at {len(failing)} of {len(series)} step(s)" + (f" ({_list(steps)})" if steps else "")
        if ok:
            scope += f", within the tolerated {rule.tolerate * 100:g}%"
        elif rule.tolerate:
            scope += f", more than the tolerated {rule.tolerate * 100:g}%"
        text = f"{scope}; worst {shown}{where} against {_g(limit)}"
    failing_steps = tuple(s for s, _ in failing if s is not None)
    status: Status = "passed" if ok else "failed"
    return RuleResult(rule, key, status, worst, limit, worst_step, failing_steps, len(series), base, text)


def _list(steps: Sequence[int | None]) -> str:
    shown = [str(s) for s in steps[:10] if s is not None]
    return ", ".join(shown) + (", ..." if len(steps) > 10 else "")


def _g(value: float | None) -> str:
    return "null" if value is None else f"{value:.6g}"
