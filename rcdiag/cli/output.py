"""Where and how a result is written, for every command: stdout or ``-o FILE``, in a registered format, and the
"wrote" line on stderr. Output paths are checked when the flags are read, before anything is read or written."""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rcdiag.errors import ConfigError, InputError
from rcdiag.render.registry import FORMATS, Renderer, ResultKind, check_extra, renderer

if TYPE_CHECKING:
    from rich.console import Console


class StdoutClosedError(Exception):
    """The reader of stdout went away (``rcdiag analyze X | head -1``); ``rcdiag.cli.main`` exits 0 quietly.

    Not an ``OSError``: click turns an ``EPIPE`` ``OSError`` into exit 1 before ``main`` could see it."""


def checked_state_path(text: str | None) -> str | Path | None:
    """``--save-state``: a URL (``s3://...``) as given (it is written with one upload once the state exists), else
    a local path (or ``file://`` URL) checked as ``checked_path`` does."""
    from rcdiag.io.storage import is_remote, local_path

    if text and is_remote(text):
        return text
    return checked_path(local_path(text) if text else text, "--save-state")


def checked_path(text: str | None, flag: str) -> Path | None:
    """``text`` as a file path that can be written, or ``None`` when the flag was not given. An empty value (an
    unset variable such as ``$GITHUB_STEP_SUMMARY``), a directory or a missing directory is a ``ConfigError``
    naming ``flag``."""
    if text is None:
        return None
    if not text.strip():
        raise ConfigError(
            f"{flag} was given an empty file name (an unset variable such as $GITHUB_STEP_SUMMARY?); "
            f"give a file, or leave {flag} out."
        )
    path = Path(text)
    if path.is_dir():
        raise ConfigError(f"{flag} {text}: is a directory; give a file name.")
    parent = path.parent
    if not parent.is_dir():
        raise ConfigError(f"{flag} {text}: the directory {parent} does not exist.")
    if not os.access(path if path.exists() else parent, os.W_OK):
        raise ConfigError(f"{flag} {text}: cannot be written (permission denied).")
    return path


@dataclass(frozen=True)
class Output:
    """A result's destination (``path``; ``None``: stdout) and its renderer, plus the pictures asked for with their
    own flags (``--html FILE``): each a file and its renderer."""

    format: str
    path: Path | None
    renderer: Renderer
    files: tuple[tuple[str, Path, Renderer], ...] = ()
    """(format name, file, renderer) of each picture."""

    @classmethod
    def of(
        cls, format_name: str, path: str | None, kind: ResultKind, command: str, files: dict[str, str] | None = None
    ) -> Output:
        pictures = []
        for name, file in (files or {}).items():
            picture = FORMATS[name]
            check_extra(picture)
            target = checked_path(file, picture.flag or name)
            assert target is not None
            pictures.append((name, target, picture.renderers[kind]))
        return cls(format_name, checked_path(path, "--output"), renderer(format_name, kind, command), tuple(pictures))

    def as_kind(self, kind: ResultKind, command: str) -> Output:
        """The same destinations for another kind of result (``merge`` of sweep states); a picture that cannot
        render it is a ``ConfigError``."""
        files = []
        for name, path, _ in self.files:
            picture = FORMATS[name]
            if kind not in picture.renderers:
                raise ConfigError(f"rcdiag {command} cannot write {picture.flag} for a {kind}.")
            files.append((name, path, picture.renderers[kind]))
        return Output(self.format, self.path, renderer(self.format, kind, command), tuple(files))

    @property
    def text_to_stdout(self) -> bool:
        """Machine-readable text on stdout: keep stderr free of progress bars when stdout is piped."""
        return self.path is None and not self.renderer.console

    def emit(self, result: Any) -> None:
        """Render ``result``; with a file, say on stderr what was written."""
        render = self.renderer.load()
        if self.renderer.console:
            write_rich(lambda console: render(result, console), self.path)
        else:
            write_text(render(result), self.path)
        if self.path is not None:
            print(f"rcdiag: wrote {self.path} ({_summary(result)})", file=sys.stderr)
        for _, path, picture in self.files:
            drawn = picture.load()(result)
            write_bytes(path, drawn) if picture.binary else write_file(path, drawn)
            print(f"rcdiag: wrote {path} ({os.path.getsize(path):,} bytes)", file=sys.stderr)


def _summary(result: Any) -> str:
    counts = getattr(result, "counts", None)
    if counts is not None:  # a check: its rules
        return f"{counts()['failed']} of {len(result.results)} rule(s) failed"
    found = {s: sum(f.severity == s for f in result.findings) for s in ("error", "warning")}
    return f"{found['error']} error(s), {found['warning']} warning(s) in findings"


def write_text(text: str, output: Path | None) -> None:
    """Plain text to a file or stdout."""
    if output is None:
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except BrokenPipeError:
            raise StdoutClosedError from None
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


def write_bytes(path: Path, data: bytes) -> None:
    """Write a binary file (a PNG); an unwritable path is an input error (exit 2)."""
    try:
        path.write_bytes(data)
    except OSError as exc:
        raise InputError(f"cannot write the file ({exc.strerror})", path=str(path)) from None


def write_file(path: Path, text: str, *, append: bool = False) -> None:
    """Write (or append) ``text``; an unwritable path is an input error (exit 2), not a traceback."""
    try:
        with path.open("a" if append else "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as exc:
        raise InputError(f"cannot write the file ({exc.strerror})", path=str(path)) from None
