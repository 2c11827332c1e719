"""Where and how a result is written, for every command: stdout or ``-o FILE``, in a registered format, and the
"wrote" line on stderr. Output paths are checked when the flags are read, before anything is read or written, and
added to the run's outputs (rcdiag.io.outputs.Ledger, which refuses one over an input); files are written by
rcdiag.io.outputs (whole or not at all, never over an input)."""

from __future__ import annotations

import contextlib
import functools
import io
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import rcdiag.io.outputs as outputs
import rcdiag.runtime.interrupts as interrupts
from rcdiag.cli.stdout import StdoutClosedError, stdout_gone
from rcdiag.render.registry import FORMATS, Renderer, ResultKind, check_extra, renderer
from rcdiag.runtime.errors import ConfigError, OutputError

if TYPE_CHECKING:
    from rich.console import Console


@contextmanager
def checked_stdout() -> Iterator[None]:
    """What the block writes on stdout, flushed and checked: a closed pipe is ``StdoutClosedError``, any other
    failure (a full disk behind a redirection) an ``OutputError``."""
    try:
        yield
        sys.stdout.flush()
    except BrokenPipeError:
        stdout_gone()
        raise StdoutClosedError from None
    except OSError as exc:
        stdout_gone()
        raise OutputError("stdout", exc.strerror or str(exc)) from None


def write_stdout(text: str) -> None:
    """``text`` on stdout, flushed and checked (``checked_stdout``)."""
    with checked_stdout():
        sys.stdout.write(text)


def print_stdout(line: str) -> None:
    """One line on stdout that a closed pipe does not turn into an error (it is dropped: the reader has gone)."""
    with contextlib.suppress(StdoutClosedError):
        write_stdout(line + "\n")


def checked_state_path(text: str | None) -> str | Path | None:
    """``--save-state``: a URL (``s3://...``) as given (it is written with one upload once the state exists), else
    a local path (or ``file://`` URL) checked as ``checked_path`` does."""
    from rcdiag.io.storage import is_remote, local_path

    if text and is_remote(text):
        outputs.writes(text, "--save-state")
        return text
    return checked_path(local_path(text) if text else text, "--save-state")


def checked_path(text: str | None, flag: str) -> Path | None:
    """``text`` as a file path that can be written, or ``None`` when the flag was not given. An empty value (an
    unset variable such as ``$GITHUB_STEP_SUMMARY``), a value that looks like a flag (``--html -q``: give ``./-q``),
    a directory, a missing directory or something that is not a file, device or FIFO is a ``ConfigError`` naming
    ``flag``. The path is added to the run's outputs (rcdiag.io.outputs.Ledger): one that is an input is refused."""
    if text is None:
        return None
    if not text.strip():
        raise ConfigError(
            f"{flag} was given an empty file name (an unset variable such as $GITHUB_STEP_SUMMARY?); "
            f"give a file, or leave {flag} out."
        )
    if text.startswith("-"):
        raise ConfigError(
            f"{flag} was given '{text}', which looks like a flag: was the file name left out? To write a file of "
            f"that name, give it as ./{text}"
        )
    path = Path(text)
    outputs.check_destination(path, flag)
    outputs.writes(path, flag)
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
        target_path = checked_path(path, "--output")  # first: a picture over it names --output
        pictures = []
        for name, file in (files or {}).items():
            picture = FORMATS[name]
            check_extra(picture)
            target = checked_path(file, picture.flag or name)
            assert target is not None
            pictures.append((name, target, picture.renderers[kind]))
        return cls(format_name, target_path, renderer(format_name, kind, command), tuple(pictures))

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

    def emit(self, result: Any, **console_options: Any) -> None:
        """Render ``result``: the files first, each written whole and said on stderr, then stdout. A closed stdout
        (``| head -1``) ends the stdout part only: every file is written and the exit code stays the verdict's.
        ``console_options`` go to a console renderer only (``details=True``: analyze's full tables)."""
        render = self.renderer.load()
        if self.renderer.console and console_options:
            render = functools.partial(render, **console_options)
        interrupts.check()
        if self.path is not None:
            text = rich_text(lambda console: render(result, console)) if self.renderer.console else render(result)
            outputs.write_file(self.path, text)
            print(f"rcdiag: wrote {self.path} ({_summary(result)})", file=sys.stderr)
        for _, path, picture in self.files:
            size = outputs.write_file(path, picture.load()(result))
            print(f"rcdiag: wrote {path} ({size:,} bytes)", file=sys.stderr)
        if self.path is None:
            with contextlib.suppress(StdoutClosedError):
                if self.renderer.console:
                    write_rich(lambda console: render(result, console), None)
                else:
                    write_stdout(render(result))


def _summary(result: Any) -> str:
    counts = getattr(result, "counts", None)
    if counts is not None:  # a check: its rules
        return f"{counts()['failed']} of {len(result.results)} rule(s) failed"
    found = {s: sum(f.severity == s for f in result.findings) for s in ("error", "warning")}
    return f"{found['error']} error(s), {found['warning']} warning(s) in findings"


def write_text(text: str, output: Path | None) -> None:
    """Plain text to a file (whole or not at all) or stdout."""
    if output is None:
        write_stdout(text)
    else:
        outputs.write_file(output, text)


def rich_text(render: Callable[[Console], None]) -> str:
    """A rich rendering as plain text, 160 columns wide (for a file)."""
    from rich.console import Console

    from rcdiag.cli.console import PIPE_WIDTH

    console = Console(record=True, width=PIPE_WIDTH, file=io.StringIO())
    render(console)
    return console.export_text()


def write_rich(render: Callable[[Console], None], output: Path | None) -> None:
    """A rich rendering to stdout (terminal width, 160 columns when piped) or to a file as plain text."""
    from rcdiag.cli.console import stdout_console

    if output is not None:
        outputs.write_file(output, rich_text(render))
        return
    with checked_stdout():
        render(stdout_console())


def write_bytes(path: Path, data: bytes) -> None:
    """Write a binary file (a PNG) whole or not at all; a failure is an ``OutputError`` (exit 2)."""
    outputs.write_file(path, data)


def write_file(path: Path, text: str, *, append: bool = False) -> None:
    """Write (or append) ``text`` whole or not at all; a failure is an ``OutputError`` (exit 2), not a traceback."""
    outputs.write_file(path, text, append=append)
