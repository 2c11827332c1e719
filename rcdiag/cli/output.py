"""Where and how a report is written: stdout or a file, table or JSON."""

from __future__ import annotations

import io
import sys
from pathlib import Path

from rcdiag.errors import InputError
from rcdiag.render import OutputFormat, render_json
from rcdiag.report import Report


def write_report(report: Report, output_format: OutputFormat, output: Path | None) -> None:
    """Render ``report`` to ``output`` (a file, written only once the report exists) or to stdout; with a file,
    say on stderr what was written."""
    _render(report, output_format, output)
    if output is not None:
        counts = {s: sum(f.severity == s for f in report.findings) for s in ("error", "warning")}
        print(
            f"rcdiag: wrote {output} ({counts['error']} error(s), {counts['warning']} warning(s) in findings)",
            file=sys.stderr,
        )


def _render(report: Report, output_format: OutputFormat, output: Path | None) -> None:
    if output_format is OutputFormat.json:
        text = render_json(report)
        if output is None:
            sys.stdout.write(text)
        else:
            _write(output, text)
        return
    from rich.console import Console

    from rcdiag.cli.console import PIPE_WIDTH, stdout_console
    from rcdiag.render.table import render_table

    if output is None:
        render_table(report, stdout_console())
        return
    console = Console(record=True, width=PIPE_WIDTH, file=io.StringIO())
    render_table(report, console)
    _write(output, console.export_text())


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot write the report ({exc.strerror})", path=str(path)) from None
