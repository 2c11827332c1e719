"""The terminal report: rich tables of every metric with a reading, a per-step trend, and a findings checklist."""

from __future__ import annotations

from typing import TypeVar

from rich.console import Console
from rich.table import Table
from rich.text import Text

from rcdiag.catalogue import FINDINGS, metric, reading, short_key
from rcdiag.catalogue.metrics import rs_option, step_columns
from rcdiag.config import CorrectionConfig
from rcdiag.render import counted
from rcdiag.report import Finding, Report

T = TypeVar("T")
_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}
MAX_TREND_ROWS = 24


def fmt(value: float | None) -> str:
    """Numbers as verl logs would show them, to 6 significant digits; ``—`` for null."""
    if value is None:
        return "—"
    if value == 0:
        return "0"
    return f"{value:.6g}"


def render_table(report: Report, console: Console) -> None:
    """Print the whole report."""
    console.print(_header(report))
    metrics = report.metrics
    title_suffix = " (all steps pooled)" if report.steps else ""
    off = [k for k in metrics if _group(k) == "offpolicy"]
    console.print(_metric_table("Off-policy diagnostics" + title_suffix, off, metrics))
    is_keys = [k for k in metrics if _group(k) == "is"]
    if is_keys:
        console.print(_metric_table(_is_title(report.config) + title_suffix, is_keys, metrics))
    for option, keys in _rs_groups(metrics).items():
        console.print(_metric_table(_rs_title(option, report.config) + title_suffix, keys, metrics))
    aggregates = [k for k in metrics if _group(k) == "rs_aggregate"]
    if aggregates:
        console.print(_metric_table("Rejection sampling, all options combined" + title_suffix, aggregates, metrics))
    console.print(
        _metric_table("rcdiag diagnostics (not verl keys)" + title_suffix, list(report.extras), report.extras)
    )
    if report.steps:
        console.print(_trend_table(report))
    if report.microbatch is not None:
        from rcdiag.render.microbatch_table import microbatch_section

        for part in microbatch_section(report):
            console.print(part)
    console.print(_checklist(report))
    if report.explain is not None:
        from rcdiag.render.explain_table import render_explain

        render_explain(report, console)
    for finding in report.findings:
        style = _SEVERITY_STYLE[finding.severity]
        console.print(
            Text.assemble((f"{finding.severity.upper()} ", style), (f"[{finding.code}] ", "bold"), finding.message)
        )


def _header(report: Report) -> Text:
    facts = report.input
    parts = [
        f"rcdiag {report.version}",
        facts.path,
        counted(facts.rows, "row"),
        f"{facts.valid_tokens:,} valid tokens of {facts.tokens:,}",
    ]
    if facts.empty_rows:
        parts.append(f"{facts.empty_rows:,} empty rows")
    if facts.steps:
        parts.append(counted(facts.steps, "step"))
    parts.append(f"device {report.device}")
    text = Text(" · ".join(parts), style="bold")
    text.append("\ninput: " + describe_input(report), style="dim")
    if facts.metadata:
        text.append("\nrun: " + ", ".join(f"{k}={v}" for k, v in facts.metadata.items()), style="dim")
    if facts.skipped_rows:
        reasons = ", ".join(f"{k} {v}" for k, v in facts.skipped_by_reason.items() if v)
        text.append(f"\nskipped {facts.skipped_rows:,} bad rows ({reasons}) with --on-bad-row skip", style="yellow")
    neg_inf = {k: v for k, v in facts.neg_inf_tokens.items() if v}
    if neg_inf:
        counts = ", ".join(f"{k} {v:,}" for k, v in neg_inf.items())
        text.append(f"\n-inf log-probs at valid positions (legal; verl's clamps apply): {counts}", style="dim")
    text.append("\nconfig: " + describe_config(report.config), style="dim")
    return text


def describe_input(report: Report) -> str:
    """Format and the column used for each role."""
    used = ", ".join(f"{role}={name}" for role, name in report.input.columns.items() if name is not None)
    steps = f"; steps from the {report.input.step_source}" if report.input.step_source else ""
    return f"{report.input.format}; columns {used}{steps}"


def describe_config(config: dict) -> str:
    """One line saying what is computed."""
    cfg = CorrectionConfig(**config)
    bits = []
    if cfg.rollout_is is not None and cfg.rollout_is_threshold is not None:
        bits.append(f"rollout_is={cfg.rollout_is} threshold={cfg.rollout_is_threshold}")
        if cfg.rollout_is_batch_normalize:
            bits.append("batch-normalized")
    else:
        bits.append("rollout_is=null")
    if cfg.rollout_rs is not None:
        bits.append(f"rollout_rs={cfg.rollout_rs} threshold={cfg.rollout_rs_threshold}")
    else:
        bits.append("rollout_rs=null")
    # loss_type matters in bypass mode only; decoupled runs say so instead of printing a field that is unused
    bits.append(f"bypass_mode=true loss_type={cfg.loss_type}" if cfg.bypass_mode else "bypass_mode=false (decoupled)")
    bits.append(f"as verl {cfg.verl_version} logs it")
    return ", ".join(bits)


def _group(key: str) -> str:
    spec = metric(key)
    return spec.group if spec is not None else "extras"


def _rs_groups(metrics: dict) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for key in metrics:
        option = rs_option(key)
        if option is not None:
            groups.setdefault(option, []).append(key)
    return groups


def _is_title(config: dict) -> str:
    resolved = CorrectionConfig(**config).resolve().is_spec
    assert resolved is not None
    if resolved.icepop:
        how = f"IcePop: weights outside [{resolved.lower:g}, {resolved.upper:g}] zeroed"
    else:
        how = f"TIS: weights clamped at {resolved.upper:g}"
    norm = ", batch-normalized" if resolved.batch_normalize else ""
    return f"IS weights, {resolved.level} level ({how}{norm})"


def _rs_title(option: str, config: dict) -> str:
    resolved = CorrectionConfig(**config).resolve()
    spec = next(o for o in resolved.rs_options if o.name == option)
    if spec.is_k1:
        assert spec.lower is not None
        keeps = f"keeps ratio pi_train/pi_rollout in [{1 / spec.upper:.6g}, {1 / spec.lower:.6g}]"
    else:
        where = "per token" if spec.level == "token" else f"{spec.agg} per response"
        keeps = f"keeps {spec.estimator} {where} <= {spec.upper:g}"
    return f"RS {option}: {keeps}"


def _metric_table(title: str, keys: list[str], values: dict) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold", show_edge=False, pad_edge=False)
    table.add_column("metric", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    table.add_column("reading", overflow="fold")
    for key in keys:
        table.add_row(key, fmt(values[key]), Text(reading(key, values[key])))
    return table


def evenly_spaced(items: list[T], most: int) -> list[T]:
    """All items, or ``most`` of them evenly spaced (first and last included), for a readable table."""
    if len(items) <= most:
        return items
    stride = (len(items) - 1) / (most - 1)
    return [items[round(i * stride)] for i in range(most)]


def _trend_table(report: Report) -> Table:
    present = [k for k in step_columns("analyze") if k in report.metrics]
    steps = list(report.steps)
    shown = evenly_spaced(steps, MAX_TREND_ROWS)
    title = "Per step (what verl logged at each step)"
    if len(shown) < len(steps):
        title += f": {len(shown)} of {len(steps)} steps shown, evenly spaced; all are in --format json"
    table = Table(title=title, title_justify="left", title_style="bold", show_edge=False, pad_edge=False)
    table.add_column("step", justify="right")
    table.add_column("rows", justify="right")
    for key in present:
        table.add_column(short_key(key), justify="right")
    for step in shown:
        table.add_row(str(step.step), f"{step.rows:,}", *(fmt(step.metrics.get(k)) for k in present))
    return table


def _checks(*, explain: bool = False) -> list[tuple[str, str | None, str]]:
    """(code, full metric key or None, label) of every checklist row, from the finding catalogue; ``--explain``'s
    detectors only when they ran."""
    rows = []
    for spec in FINDINGS:
        if spec.check is None or "analyze" not in spec.commands or (spec.explain and not explain):
            continue
        needed = metric(spec.metric) if spec.metric is not None else None
        label = spec.check
        if needed is not None and "{rule}" in label:
            threshold = next(t for t in needed.thresholds if t.finding == spec.code)
            label = label.format(rule=threshold.describe(needed.short))
        rows.append((spec.code, needed.name if needed is not None else None, label))
    return rows


def _checklist(report: Report) -> Table:
    fired: dict[str, Finding] = {}
    for finding in report.findings:
        fired.setdefault(finding.code, finding)
    table = Table(title="Findings checklist", title_justify="left", title_style="bold", show_edge=False, pad_edge=False)
    table.add_column("", no_wrap=True)
    table.add_column("check")
    table.add_column("code", style="dim")
    table.add_column("where", overflow="fold")
    for code, key, label in _checks(explain=report.explain is not None):
        if key and key not in report.metrics:
            table.add_row(
                Text("–", style="dim"),
                Text(label, style="dim"),
                code,
                Text("not computed for this config", style="dim"),
            )
            continue
        finding = fired.get(code)
        if finding is None:
            table.add_row(Text("✓", style="green"), label, code, "")
            continue
        mark = Text("✗", style=_SEVERITY_STYLE[finding.severity])
        where = "whole dump" if finding.steps is None else _steps_text(finding.steps)
        if finding.value is not None:
            where = f"{fmt(finding.value)} ({where})"
        table.add_row(mark, label, code, where)
    return table


def _steps_text(steps: tuple[int, ...]) -> str:
    listed = ", ".join(map(str, steps[:6])) + (", ..." if len(steps) > 6 else "")
    return f"{len(steps)} step{'s' if len(steps) != 1 else ''}: {listed}"
