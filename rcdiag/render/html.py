"""``--html FILE``: one self-contained HTML page (inline CSS, charts as inline SVG, no script, no font, no image
fetched from anywhere), readable offline and without JavaScript, to attach to an issue or a chat.

Charts are drawn from aggregates (per-step metrics, bin counts) and long tables are cut to evenly spaced rows, so
the page stays small (well under 5 MB) whatever the dump's size.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from rcdiag.catalogue import metric, reading, short_key
from rcdiag.catalogue.metrics import step_columns
from rcdiag.records.report import Finding, Report, Verdict
from rcdiag.render import counted
from rcdiag.render.charts import (
    draw_explained,
    draw_sweep,
    draw_trace,
    figure,
    histogram_figure,
    svg,
    trend_figure,
    weights_figure,
)
from rcdiag.render.panels import STATUS_COLOURS, TRENDS, effect_facts, framework_effect_facts
from rcdiag.render.summary import exact_line
from rcdiag.render.table import evenly_spaced
from rcdiag.render.text import (
    BREAKDOWN_METRICS,
    BREAKDOWNS,
    SLICE_COLUMNS,
    WORST_COLUMNS,
    bucket_label,
    describe_config,
    describe_input,
    fmt,
    reading_context,
    slice_cells,
    slice_title,
    where,
    worst_cells,
)
from rcdiag.render.token_html import token_sections

if TYPE_CHECKING:
    from rcdiag.compare.records import Comparison, Comparisons
    from rcdiag.sweep.sweep_report import Recommendation, SweepReport, SweepRow

MAX_STEP_ROWS = 400
"""Per-step table rows; a longer run shows this many evenly spaced steps (every step is in the charts)."""

CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;color:#1d2329;
margin:0 auto;max-width:1500px;padding:24px 28px 48px;background:#fff}
h1{font-size:26px;margin:0 0 4px}
h2{font-size:20px;margin:34px 0 10px;border-bottom:2px solid #e4e7eb;padding-bottom:4px}
.sub{color:#57606a;margin:0 0 16px}
table{border-collapse:collapse;margin:6px 0 14px;font-size:14px}
th,td{border-bottom:1px solid #e4e7eb;padding:4px 10px;text-align:left;vertical-align:top}
th{background:#f6f8fa;font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
code,.code{font-family:ui-monospace,"SFMono-Regular",Menlo,Consolas,monospace;font-size:13px}
.facts th{background:none;width:11em;color:#57606a;font-weight:500}
.ok{color:#1a7f37;font-weight:700}.error{color:#cf222e;font-weight:700}.warning{color:#9a6700;font-weight:700}
.info{color:#0969da;font-weight:700}.muted{color:#8c959f}
.finding{border-left:4px solid #d0d7de;padding:6px 12px;margin:8px 0;background:#f6f8fa}
.finding.error{border-color:#cf222e}.finding.warning{border-color:#d4a72c}.finding.info{border-color:#0969da}
.finding p{margin:2px 0;font-weight:400;color:#1d2329}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(440px,1fr));gap:12px 18px}
.chart svg{width:100%;height:auto;display:block}
.wide svg{max-width:1100px}
.note{color:#57606a;font-size:13px}
.verdict{border:2px solid #d0d7de;border-radius:8px;padding:10px 18px 12px;margin:12px 0 6px;background:#f6f8fa}
.verdict h3{margin:12px 0 4px;font-size:16px}.verdict ul,.verdict ol{margin:4px 0;padding-left:22px}
.verdict .headline{font-size:19px;font-weight:700;margin:4px 0}
.badge{display:inline-block;color:#fff;font-weight:700;letter-spacing:.05em;border-radius:6px;padding:2px 12px;
margin-right:10px;font-size:17px;vertical-align:middle}
.verdict pre{background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:8px 12px;margin:6px 0}
.sides{display:grid;grid-template-columns:repeat(auto-fit,minmax(560px,1fr));gap:0 18px;align-items:start}
"""
CSS += "".join(f".badge.{status},.verdict.{status}{{border-color:{c}}}.badge.{status}{{background:{c}}}"
               for status, c in STATUS_COLOURS.items())  # fmt: skip


def e(text: object) -> str:
    """Escaped text."""
    return html.escape(str(text), quote=True)


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], numeric: Sequence[int] = (), cls: str = "") -> str:
    """A table of already-escaped cells; columns in ``numeric`` are right-aligned."""
    head = "".join(f"<th>{h}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(row))
        + "</tr>"
        for row in rows
    )
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def page(title: str, subtitle: str, sections: Iterable[str]) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(title)}</title><style>{CSS}</style></head><body>"
        f'<h1>{e(title)}</h1><p class="sub">{e(subtitle)}</p>' + "".join(sections) + "</body></html>\n"
    )


def section(title: str, *parts: str) -> str:
    return f"<section><h2>{e(title)}</h2>{''.join(parts)}</section>"


def chart(svg_text: str, wide: bool = False) -> str:
    return f'<div class="chart{" wide" if wide else ""}">{svg_text}</div>'


# --------------------------------------------------------------------------------------------------- analyze


def render_html(report: Report) -> str:
    """The whole analyze report as one page, the verdict first."""
    facts = report.input
    return page(
        "rcdiag report",
        f"{facts.path} · rcdiag {report.version}",
        [
            section("Verdict", _verdict(report.verdict)),
            section("Input and configuration", _facts(report)),
            section("Findings", _findings(report.findings, "No finding: every check below holds."), _checklist(report)),
            *(
                [
                    section("Trends over steps", _trends([(None, report)])),
                    section("Token log-ratio distribution", _histogram([(None, report)])),
                ]
                if report.steps
                else [section("Inside the dump (no step column)", *_inside([(None, report)]))]
            ),
            *_framework(report),
            section("Metrics" + (" (all steps pooled)" if report.steps else ""), _metrics(report)),
            *([section("Per step", _steps(report))] if report.steps else []),
            *_slices(report),
            *_explain(report),
            *token_sections(report, section, table),
        ],
    )


def _slices(report: Report) -> list[str]:
    """With ``--by``: every value of each column, its share of the tokens and of k3_kl, and its own status."""
    record = report.sections.get("slices")
    if record is None:
        return []
    parts = []
    for column, entries in record.tables.items():
        rows = ([e(cell) for cell in slice_cells(entry)] for entry in entries)
        parts.append(f"<h3>{e(slice_title(column, len(entries), len(entries)))}</h3>"
                     + table(SLICE_COLUMNS, rows, numeric=range(1, len(SLICE_COLUMNS) - 1)))  # fmt: skip
    note = (
        f'<p class="note">The concentrated slice: {e(record.concentrated)}.</p>'
        if record.concentrated
        else '<p class="note">No slice carries the mismatch beyond its share of the tokens.</p>'
    )
    return [section("Mismatch by slice (--by)", note, *parts)]


def _verdict(verdict: Verdict | None, side: str = "") -> str:
    """Status badge and headline, the causes with their evidence, the prescription (YAML, measured effect, why)
    and the next steps: every field the verdict has."""
    who = f"Dump {e(side)}: " if side else ""
    if verdict is None:
        return f'<div class="verdict"><p class="headline">{who}no verdict in this report</p></div>'
    parts = [f'<p class="headline"><span class="badge {e(verdict.status)}">{e(verdict.status.upper())}</span>'
             f"{who}{e(verdict.headline)}</p>"]  # fmt: skip
    if verdict.causes:
        items = "".join(f"<li><strong>{e(c.cls.replace('_', ' '))}</strong> "
                        f'<span class="code">[{e(", ".join(c.codes) or "-")}]</span>: {e(c.evidence)}</li>'
                        for c in verdict.causes)  # fmt: skip
        parts.append(f"<h3>Causes</h3><ul>{items}</ul>")
    rec = verdict.recommendation
    if rec is None:
        parts.append('<h3>Prescription</h3><p class="muted">None: no setting prescribed for this dump.</p>')
    else:
        preset = f"<p>verl preset: <code>{e(rec.preset)}</code></p>" if rec.preset else ""
        effect = ""
        if rec.effect is not None:
            rows = [(e(what), e(value)) for what, value in effect_facts(rec.effect)]
            effect = '<p class="note">Measured on this dump:</p>' + table(("effect", "value"), rows, numeric=(1,))
        why = f"<p>{e(rec.why)}</p>" if rec.why else ""
        spoken = rec.framework
        if spoken is not None:  # --as NAME: the framework's own setting first, then verl's
            measured = ""
            if spoken.effect is not None:
                rows = [(e(what), e(value)) for what, value in framework_effect_facts(spoken.effect)]
                measured = (f'<p class="note">Measured on this dump under {e(spoken.release)}\'s semantics:</p>'
                            + table(("effect", "value"), rows, numeric=(1,)))  # fmt: skip
            match = spoken.match.replace("_", " ")
            parts.append(f"<h3>Prescription in {e(spoken.release)} ({e(match)} as verl's setting)</h3>"
                         f"<pre>{e(spoken.paste.rstrip())}</pre>{measured}<p>{e(spoken.meaning)}</p>")  # fmt: skip
            parts.append(f"<h3>verl's setting</h3>{preset}<pre>{e(rec.yaml.rstrip())}</pre>{effect}{why}")
        else:
            parts.append(f"<h3>Prescription</h3>{preset}<pre>{e(rec.yaml.rstrip())}</pre>{effect}{why}")
    if verdict.next_steps:
        parts.append("<h3>Next steps</h3><ol>" + "".join(f"<li>{e(s)}</li>" for s in verdict.next_steps) + "</ol>")
    return f'<div class="verdict {e(verdict.status)}">{"".join(parts)}</div>'


def _inside(reports: Sequence[tuple[str | None, Report]]) -> list[str]:
    """For dumps without steps (each would be one point per trend panel): what varies inside them instead."""
    note = ('<p class="note">No step column: instead of one point per trend panel, what varies inside the dump: '
            "the log-ratio distribution, the token IS weights under the prescription (else under --is), and, with "
            "--explain, where the mismatch sits.</p>")  # fmt: skip
    charts = []
    weights = weights_figure(reports)
    if weights is not None:
        charts.append(chart(svg(weights, "weights")))
    if len(reports) == 1 and (explained := reports[0][1].explain) is not None:
        for i, (name, rows) in enumerate(explained.breakdowns.bucketed()):
            fig = figure(5.6, 3.6)
            draw_explained(fig.subplots(), BREAKDOWNS[name], rows)
            charts.append(chart(svg(fig, f"breakdown{i}")))
    return [note, _histogram(reports), f'<div class="grid">{"".join(charts)}</div>']


def _facts(report: Report) -> str:
    facts = report.input
    rows = [
        ("input", f"<code>{e(facts.path)}</code>"),
        ("read as", e(describe_input(report))),
        ("configuration", e(describe_config(report.config))),
        ("rows", f"{facts.rows:,}" + (f" ({facts.empty_rows:,} without a valid token)" if facts.empty_rows else "")),
        ("tokens", f"{facts.valid_tokens:,} valid of {facts.tokens:,}"),
        *([("exact match", e(line.removeprefix("exact: ")))] if (line := exact_line(report)) is not None else []),
        ("steps", f"{facts.steps:,}" if facts.steps else "none (the dump is one batch)"),
        ("device", e(report.device)),
    ]
    if facts.metadata:
        rows.append(("run", e(", ".join(f"{k}={v}" for k, v in facts.metadata.items()))))
    if facts.skipped_rows:
        reasons = ", ".join(f"{k} {v}" for k, v in facts.skipped_by_reason.items() if v)
        rows.append(("skipped", e(f"{counted(facts.skipped_rows, 'bad row')} ({reasons}) with --on-bad-row skip")))
    body = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="facts"><tbody>{body}</tbody></table>'


def _findings(findings: Sequence[Finding], none: str) -> str:
    """Each finding with its severity, code, the dump it concerns (compare) and its message."""
    if not findings:
        return f'<p class="ok">{none}</p>'
    blocks = []
    for f in findings:
        side = f.side
        blocks.append(f'<div class="finding {f.severity}"><span class="{f.severity}">{f.severity.upper()}</span> '
                      f'<span class="code">[{e(f.code)}]</span>{f" (dump {e(side)})" if side else ""}'
                      f"<p>{e(f.message)}</p></div>")  # fmt: skip
    return "".join(blocks)


_MARKS = {"ok": ("✓", "ok"), "not_computed": ("–", "muted")}


def _checklist(report: Report) -> str:
    rows = []
    for row in report.checklist:
        mark, cls = _MARKS.get(row.status, ("✗", row.status))
        at = f'<span class="muted">{e(where(row))}</span>' if row.status == "not_computed" else e(where(row))
        rows.append(
            (f'<span class="{cls}">{mark}</span>', e(row.check), f'<span class="code">{e(row.code)}</span>', at)
        )
    return "<h3>Checklist</h3>" + table(("", "check", "code", "where"), rows)


def _trends(reports: Sequence[tuple[str | None, Report]]) -> str:
    charts = [chart(svg(trend_figure(panel, reports), f"trend{i}")) for i, panel in enumerate(TRENDS)]
    return f'<div class="grid">{"".join(charts)}</div>'


def _histogram(reports: Sequence[tuple[str | None, Report]]) -> str:
    fig = histogram_figure(reports)
    if fig is None:
        return '<p class="note">No histogram in this report (a state saved by an older rcdiag).</p>'
    nan = sum(r.log_ratio.nan for _, r in reports if r.log_ratio is not None)
    note = f'<p class="note">{nan:,} token(s) with −inf on both sides have no log-ratio.</p>' if nan else ""
    return chart(svg(fig, "histogram"), wide=True) + note


def _framework(report: Report) -> list[str]:
    """``--as NAME``: the framework's keys, values (pooled) and readings, and its notes."""
    record: Any = report.sections.get("framework")
    if record is None:
        return []
    rows = [(f"<code>{e(key)}</code>", fmt(value), e(text)) for key, value, text in record.rows()]
    notes = "".join(f'<p class="note">{e(note)}</p>' for note in record.notes)
    return [section(record.heading(), table(("key", "value", "reading"), rows, numeric=(1,)) if rows else "", notes)]


def _metrics(report: Report) -> str:
    context = reading_context(report)
    rows = [
        (f"<code>{e(key)}</code>", fmt(value), e(reading(key, value, context)))
        for values in (report.metrics, report.extras)
        for key, value in values.items()
    ]
    return table(("metric", "value", "reading"), rows, numeric=(1,))


def _steps(report: Report) -> str:
    keys = [k for k in step_columns("analyze") if k in report.metrics]
    steps = list(report.steps)
    shown = evenly_spaced(steps, MAX_STEP_ROWS)
    note = f'<p class="note">{len(shown)} of {len(steps)} steps, evenly spaced.</p>' if len(shown) < len(steps) else ""
    rows = [(str(s.step), f"{s.rows:,}", *(fmt(s.metrics.get(k)) for k in keys)) for s in shown]
    headers = ("step", "rows", *(e(short_key(k)) for k in keys))
    return note + table(headers, rows, numeric=range(len(headers)))


# --------------------------------------------------------------------------------------------------- explain


def _explain(report: Report) -> list[str]:
    """With ``--explain``: where the mismatch sits, and the worst responses with their tokens."""
    explained = report.explain
    if explained is None:
        return []
    charts, tables = [], []
    for i, (name, entries) in enumerate(explained.breakdowns.bucketed()):
        title = BREAKDOWNS[name]
        labels = [bucket_label(entry) for entry in entries]
        if report.steps:  # without steps the charts are already up top, inside the dump
            fig = figure(5.6, 3.6)
            draw_explained(fig.subplots(), title, entries)
            charts.append(chart(svg(fig, f"breakdown{i}")))
        rows = [(e(label), f"{entry.tokens:,}", *(fmt(getattr(entry, key)) for key in BREAKDOWN_METRICS))
                for label, entry in zip(labels, entries, strict=True)]  # fmt: skip
        headers = ("bucket", "tokens", *(e(label) for label in BREAKDOWN_METRICS.values()))
        tables.append(f"<h3>{e(title)}</h3>" + table(headers, rows, numeric=range(1, len(headers))))
    where = section("Where the mismatch sits (--explain)", f'<div class="grid">{"".join(charts)}</div>', *tables)
    worst = table(WORST_COLUMNS, ([e(cell) for cell in worst_cells(entry)] for entry in explained.worst_sequences),
                  numeric=(0, 1, 3, 4, 5, 6))  # fmt: skip
    listed = {entry.row: entry for entry in explained.worst_sequences}
    plots = []
    for i, trace in enumerate(explained.traces):
        entry = listed[trace.row]
        step = "" if entry.step is None else f", step {entry.step}"
        fig = figure(5.6, 3.2)
        draw_trace(fig.subplots(), f"row {trace.row}{step}: sum {fmt(entry.log_ratio_sum)}", trace.positions,
                   trace.log_ratios, entry.position_of_max)  # fmt: skip
        plots.append(chart(svg(fig, f"trace{i}")))
    note = (
        f'<p class="note">The {len(plots)} worst, token by token (a response longer than the plot keeps each run '
        "of tokens' lowest and highest log-ratio).</p>"
        if plots
        else ""
    )
    title = f"Worst responses (largest |sum of log-ratios|, top {len(explained.worst_sequences)})"
    return [where, section(title, worst, note, f'<div class="grid">{"".join(plots)}</div>')]


# --------------------------------------------------------------------------------------------------- compare


def render_comparison_html(comparison: Comparison | Comparisons) -> str:
    """Both dumps on one page: their facts, the verdicts, every chart with both overlaid, the metric table."""
    from rcdiag.compare.records import Comparisons

    if isinstance(comparison, Comparisons):
        return _comparisons_html(comparison)
    a, b = comparison.a, comparison.b
    sides = [("A", a), ("B", b)]
    title = "Is B different from A? (95% intervals)"
    tested = [section(title, _tests([("B", comparison)]))] if comparison.tests else []
    return page(
        "rcdiag comparison",
        f"A: {a.input.path} · B: {b.input.path} · rcdiag {a.version}",
        [
            section(
                "Verdict per dump", f'<div class="sides">{_verdict(a.verdict, "A")}{_verdict(b.verdict, "B")}</div>'
            ),
            section("Dumps", _sides(comparison)),
            section("Findings on the pair", _findings(comparison.findings, "No finding."), _temperature(comparison)),
            *tested,
            *(
                [
                    section("Trends over steps, A and B overlaid", _trends(sides)),
                    section("Token log-ratio distribution, A and B (share of each dump's tokens)", _histogram(sides)),
                ]
                if a.steps or b.steps
                else [section("Inside the dumps (no step column), A and B overlaid", *_inside(sides))]
            ),
            section("Metrics, all steps pooled", _diffs(comparison)),
        ],
    )


def _comparisons_html(many: Comparisons) -> str:
    """Every dump against the baseline: verdicts, the tests (Holm-adjusted), per-step trajectories overlaid."""
    labels = [chr(ord("A") + i) if i < 26 else str(i + 1) for i in range(len(many.reports))]
    sides = list(zip(labels, many.reports, strict=True))
    rows = [(label, f"<code>{e(r.input.path)}</code>", f"{r.input.rows:,}", f"{r.input.valid_tokens:,}",
             f"{r.input.steps:,}") for label, r in sides]  # fmt: skip
    verdicts = "".join(_verdict(r.verdict, label) for label, r in sides)
    return page(
        "rcdiag comparison",
        f"baseline A: {many.baseline.input.path} · {len(many.comparisons)} dumps against it · "
        f"rcdiag {many.baseline.version}",
        [
            section("Dumps", table(("", "dump", "rows", "valid tokens", "steps"), rows, numeric=(2, 3, 4))),
            section("Verdict per dump", f'<div class="sides">{verdicts}</div>'),
            section(
                "Each dump against A (95% intervals, p-values Holm-adjusted over the comparisons)",
                _tests(list(zip(labels[1:], many.comparisons, strict=True))),
            ),
            *([section("Trends over steps, every dump overlaid", _trends(sides))] * any(r.steps for r in many.reports)),
        ],
    )


def _tests(pairs: Sequence[tuple[str, Comparison]]) -> str:
    rows = []
    for label, comparison in pairs:
        for test in comparison.tests.values():
            p = test.p_value if test.adjusted_p_value is None else test.adjusted_p_value
            interval = "" if test.ci_low is None else f"[{fmt(test.ci_low)}, {fmt(test.ci_high)}]"
            rows.append((e(label), f"<code>{e(test.metric)}</code>", fmt(test.a), fmt(test.b), fmt(test.difference),
                         interval, fmt(p), "yes" if test.significant else "no",
                         e(f"{test.units} ({test.method})")))  # fmt: skip
    headers = ("dump", "metric", "A", "that dump", "difference", "95% interval", "p", "significant", "units")
    return table(headers, rows, numeric=(2, 3, 4, 6))


def _sides(comparison: Comparison) -> str:
    rows = []
    for side, report in (("A", comparison.a), ("B", comparison.b)):
        facts = report.input
        rows.append((side, f"<code>{e(facts.path)}</code>", e(describe_input(report)), f"{facts.rows:,}",
                     f"{facts.valid_tokens:,}", f"{facts.steps:,}"))  # fmt: skip
    config = f"<p>Configuration (both): {e(describe_config(comparison.a.config))}</p>"
    return config + table(("", "dump", "read as", "rows", "valid tokens", "steps"), rows, numeric=(3, 4, 5))


def _temperature(comparison: Comparison) -> str:
    lines = comparison.temperature.explanation
    return "<h3>Temperature</h3>" + "".join(f"<p>{e(line)}</p>" for line in lines) if lines else ""


def _diffs(comparison: Comparison) -> str:
    rows = [
        (f"<code>{e(d.key)}</code>", fmt(d.a), fmt(d.b), fmt(d.difference), fmt(d.ratio), e(_what(d.key)))
        for d in comparison.metrics
    ]
    return table(("metric", "A", "B", "B − A", "B / A", "what it is"), rows, numeric=(1, 2, 3, 4))


def _what(key: str) -> str:
    spec = metric(key)
    return spec.reading if spec is not None else ""


# ----------------------------------------------------------------------------------------------------- sweep


def render_sweep_html(report: SweepReport) -> str:
    """The sweep: analyze's verdict on the dump and the advice that agrees with it, each option's rejected share
    against its threshold with the recommended point, the recommendations with their verl YAML, the presets ranked
    and every row."""
    from rcdiag.sweep.sweep_report import NOT_URGED

    facts = report.input
    advice = report.advice
    urged = advice is None or advice.urges
    said = "" if advice is None else f'<p class="headline">{e(advice.says)}</p>'
    said += "" if advice is None or not advice.differs else f'<p class="note">{e(advice.differs)}</p>'
    verdict = [section("Verdict", _verdict(report.verdict), said)] if report.verdict is not None else []
    title = "Recommended thresholds" if urged else f"Thresholds at the target ({NOT_URGED})"
    target = "" if report.target_reject is None else f" · target {fmt(report.target_reject)} rejected"
    return page(
        "rcdiag sweep",
        f"{facts.path} · {facts.rows:,} rows · {facts.valid_tokens:,} valid tokens{target} · rcdiag {report.version}",
        [
            *verdict,
            section("Findings", _findings(report.findings, "No finding: no threshold makes verl crash.")),
            section("Rejected share by threshold", _sweep_curves(report)),
            *([section(title, _recommendations(report))] if report.recommendations else []),
            *([section("verl presets on this dump", _presets(report))] if report.presets else []),
            section("Every threshold", _sweep_rows(report)),
        ],
    )


def _upper(spec: str) -> float:
    """A threshold spec's upper bound (``0.5_2.0`` -> 2.0, ``0.01`` -> 0.01): the x of the sweep curves."""
    return float(spec.split("_")[-1])


def _shares(rows: list[SweepRow]) -> dict[str, tuple[list[float], list[float | None]]]:
    curves: dict[str, tuple[list[float], list[float | None]]] = {}
    for row in rows:
        kind = "" if row.is_spec is None else "IcePop " if row.icepop else "TIS "
        for what, value in (("tokens", row.token_reject), ("responses", row.seq_reject)):
            if value is None and what == "tokens" and row.option == "is_sequence":
                continue
            xs, ys = curves.setdefault(f"{kind}{what}", ([], []))
            xs.append(_upper(row.threshold))
            ys.append(value)
    return {label: curve for label, curve in curves.items() if any(y is not None for y in curve[1])}


def _sweep_curves(report: SweepReport) -> str:
    recommended = {rec.option: rec for rec in report.recommendations}
    charts = []
    options = list(dict.fromkeys(row.option for row in report.rows))
    for i, option in enumerate(options):
        rows = [row for row in report.rows if row.option == option]
        rec = recommended.get(option)
        point = None
        if rec is not None and rec.threshold is not None:
            share = rec.token_reject if rec.share == "token" else rec.seq_reject
            point = None if share is None else (_upper(rec.threshold), share, rec.threshold)
        fig = figure(5.6, 3.6)
        draw_sweep(fig.subplots(), option, _shares(rows), point, report.target_reject)
        charts.append(chart(svg(fig, f"sweep{i}")))
    return f'<div class="grid">{"".join(charts)}</div>'


def _recommendations(report: SweepReport) -> str:
    """RS recommendations (what they reject) and IS ones (what they truncate), each with its YAML unless it is no
    setting to paste, and where it sits on the grid."""
    from rcdiag.sweep.sweep_report import GRID_NOTE, IS_SHARES, RS_SHARES, weights_truncated

    def cells(r: Recommendation) -> tuple[str, ...]:
        threshold = f"<code>{e(r.threshold)}</code>" if r.threshold is not None else "cannot be met"
        grid = (
            ""
            if r.nearest is None
            else (
                "on the grid"
                if r.nearest.on_grid
                else f"<code>{e(r.nearest.threshold)}</code> ({fmt(r.nearest.share)})"
            )
        )
        if r.unreachable:
            yaml = e(r.unreachable)
        elif r.not_config:
            yaml = f'<p class="note"><b>not config, do not paste:</b> {e(r.not_config)}</p>'
        else:
            yaml = f"<pre>{e(r.yaml.rstrip())}</pre>"
        yaml += "".join(f'<p class="note">{e(w)}</p>' for w in r.warnings)
        return (f"<code>{e(r.option)}</code>", threshold, fmt(r.token_reject), fmt(r.seq_reject), grid, yaml)

    rs = [cells(r) for r in report.recommendations if not r.option.startswith("is_")]
    is_ = [
        (c[0], c[1], e(weights_truncated(r)), *c[2:])
        for r in report.recommendations
        if r.option.startswith("is_")
        for c in (cells(r),)
    ]
    parts = [f'<p class="note">{e(GRID_NOTE)}</p>']
    if rs:
        parts.append(table(("option", "threshold", *RS_SHARES, "nearest grid point", "verl YAML"), rs, numeric=(2, 3)))
    if is_:
        headers = ("IS level (TIS)", "threshold", "weights truncated", *IS_SHARES, "nearest grid point", "verl YAML")
        parts.append(table(headers, is_, numeric=(3, 4)))
    if report.framework is not None:
        parts.append(_spoken(report))
    return "".join(parts)


def _spoken(report: SweepReport) -> str:
    """Under ``sweep --as NAME``: each recommendation in that framework's settings, measured under its semantics."""
    from rcdiag.render.text import SPOKEN_COLUMNS, spoken_cells

    rows = []
    for r in report.recommendations:
        if r.framework is None:
            continue
        cells = [e(cell) for cell in spoken_cells(r)]
        paste = f"<pre>{e(r.framework.paste.rstrip())}</pre>" if r.framework.paste else ""
        rows.append((*cells, paste + f'<p class="note">{e(r.framework.meaning)}</p>'))
    title = f"<h3>In {e(report.framework)}'s settings, measured under its semantics</h3>"
    return title + table((*SPOKEN_COLUMNS, "to paste; what differs"), rows, numeric=(3, 4, 5, 6, 7))


def _presets(report: SweepReport) -> str:
    from rcdiag.sweep.sweep_report import PRESET_RANKING

    rows = [
        (f"<code>{e(p.name)}</code>", fmt(p.token_reject), fmt(p.seq_reject),
         "—" if p.is_truncated_share is None else fmt(p.is_truncated_share), "no IS" if p.ess is None else fmt(p.ess),
         e(p.note))
        for p in report.presets
    ]  # fmt: skip
    note = f'<p class="note">{e(PRESET_RANKING[0].upper() + PRESET_RANKING[1:])}.</p>'
    header = ("preset", "tokens rejected", "responses rejected", "IS truncated", "ESS", "note")
    return note + table(header, rows, numeric=(1, 2, 3, 4))


def _sweep_rows(report: SweepReport) -> str:
    rows = [
        (f"<code>{e(r.option)}</code>", f"<code>{e(r.threshold)}</code>", fmt(r.token_reject), fmt(r.seq_reject),
         fmt(r.ess), "verl would crash" if r.crashes else "")
        for r in report.rows
    ]  # fmt: skip
    headers = ("option", "threshold", "tokens rejected (IS: beyond the bounds)",
               "responses rejected (IS: beyond the bounds)", "ESS", "")  # fmt: skip
    return table(headers, rows, numeric=(2, 3, 4))
