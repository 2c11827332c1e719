"""The ``rcdiag`` command line: parse, call the library, render. Nothing else lives here.

``main`` is the console-script entry point. It turns every user error into one line on stderr and the
documented exit code (2), a Ctrl-C or SIGTERM into ``rcdiag: aborted`` (130 or 143; rcdiag.runtime.interrupts), and any
other exception into exit code 3 with a hint to report it; it never shows a traceback. A closed stdout never
changes the exit code.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from typing import Any, Literal, NoReturn

import typer

import rcdiag.io.outputs as outputs
import rcdiag.runtime.interrupts as interrupts
from rcdiag._version import __version__
from rcdiag.cli.commands import HELP_NAMES, Group, LazyCommands, collection_paused
from rcdiag.cli.notices import notices_live_warnings_held, show_held
from rcdiag.cli.stdout import StdoutClosedError, stdout_gone
from rcdiag.runtime.errors import ExitCode, RcdiagError
from rcdiag.runtime.printable import printable

MARKUP: Literal["markdown"] = "markdown"


class _Group(Group):
    """rcdiag's group: its sub-commands are built when first asked for (rcdiag.cli.commands), so that a run or a
    command's ``--help`` imports and builds that command alone."""

    def __init__(self, **attrs: object) -> None:
        self.lazy = LazyCommands(MARKUP)
        attrs["commands"] = self.lazy
        super().__init__(**attrs)  # type: ignore[arg-type]

    def list_commands(self, ctx: Any) -> list[str]:
        """The names, in order, without building the commands (typer's reads every value)."""
        return list(self.lazy)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        """typer's help of the group, listing each command by its stand-in (``LazyCommands.listing``)."""
        with self.lazy.listing():
            return super().format_help(ctx, formatter)


app = typer.Typer(
    name="rcdiag",
    cls=_Group,
    help="Diagnose training-inference mismatch in LLM RL from saved log-prob dumps, with verl's rollout "
    "correction metrics (IS weights, RS masks, kl, k3_kl, chi2, ESS, PPL).",
    no_args_is_help=True,
    rich_markup_mode=MARKUP,
    pretty_exceptions_enable=False,
    add_completion=False,
    add_help_option=False,  # its own --help below: a flag that defaults to False
    context_settings={"help_option_names": HELP_NAMES},  # -h too, in every command (their contexts inherit it)
)


def _version(value: bool) -> None:
    if value:
        print(f"rcdiag {__version__}")
        raise typer.Exit()


def _help(ctx: typer.Context, value: bool) -> None:
    """What click's own ``--help`` does. click's leaves the flag unset (``None``) when it is not given, which typer
    0.29 validates through pydantic, so every sub-command paid for importing pydantic; ``False`` needs none."""
    if value and not ctx.resilient_parsing:
        typer.echo(ctx.get_help(), color=ctx.color)
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    show_help: bool = typer.Option(
        False, *HELP_NAMES, callback=_help, is_eager=True, expose_value=False, help="Show this message and exit."
    ),
) -> None:
    """Diagnose training-inference mismatch in LLM RL from saved log-prob dumps."""


def main(argv: list[str] | None = None) -> None:
    """Run the CLI and exit with rcdiag's documented exit codes."""
    with collection_paused():  # until the command runs (rcdiag.cli.commands)
        _main(argv)


def _main(argv: list[str] | None) -> None:
    previous = interrupts.install()
    try:
        try:
            # a library's warning (numpy, torch) and rcdiag's notices must not precede the one error line: shown
            # only after a success (a Busy notice, such as kernels compiling, at once)
            with notices_live_warnings_held() as held, outputs.ledger():  # what the command reads and writes
                result = typer.main.get_command(app).main(args=argv, prog_name="rcdiag", standalone_mode=False)
        except BaseException as exc:  # every way out gets its documented code
            _fail(exc, sys.argv[1:] if argv is None else argv, program=argv is None)
        if interrupts.received() is not None:  # a signal whose exception something swallowed
            _abort(program=argv is None)
        show_held(held)
        failed = _flush_stdout()
        if failed is not None:  # what was printed did not reach a full stdout
            _exit(f"rcdiag: error: cannot write stdout: {failed}", ExitCode.USAGE)
        sys.exit(result if isinstance(result, int) else ExitCode.OK)
    finally:
        interrupts.restore(previous)


def _fail(exc: BaseException, argv: list[str], *, program: bool = False) -> NoReturn:
    if interrupts.received() is not None or isinstance(exc, KeyboardInterrupt | interrupts.Aborted):
        _abort(program=program)  # whatever the exception became on its way up (numba: SystemError)
    if isinstance(exc, SystemExit):
        raise exc
    if isinstance(exc, RcdiagError):
        _exit(f"rcdiag: error: {printable(exc)}", exc.exit_code)  # text from a file never acts on the terminal
    if isinstance(exc, StdoutClosedError | BrokenPipeError):  # the reader of stdout went away (`| head`)
        stdout_gone()
        sys.exit(ExitCode.OK)
    # typer vendors click in recent releases, so click's exceptions are recognised by name.
    kinds = {cls.__name__ for cls in type(exc).__mro__}
    context = getattr(exc, "ctx", None)
    if "NoArgsIsHelpError" in kinds:  # typer has already printed the help
        _flush_stdout()
        sys.exit(ExitCode.OK)
    if "UsageError" in kinds:
        where = f" (see '{context.command_path} --help')" if context is not None else ""
        message = exc.format_message()  # type: ignore[attr-defined]
        file = _file_taken_as_option(getattr(exc, "option_name", None), argv) if "NoSuchOption" in kinds else None
        if file is not None:  # `rcdiag analyze -q.parquet`: click reads "-q" and "-."
            message = f"{file} was read as an option ({message}); to name a file, give it as ./{file}"
        _exit(f"rcdiag: error: {printable(message)}{where}", ExitCode.USAGE)
    if "Abort" in kinds:
        _abort(program=program)
    if isinstance(exc, OSError) and _writing_stdout(exc):  # a write rich or click made itself (`--help > /dev/full`)
        stdout_gone()
        _exit(f"rcdiag: error: cannot write stdout: {exc.strerror or exc}", ExitCode.USAGE)
    _exit(
        f"rcdiag: internal error: {type(exc).__name__}: {printable(exc)}. This is a bug in rcdiag {__version__}; "
        "please report it with the command you ran.",
        ExitCode.INTERNAL,
    )


def _file_taken_as_option(option: str | None, argv: list[str]) -> str | None:
    """The argument behind an unknown option ``option`` when it looks like a file: it ends in a suffix rcdiag reads
    (a dump's, a state's ``.json``) or names something on disk; ``None`` otherwise."""
    from rcdiag.io.registry import suffixes

    if not option:
        return None
    readable = (*suffixes(), ".json")
    for arg in argv[: argv.index("--")] if "--" in argv else argv:
        if len(arg) < 2 or not arg.startswith("-"):
            continue
        theirs = (
            arg == option
            or arg.startswith(option + "=")
            or (not option.startswith("--") and not arg.startswith("--") and option[1:] in arg[1:])
        )
        if theirs and (arg.lower().endswith(readable) or os.path.lexists(arg)):
            return arg
    return None


def _writing_stdout(exc: BaseException) -> bool:
    """Whether ``exc`` was raised writing to stdout: a frame of its traceback writes to ``sys.stdout`` (rich's
    console: ``self.file``; click's ``echo``: ``file``). rcdiag's own writes are checked where they are made."""
    tb = exc.__traceback__
    while tb is not None:
        names = tb.tb_frame.f_locals
        self = names.get("self")
        try:
            inner = getattr(self, "file", None)
        except Exception:  # a property of some other object that fails: not a stream
            inner = None
        if any(x is sys.stdout for x in (names.get("file"), self, inner)):
            return True
        tb = tb.tb_next
    return False


def _abort(*, program: bool = False) -> NoReturn:
    """Ctrl-C or SIGTERM: no partial output file, one line, 130 (143 for SIGTERM). In the program itself (``main``
    called without arguments) the process then ends at once (``interrupts.end_process``); a caller of ``main`` in
    its own process gets ``SystemExit``."""
    from rcdiag.io.outputs import remove_temporaries

    remove_temporaries()
    signum = interrupts.received()
    with contextlib.suppress(OSError, ValueError):
        print(interrupts.MESSAGE, file=sys.stderr, flush=True)
    atexit.register(_silence_stderr)  # registered last, so it runs before the libraries' exit handlers
    _flush_stdout()
    code = interrupts.exit_code(signum) if signum is not None else ExitCode.ABORTED
    if program:
        interrupts.end_process(code)
    sys.exit(code)


def _silence_stderr() -> None:
    """After an abort, what libraries' exit handlers say about a run cut short (Ray imported half-way) is noise."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stderr.fileno())


def _exit(line: str, code: int) -> NoReturn:
    with contextlib.suppress(OSError, ValueError):
        print(line, file=sys.stderr, flush=True)
    _flush_stdout()
    sys.exit(code)


def _flush_stdout() -> str | None:
    """Flush stdout now, so that a closed pipe (or a full disk) cannot fail the interpreter's final flush and
    change the exit code (``| head -1`` keeps a failing gate at 1); the reason of a failure other than a closed
    pipe (a full disk), else ``None``."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        stdout_gone()
    except OSError as exc:
        stdout_gone()
        return exc.strerror or str(exc)
    except ValueError:  # stdout already closed
        pass
    return None
