"""Where and how a result is written: stdout or a file, table or JSON."""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rcdiag.errors import InputError
from rcdiag.render import OutputFormat, render_json
from rcdiag.report import Report

if TYPE_CHECKING:
    from rich.console import Console


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
        write_text(render_json(report), output)
        return
    from rcdiag.render.table import render_table

    write_rich(lambda console: render_table(report, console), output)


def write_text(text: str, output: Path | None) -> None:
    """Plain text (JSON) to a file or stdout."""
    if output is None:
        sys.stdout.write(text)
    else:
        write_file(output, text)


def write_rich(render: Callable[[Console], None], output: Path | None) -> None:
    """A rich rendering to stdout (terminal width, 160 columns when piped) or to a file as plain text."""
    from rich.console import Console

    from rcdiag.cli.console import PIPE_WIDTH, stdout_console

    if output is None:
        render(stdout_console())
        return
    console = Console(record=True, width=PIPE_WIDTH, file=io.StringIO())
    render(console)
    write_file(output, console.export_text())


def write_file(path: Path, text: str, *, append: bool = False) -> None:
    """Write (or append) ``text``; an unwritable path is an input error (exit 2), not a traceback."""
    try:
        with path.open("a" if append else "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as exc:
        raise InputError(f"cannot write the file ({exc.strerror})", path=str(path)) from None
