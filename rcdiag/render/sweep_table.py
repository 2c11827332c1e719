"""The terminal sweep: per option a table of its thresholds with the rejected shares, IS weight statistics, the
worst step and a bar plot of the rejected share; a curve per option; then recommendations, the verl YAML, the
presets ranked and any verl-would-crash finding; first, analyze's verdict on the dump, the advice that agrees with it
(``rcdiag.sweep.advice``) and any bias detector's finding."""

from __future__ import annotations

from itertools import groupby

from rich.console import Console
from rich.table import Table
from rich.text import Text

from rcdiag.catalogue.keys import Key
from rcdiag.catalogue.metrics import rs_key
from rcdiag.render.panels import sparkline
from rcdiag.render.table import fmt, print_verdict
from rcdiag.render.text import SPOKEN_COLUMNS, spoken_cells
from rcdiag.runtime.printable import printable
from rcdiag.sweep.sweep_report import (
    GRID_NOTE,
    IS_SHARES,
    NOT_URGED,
    PRESET_RANKING,
    RS_SHARES,
    Recommendation,
    SweepReport,
    SweepRow,
    weights_truncated,
)

BAR_WIDTH = 20


def bar(value: float | None, width: int = BAR_WIDTH) -> str:
    """A text bar of a share in [0, 1]."""
    if value is None:
        return ""
    filled = max(0, min(width, round(value * width)))
    return "█" * filled + "·" * (width - filled)


def render_sweep(report: SweepReport, console: Console) -> None:
    """Print the whole sweep."""
    facts = report.input
    head = [
        f"rcdiag {report.version} sweep",
        f"as verl {report.verl_version} logs it",
        printable(facts.path),
        f"{facts.rows:,} rows",
        f"{facts.valid_tokens:,} valid tokens",
    ]
    if facts.empty_rows:
        head.append(f"{facts.empty_rows:,} empty rows")
    if facts.steps:
        head.append(f"{facts.steps} steps (metrics pooled over steps)")
    if facts.skipped_rows:
        head.append(f"{facts.skipped_rows:,} rows skipped")
    if report.framework is not None:
        head.append(f"recommendations also in {report.framework}'s settings")
    console.print(Text(" · ".join(head), style="bold"))
    if report.verdict is not None:
        print_verdict(report.verdict, console)
    advice = report.advice
    if advice is not None:
        console.print(Text(printable(advice.says), style="bold"))
        if advice.differs:
            console.print(Text(printable(advice.differs)))
    for found in (f for f in report.findings if f.severity == "warning"):  # the bias detectors
        console.print(Text.assemble(("WARNING ", "yellow"), (f"[{found.code}] ", "bold"), printable(found.message)))
    urged = advice is None or advice.urges
    for option, rows in groupby(report.rows, key=lambda r: r.option):
        console.print(_option_table(option, list(rows)))
    if report.recommendations:
        for table in _recommendations(report, urged):
            console.print(table)
        console.print(Text(GRID_NOTE))
        for note, options in _notes(report).items():
            console.print(Text.assemble(("WARNING ", "yellow"), (f"{', '.join(options)}: ", "bold"), note))
        pasteable = [rec for rec in report.recommendations if rec.yaml]
        if pasteable:
            said = "verl YAML to paste (one option each):" if urged else f"verl YAML of each ({NOT_URGED}):"
            console.print(Text(said, style="bold"))
        for rec in pasteable:
            console.print(Text(rec.yaml.rstrip()))
        if report.framework is not None:
            console.print(_spoken(report, urged))
            for rec in report.recommendations:
                spoken = rec.framework
                if spoken is not None and spoken.paste:
                    match = spoken.match.replace("_", " ")
                    console.print(Text(f"# {rec.option} {rec.threshold} in {spoken.release} ({match})", style="bold"))
                    console.print(Text(spoken.paste.rstrip()))
        for rec in report.recommendations:
            if rec.not_config:
                console.print(
                    Text.assemble(
                        ("NOT CONFIG ", "bold red"),
                        (f"{rec.option} {rec.threshold}: ", "bold"),
                        f"no YAML offered, do not paste it: {rec.not_config}",
                    )
                )
    if report.presets:
        console.print(_presets(report, urged))
    for finding in report.findings:
        if finding.severity == "warning":
            continue  # said first
        steps = f" (steps {', '.join(map(str, finding.steps))})" if finding.steps else ""
        console.print(
            Text.assemble(("ERROR ", "bold red"), (f"[{finding.code}] ", "bold"), printable(finding.message + steps))
        )


def _option_table(option: str, rows: list[SweepRow]) -> Table:
    is_option = option.startswith("is_")
    share = [r.token_reject if option != "is_sequence" else r.seq_reject for r in rows]
    what = "beyond the bounds" if is_option else "rejected"
    title = f"{option}: share {what} by threshold  {sparkline(share, len(share), floor=0.0)}"
    table = _table(title)
    table.add_column("threshold")
    table.add_column("tokens " + what if option != "is_sequence" else "responses " + what, justify="right")
    if not is_option:
        table.add_column("responses rejected", justify="right")
    else:
        for name in ("mean", "std", "ESS", "high", "low"):
            table.add_column(name, justify="right")
    table.add_column("worst step", justify="right")
    table.add_column("")
    for row, value in zip(rows, share, strict=True):
        cells = [row.threshold, fmt(value)]
        if is_option:
            m = row.metrics
            cells += [
                fmt(m.get(Key.ROLLOUT_IS_MEAN)),
                fmt(m.get(Key.ROLLOUT_IS_STD)),
                fmt(m.get(Key.ROLLOUT_IS_EFF_SAMPLE_SIZE)),
                fmt(m.get(Key.ROLLOUT_IS_RATIO_FRACTION_HIGH)),
                fmt(m.get(Key.ROLLOUT_IS_RATIO_FRACTION_LOW)),
            ]
        else:
            cells.append(fmt(row.seq_reject))
        cells += [_worst_step(row), bar(value)]
        style = "red" if row.crashes else None
        table.add_row(*cells, style=style)
    return table


def _worst_step(row: SweepRow) -> str:
    """The step that rejects the most (RS) or keeps the lowest ESS (IS), with that value."""
    if not row.steps:
        return "—"
    if row.option.startswith("is_"):
        key, pick = Key.ROLLOUT_IS_EFF_SAMPLE_SIZE, min
    else:
        key, pick = rs_key(row.option, "masked_fraction"), max
    if row.crash_steps:
        return f"{row.crash_steps[0]} (crash)"
    present = [(value, step) for step, m in row.steps if (value := m.get(key)) is not None]
    if not present:
        return "—"
    value = pick(v for v, _ in present)
    if pick is max and value == 0:
        return "—"
    return f"{next(step for v, step in present if v == value)} ({fmt(value)})"


def _recommendations(report: SweepReport, urged: bool) -> list[Table]:
    """RS recommendations (what they reject), then IS ones (what they truncate: TIS never rejects a sample); titled
    as what each would do where no threshold is the remedy (not ``urged``)."""
    target = report.target_reject
    lead, tail = ("Recommended ", "") if urged else ("", f" ({NOT_URGED})")
    rs = [rec for rec in report.recommendations if not rec.option.startswith("is_")]
    is_ = [rec for rec in report.recommendations if rec.option.startswith("is_")]
    tables = []
    if rs:
        table = _table(f"{lead}RS thresholds{tail}: closest to {target:g} rejected without exceeding it")
        columns = ("option", "threshold", "share targeted", *RS_SHARES, "nearest grid point")
        for name in columns:
            table.add_column(name, justify="left" if name in ("option", "threshold", "nearest grid point") else "right")
        for rec in rs:
            shares = (fmt(rec.token_reject), fmt(rec.seq_reject))
            table.add_row(rec.option, _threshold(rec), rec.share, *shares, _grid(rec))
        tables.append(table)
    if is_:
        table = _table(f"{lead}IS thresholds (TIS){tail}: closest to {target:g} of the weights truncated, not above it")
        columns = ("option", "threshold", "weights truncated", *IS_SHARES, "nearest grid point")
        for name in columns:
            table.add_column(name, justify="left" if name in ("option", "threshold", "nearest grid point") else "right")
        for rec in is_:
            row = (weights_truncated(rec), fmt(rec.token_reject), fmt(rec.seq_reject))
            table.add_row(rec.option, _threshold(rec), *row, _grid(rec))
        tables.append(table)
    return tables


def _spoken(report: SweepReport, urged: bool) -> Table:
    tail = "" if urged else f"; {NOT_URGED}"
    table = _table(f"In {report.framework}'s settings, measured on this dump under its semantics (--as){tail}")
    for name in (*SPOKEN_COLUMNS, "what differs"):
        table.add_column(name, justify="right" if name in SPOKEN_COLUMNS[3:] else "left")
    for rec in report.recommendations:
        if rec.framework is not None:
            table.add_row(*(Text(cell) for cell in (*spoken_cells(rec), rec.framework.meaning)))
    return table


def _threshold(rec: Recommendation) -> str:
    if rec.threshold is None:
        return "cannot be met"
    return rec.threshold + (" (do not paste)" if rec.not_config else " (!)" if rec.warnings else "")


def _grid(rec: Recommendation) -> str:
    """Where the exact threshold sits on the grid."""
    if rec.nearest is None:
        return ""
    if rec.nearest.on_grid:
        return "on the grid"
    return f"{rec.nearest.threshold} ({fmt(rec.nearest.share)})"


def _notes(report: SweepReport) -> dict[str, list[str]]:
    """Each recommendation's warning (or why it has none) with the options it applies to, in order."""
    notes: dict[str, list[str]] = {}
    for rec in report.recommendations:
        for note in (rec.unreachable,) if rec.unreachable else rec.warnings:
            notes.setdefault(note, []).append(rec.option)
    return notes


def _presets(report: SweepReport, urged: bool) -> Table:
    table = _table(f"verl presets on this dump{'' if urged else f' ({NOT_URGED})'}, {PRESET_RANKING}")
    for name in ("preset", "tokens rejected", "responses rejected", "IS truncated", "ESS", "note"):
        table.add_column(name, justify="left" if name in ("preset", "note") else "right")
    for preset in report.presets:
        ess = "no IS" if preset.ess is None else fmt(preset.ess)
        truncated = "—" if preset.is_truncated_share is None else fmt(preset.is_truncated_share)
        style = None if preset.tier == 0 else "dim"
        table.add_row(
            preset.name, fmt(preset.token_reject), fmt(preset.seq_reject), truncated, ess, preset.note, style=style
        )
    return table


def _table(title: str) -> Table:
    return Table(title=title, title_justify="left", title_style="bold")
