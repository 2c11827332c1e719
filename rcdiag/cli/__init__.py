"""The ``rcdiag`` command line: parse, call the library, render. Nothing else lives here.

``main`` is the console-script entry point. It turns every user error into one line on stderr and the
documented exit code (2), and any other exception into exit code 3 with a hint to report it; it never shows
a traceback.
"""

from __future__ import annotations

import os
import sys

import typer

from rcdiag._version import __version__
from rcdiag.cli.analyze import analyze
from rcdiag.cli.check import check
from rcdiag.cli.compare import compare
from rcdiag.cli.merge import merge
from rcdiag.cli.notices import notices_live_warnings_held, show_held
from rcdiag.cli.output import StdoutClosedError
from rcdiag.cli.presets import presets
from rcdiag.cli.sweep import sweep
from rcdiag.errors import ExitCode, RcdiagError
from rcdiag.printable import printable

app = typer.Typer(
    name="rcdiag",
    help="Diagnose training-inference mismatch in LLM RL from saved log-prob dumps, with verl's rollout "
    "correction metrics (IS weights, RS masks, kl, k3_kl, chi2, ESS, PPL).",
    no_args_is_help=True,
    rich_markup_mode="markdown",
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        print(f"rcdiag {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Diagnose training-inference mismatch in LLM RL from saved log-prob dumps."""


app.command(no_args_is_help=True)(analyze)
app.command(no_args_is_help=True)(compare)
app.command(no_args_is_help=True)(check)
app.command(no_args_is_help=True)(merge)
app.command(no_args_is_help=True)(sweep)
app.command()(presets)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI and exit with rcdiag's documented exit codes."""
    try:
        # a library's warning (numpy, torch) must not precede the one error line: shown only after a success
        with notices_live_warnings_held() as held:
            result = typer.main.get_command(app).main(args=argv, prog_name="rcdiag", standalone_mode=False)
    except RcdiagError as exc:
        print(f"rcdiag: error: {printable(exc)}", file=sys.stderr)  # text from a file never acts on the terminal
        sys.exit(exc.exit_code)
    except (StdoutClosedError, BrokenPipeError):  # the reader of stdout went away (`| head`): nothing more to say
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush does not complain
        sys.exit(ExitCode.OK)
    except Exception as exc:
        # typer vendors click in recent releases, so click's exceptions are recognised by name.
        kinds = {cls.__name__ for cls in type(exc).__mro__}
        context = getattr(exc, "ctx", None)
        if "NoArgsIsHelpError" in kinds:  # typer has already printed the help
            sys.exit(ExitCode.OK)
        if "UsageError" in kinds:
            where = f" (see '{context.command_path} --help')" if context is not None else ""
            print(f"rcdiag: error: {printable(exc.format_message())}{where}", file=sys.stderr)  # type: ignore[attr-defined]
            sys.exit(ExitCode.USAGE)
        if "Abort" in kinds:
            print("rcdiag: aborted", file=sys.stderr)
            sys.exit(ExitCode.USAGE)
        print(
            f"rcdiag: internal error: {type(exc).__name__}: {printable(exc)}. This is a bug in rcdiag {__version__}; "
            "please report it with the command you ran.",
            file=sys.stderr,
        )
        sys.exit(ExitCode.INTERNAL)
    show_held(held)
    sys.exit(result if isinstance(result, int) else ExitCode.OK)
