"""The command line builds a sub-command only when it is asked for (rcdiag.cli.commands) and gives the root its own
``--help`` flag; what users see must be what typer shows for the whole command tree built at once, the way
rcdiag built it before (every command registered on one Typer, click's own ``--help``): every help screen, plain
and coloured, and the lines of usage errors."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT

from rcdiag.cli.commands import COMMANDS

EAGER = """
import sys
import typer
import rcdiag.cli as cli
from rcdiag.cli.commands import COMMANDS, HELP_NAMES, Command, Group, command_function

eager = typer.Typer(name="rcdiag", help=cli.app.info.help, no_args_is_help=True, rich_markup_mode="markdown",
                    pretty_exceptions_enable=False, add_completion=False, cls=Group,
                    context_settings={"help_option_names": HELP_NAMES})

@eager.callback()
def _root(version: bool = typer.Option(False, "--version", callback=cli._version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    pass

_root.__doc__ = cli._root.__doc__
for name in COMMANDS:
    eager.command(cls=Command)(command_function(name))
typer.main.get_command(eager).main(args=sys.argv[1:], prog_name="rcdiag", standalone_mode=False)
"""
"""Typer's own rendering of the whole tree, built at once as rcdiag built it before (with rcdiag's help layout:
``Group`` and ``Command``, and ``-h`` beside ``--help``)."""

HELP_SCREENS = [["--help"], ["-h"], *([name, "--help"] for name in COMMANDS), *([name, "-h"] for name in COMMANDS)]


def _env(color: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "TERMINAL_WIDTH")}
    return env | {"COLUMNS": "100", "FORCE_COLOR" if color else "NO_COLOR": "1"}


def _eager(args: list[str], color: bool) -> str:
    done = subprocess.run(
        [sys.executable, "-c", EAGER, *args], capture_output=True, text=True, cwd=ROOT, env=_env(color)
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _lazy(args: list[str], color: bool) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rcdiag", *args], capture_output=True, text=True, cwd=ROOT, env=_env(color)
    )


@pytest.mark.parametrize("color", [False, True], ids=["plain", "color"])
@pytest.mark.parametrize("args", HELP_SCREENS, ids=" ".join)
def test_help_is_typers_own_rendering_of_the_whole_tree(args: list[str], color: bool) -> None:
    lazy = _lazy(args, color)
    assert lazy.returncode == 0 and lazy.stderr == ""
    assert "Usage" in lazy.stdout and "help" in lazy.stdout and ("\x1b[" in lazy.stdout) == color
    assert lazy.stdout == _eager(args, color)


def test_no_arguments_show_the_help() -> None:
    """``rcdiag`` alone; a command without its arguments is a usage error (tests/cli/test_new_user_cli.py)."""
    done = _lazy([], color=False)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.rstrip("\n") == _lazy(["--help"], color=False).stdout.rstrip("\n")


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["analyse", "x"], "rcdiag: error: No such command 'analyse'. Did you mean 'analyze'? (see 'rcdiag --help')"),
        (["nosuch"], "rcdiag: error: No such command 'nosuch'. (see 'rcdiag --help')"),
        (["--bogus"], "rcdiag: error: No such option: --bogus (see 'rcdiag --help')"),
        (["analyze", "--bogus"], "rcdiag: error: No such option: --bogus (see 'rcdiag analyze --help')"),
        (["presets", "--verl-version", "0.0.1"], None),
    ],
)
def test_usage_errors_are_one_line(args: list[str], line: str | None) -> None:
    done = _lazy(args, color=False)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("rcdiag: error: "), done.stderr
    if line is not None:
        assert done.stderr == line + "\n"


def test_version_wins_over_help_in_the_order_given() -> None:
    version = _lazy(["--version"], color=False).stdout
    assert version.startswith("rcdiag ") and version.count("\n") == 1
    assert _lazy(["--version", "--help"], color=False).stdout == version
    assert _lazy(["--help", "--version"], color=False).stdout == _lazy(["--help"], color=False).stdout
    assert _lazy(["--version", "analyze"], color=False).stdout == version


def test_the_command_tree_lists_every_command_in_order() -> None:
    import typer

    from rcdiag.cli import app

    group = typer.main.get_command(app)
    assert list(group.commands) == list(COMMANDS)  # type: ignore[attr-defined]
    assert [c.name for c in group.commands.values()] == list(COMMANDS)  # type: ignore[attr-defined]
    assert "nosuch" not in group.commands  # type: ignore[attr-defined]


def test_garbage_collection_is_paused_while_the_command_line_starts(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Off while typer parses, on (with the start-up's objects frozen) while the command runs, and as it was after
    ``main`` returns, whatever way it leaves."""
    import functools
    import gc

    import rcdiag.cli.presets as module
    from rcdiag.cli import main

    seen = []
    command = module.presets

    @functools.wraps(command)
    def spy(*args: object, **kwargs: object) -> None:
        seen.append((gc.isenabled(), gc.get_freeze_count() > 0))
        command(*args, **kwargs)

    monkeypatch.setattr(module, "presets", spy)
    assert gc.isenabled() and gc.get_freeze_count() == 0
    for args, code in ((["presets"], 0), (["presets", "--bogus"], 2), (["--help"], 0)):
        with pytest.raises(SystemExit) as info:
            main(args)
        assert (info.value.code or 0) == code
        assert gc.isenabled() and gc.get_freeze_count() == 0
    assert seen == [(True, True)]
    capsys.readouterr()
    gc.disable()
    try:
        with pytest.raises(SystemExit):
            main(["presets"])
        assert not gc.isenabled() and gc.get_freeze_count() == 0  # left off by the caller: stays off
    finally:
        gc.enable()
