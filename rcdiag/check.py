"""``check``: rules on metrics, evaluated per training step, for a CI gate.

A rule bounds one metric (verl's short name ``kl``, its full name ``rollout_corr/kl``, or an ``rcdiag/*`` extra)
with ``max``/``min``/``max_abs``, or relative to a baseline run with ``max_increase``/``max_decrease`` (an
absolute amount or a percentage of the baseline's value). It applies to every step by default (each step is one
batch, as verl logs it); ``steps="last"`` or ``"mean"`` look at the last step or the mean over steps, and
``tolerate`` lets a fraction of steps fail. Rule packs encode thresholds documented by verl, NeMo-RL and Miles.
Rules come from code, the command line, or TOML (docs/check.md).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rcdiag.api import analyze
from rcdiag.backend import Backend
from rcdiag.config import RS_OPTIONS, CorrectionConfig, ResolvedConfig, preset
from rcdiag.constants import DEFAULT_CHUNK_TOKENS
from rcdiag.errors import ConfigError, InputError
from rcdiag.io.base import ColumnMap
from rcdiag.report import SCHEMA_VERSION, Report

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

RuleKind = Literal["max", "min", "max_abs", "max_increase", "max_decrease"]
StepMode = Literal["every", "last", "mean"]
Status = Literal["passed", "failed", "skipped"]

RULE_KINDS: tuple[RuleKind, ...] = ("max", "min", "max_abs", "max_increase", "max_decrease")
RELATIVE_KINDS = ("max_increase", "max_decrease")
STEP_MODES: tuple[StepMode, ...] = ("every", "last", "mean")
PREFIXES = ("rollout_corr/", "rcdiag/")
CONFIG_TABLE = ("tool", "rcdiag", "check")


@dataclass(frozen=True)
class Rule:
    """One bound on one metric."""

    metric: str
    """As written: ``kl``, ``rollout_corr/kl`` or ``rcdiag/token_mult_prob_error``."""
    kind: RuleKind
    bound: float
    relative: bool = False
    """For ``max_increase``/``max_decrease``: ``bound`` is a fraction of |baseline| (``50%`` -> 0.5)."""
    steps: StepMode = "every"
    tolerate: float = 0.0
    """Fraction of steps allowed to fail (``steps="every"`` only)."""
    source: str = "command line"
    optional: bool = False
    """Skipped (not an error) when the configuration does not compute the metric: rule packs."""

    def __post_init__(self) -> None:
        if self.kind not in RULE_KINDS:
            raise ConfigError(f"unknown rule kind '{self.kind}'; use one of {', '.join(RULE_KINDS)}.")
        if self.steps not in STEP_MODES:
            raise ConfigError(f"steps must be one of {', '.join(STEP_MODES)}, got '{self.steps}'.")
        if not math.isfinite(self.bound):
            raise ConfigError(f"the bound of a rule on '{self.metric}' must be a finite number, got {self.bound}.")
        if self.relative and self.kind not in RELATIVE_KINDS:
            raise ConfigError(f"a percentage bound only makes sense for max_increase/max_decrease ({self.metric}).")
        if not 0.0 <= self.tolerate < 1.0:
            raise ConfigError(f"tolerate must be a fraction in [0, 1), got {self.tolerate}.")
        if self.tolerate and self.steps != "every":
            raise ConfigError(f"tolerate applies to steps='every' only (rule on '{self.metric}' has '{self.steps}').")
        if self.kind == "max_abs" and self.bound < 0:
            raise ConfigError(f"a max_abs bound must be >= 0 ({self.metric}={self.bound}).")

    def describe(self, key: str | None = None) -> str:
        """``rollout_corr/kl <= 0.002``, ``|kl| <= 0.1``, ``kl <= baseline + 50%``."""
        name = key or self.metric
        amount = f"{self.bound * 100:g}%" if self.relative else f"{self.bound:g}"
        return {
            "max": f"{name} <= {self.bound:g}",
            "min": f"{name} >= {self.bound:g}",
            "max_abs": f"|{name}| <= {self.bound:g}",
            "max_increase": f"{name} <= baseline + {amount}",
            "max_decrease": f"{name} >= baseline - {amount}",
        }[self.kind]

    def mode(self) -> str:
        """``every step``, ``every step, 10% may fail``, ``last step``, ``mean over steps``."""
        if self.steps == "last":
            return "last step"
        if self.steps == "mean":
            return "mean over steps"
        return "every step" + (f", {self.tolerate * 100:g}% may fail" if self.tolerate else "")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class RuleResult:
    """A rule evaluated on a report."""

    rule: Rule
    key: str | None
    """The full metric name (``None`` when skipped)."""
    status: Status
    value: float | None
    """The value quoted: the worst step's (every), the last step's, or the mean over steps."""
    limit: float | None
    """The bound the value was held to (for relative rules: derived from the baseline)."""
    step: int | None
    """The step of ``value`` (``None``: a dump without steps, or the mean)."""
    failing_steps: tuple[int, ...]
    checked_steps: int
    baseline: float | None
    message: str

    @property
    def label(self) -> str:
        return f"{self.rule.describe(self.key)} ({self.rule.mode()})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule.to_dict(),
            "label": self.label,
            "metric": self.key,
            "status": self.status,
            "value": self.value,
            "limit": self.limit,
            "step": self.step,
            "failing_steps": list(self.failing_steps),
            "checked_steps": self.checked_steps,
            "baseline": self.baseline,
            "message": self.message,
        }


@dataclass(frozen=True)
class CheckResult:
    """Every rule's outcome on one dump (and its baseline)."""

    report: Report
    baseline: Report | None
    results: tuple[RuleResult, ...]

    @property
    def passed(self) -> bool:
        """True when no rule failed (skipped rules do not fail)."""
        return not self.failed

    @property
    def failed(self) -> tuple[RuleResult, ...]:
        return tuple(r for r in self.results if r.status == "failed")

    def counts(self) -> dict[str, int]:
        return {s: sum(r.status == s for r in self.results) for s in ("passed", "failed", "skipped")}

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (schema in docs/check.md)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "kind": "check",
            "rcdiag_version": self.report.version,
            "passed": self.passed,
            "counts": self.counts(),
            "config": self.report.config,
            "input": self.report.input.to_dict(),
            "baseline": self.baseline.input.to_dict() if self.baseline is not None else None,
            "results": [r.to_dict() for r in self.results],
        }


# ------------------------------------------------------------------------------------------------------ packs

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


# ----------------------------------------------------------------------------------------------- metric names


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


# ---------------------------------------------------------------------------------------------------- running


def check(
    path: str | Path,
    rules: Sequence[Rule],
    config: CorrectionConfig | None = None,
    *,
    baseline: str | Path | None = None,
    device: str | Backend = "cpu",
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    columns: ColumnMap | None = None,
    on_bad_row: str = "error",
    workers: int = 1,
) -> CheckResult:
    """Analyse ``path`` (and ``baseline``) with ``config`` and evaluate ``rules``.

    Rules are validated against the configuration before any file is read: a rule on a metric the configuration
    does not compute raises ``ConfigError`` listing the available names (rule-pack rules are skipped instead).
    """
    if not rules:
        raise ConfigError(
            "no rules to check: give --max/--min/--max-abs NAME=VALUE, --pack NAME, --rules FILE, or a "
            "[tool.rcdiag.check] table in pyproject.toml."
        )
    config = config or CorrectionConfig()
    resolved = config.resolve()
    validate_rules(rules, metric_names(resolved), has_baseline=baseline is not None)
    read = {
        "device": device,
        "chunk_tokens": chunk_tokens,
        "columns": columns,
        "on_bad_row": on_bad_row,
        "workers": workers,
    }
    report = analyze(path, config, **read)
    base = analyze(baseline, config, **read) if baseline is not None else None
    return CheckResult(report, base, evaluate_rules(report, rules, base))


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
            failing = tuple(s for s in nulls if s is not None)
            return RuleResult(rule, key, "failed", None, limit, None, failing, len(series), base, text)
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
        text = f"holds for {scope}; closest {shown}{where}"
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


# ------------------------------------------------------------------------------------------------- rule parsing


def parse_assignment(
    text: str, kind: RuleKind, *, option: str, steps: StepMode = "every", tolerate: float = 0.0
) -> Rule:
    """``kl=2e-3`` (or ``kl=50%`` for a relative rule) from a command-line option."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip() or not value.strip():
        raise ConfigError(f"{option} expects NAME=VALUE (e.g. {option} kl=2e-3), got '{text}'.")
    bound, relative = _parse_bound(value.strip(), kind, f"{option} {text}")
    return Rule(name.strip(), kind, bound, relative, steps, tolerate, option)


def _parse_bound(value: Any, kind: RuleKind, where: str) -> tuple[float, bool]:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigError(f"{where}: the bound must be a number{' or a percentage' if kind in RELATIVE_KINDS else ''}.")
    relative = isinstance(value, str) and value.strip().endswith("%")
    text = value.strip().removesuffix("%") if isinstance(value, str) else value
    try:
        number = float(text)
    except ValueError:
        raise ConfigError(f"{where}: '{value}' is not a number.") from None
    if relative and kind not in RELATIVE_KINDS:
        raise ConfigError(f"{where}: a percentage is only allowed for max_increase/max_decrease.")
    if kind in RELATIVE_KINDS and number < 0:
        raise ConfigError(f"{where}: an allowed increase/decrease must be >= 0.")
    return (number / 100.0 if relative else number), relative


@dataclass(frozen=True)
class RuleFile:
    """What a TOML rules table holds."""

    path: Path
    rules: tuple[Rule, ...]
    engine: dict[str, Any]
    """``preset`` and verl's ``rollout_correction`` fields for the engine (empty: flags/defaults)."""
    baseline: Path | None
    """Resolved against the TOML file's directory."""

    def config(self) -> CorrectionConfig | None:
        """The engine configuration the file asks for, or ``None`` if it sets none."""
        if not self.engine:
            return None
        fields = {k: v for k, v in self.engine.items() if k != "preset"}
        name = self.engine.get("preset")
        try:
            base = preset(name) if name else CorrectionConfig()
            return base.replace(**fields)
        except TypeError as exc:
            raise ConfigError(f"{self.path}: [engine]: {exc}") from None


_TABLE_KEYS = {"packs", "steps", "tolerate", "baseline", "engine", "rule", *RULE_KINDS}
_RULE_KEYS = {"metric", "steps", "tolerate", *RULE_KINDS}
_ENGINE_KEYS = {"preset", *(f.name for f in dataclasses.fields(CorrectionConfig))}


def load_rules(
    path: str | Path, *, steps: StepMode = "every", tolerate: float = 0.0, required: bool = True
) -> RuleFile | None:
    """Rules from a TOML file: its ``[tool.rcdiag.check]`` table if it has one, else its top level.

    ``steps``/``tolerate`` are the defaults for rules that set neither (the file's own top-level ``steps`` and
    ``tolerate`` override them). With ``required=False`` a file without ``[tool.rcdiag.check]`` gives ``None``
    (a pyproject.toml that does not configure rcdiag).
    """
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError("file not found", path=str(p)) from None
    except OSError as exc:
        raise InputError(f"cannot read the rules file ({exc.strerror})", path=str(p)) from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"not valid TOML ({exc})", path=str(p)) from None
    table: Any = data
    for part in CONFIG_TABLE:
        table = table.get(part) if isinstance(table, dict) else None
    if table is None:
        if not required or p.name == "pyproject.toml":
            if required:
                raise InputError("has no [tool.rcdiag.check] table", path=str(p))
            return None
        table, where = data, "top level"
    else:
        where = "[tool.rcdiag.check]"
    if not isinstance(table, dict):
        raise InputError(f"{where} must be a table", path=str(p))
    return _parse_table(p, table, where, steps, tolerate)


def _parse_table(path: Path, table: dict, where: str, steps: Any, tolerate: Any) -> RuleFile:
    def fail(message: str) -> InputError:
        return InputError(f"{where}: {message}", path=str(path))

    unknown = sorted(set(table) - _TABLE_KEYS)
    if unknown:
        raise fail(f"unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(_TABLE_KEYS))}")
    steps = _mode(table.get("steps", steps), "steps", fail)
    tolerate = _fraction(table.get("tolerate", tolerate), "tolerate", fail)
    rules: list[Rule] = []
    source = path.name
    try:
        for name in _list_of_str(table.get("packs", []), "packs", fail):
            rules.extend(pack(name, steps=steps, tolerate=tolerate))
        for kind in RULE_KINDS:
            entries = table.get(kind, {})
            if not isinstance(entries, dict):
                raise fail(f"[{kind}] must be a table of NAME = VALUE")
            for metric, value in entries.items():
                bound, relative = _parse_bound(value, kind, f"{path}: {where} [{kind}] {metric}")
                rules.append(Rule(metric, kind, bound, relative, steps, tolerate, source))
        entries = table.get("rule", [])
        if not isinstance(entries, list):
            raise fail("rule must be an array of tables ([[rule]])")
        for index, entry in enumerate(entries):
            if not isinstance(entry, dict) or not isinstance(entry.get("metric"), str):
                raise fail(f'[[rule]] #{index + 1} needs metric = "NAME"')
            bad = sorted(set(entry) - _RULE_KEYS)
            if bad:
                raise fail(
                    f"[[rule]] #{index + 1}: unknown key(s) {', '.join(bad)}; known: {', '.join(sorted(_RULE_KEYS))}"
                )
            kinds = [k for k in RULE_KINDS if k in entry]
            if not kinds:
                raise fail(f"[[rule]] #{index + 1} ({entry['metric']}) sets no bound ({', '.join(RULE_KINDS)})")
            for kind in kinds:
                bound, relative = _parse_bound(entry[kind], kind, f"{path}: {where} [[rule]] #{index + 1} {kind}")
                label = f"[[rule]] #{index + 1}"
                rule_steps = _mode(entry.get("steps", steps), f"{label} steps", fail)
                rule_tolerate = _fraction(entry.get("tolerate", tolerate), f"{label} tolerate", fail)
                rules.append(Rule(entry["metric"], kind, bound, relative, rule_steps, rule_tolerate, source))
    except ConfigError as exc:
        message = str(exc)
        raise (InputError(message) if message.startswith(str(path)) else fail(message)) from None
    engine = table.get("engine", {})
    if not isinstance(engine, dict) or set(engine) - _ENGINE_KEYS:
        raise fail(f"[engine] takes {', '.join(sorted(_ENGINE_KEYS))}")
    baseline = table.get("baseline")
    if baseline is not None and not isinstance(baseline, str):
        raise fail("baseline must be a path string")
    return RuleFile(path, tuple(rules), dict(engine), (path.parent / baseline) if baseline else None)


def _mode(value: Any, name: str, fail: Any) -> StepMode:
    if value not in STEP_MODES:
        raise fail(f"{name} must be one of {', '.join(STEP_MODES)}, got {value!r}")
    return value


def _fraction(value: Any, name: str, fail: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        raise fail(f"{name} must be a fraction in [0, 1), got {value!r}")
    return float(value)


def _list_of_str(value: Any, name: str, fail: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise fail(f"{name} must be a list of strings")
    return value


def find_project_rules(directory: str | Path = ".", **defaults: Any) -> RuleFile | None:
    """``[tool.rcdiag.check]`` of ``directory/pyproject.toml``, if that file exists and has the table."""
    candidate = Path(directory) / "pyproject.toml"
    if not candidate.is_file():
        return None
    return load_rules(candidate, required=False, **defaults)


def describe_packs() -> Mapping[str, str]:
    """Pack name -> where its thresholds come from."""
    return PACK_SOURCES
