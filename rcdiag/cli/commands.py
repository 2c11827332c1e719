"""rcdiag's sub-commands, each built when first asked for: a run or ``rcdiag CMD --help`` imports one command's
module and turns one signature into click parameters, not all seven. Each is built as typer builds a command of a
group (``typer.main.get_command`` of a Typer that holds that command alone), so its help and behaviour are those of
the eager build (tests/test_cli_lazy.py). ``rcdiag --help`` lists every command by its name and help alone, so it
reads each one's docstring from its module's source (``listed``) and builds none (building the seven was over half
of its time).

While the command line starts, the cyclic garbage collector is off: imports, typer and its option checks allocate
a few hundred thousand objects that live as long as the process, and each full collection would walk them all.
When the command starts, they are frozen out of later collections (``gc.freeze``) and collection resumes."""

from __future__ import annotations

import ast
import gc
import importlib
import importlib.util
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal

import typer

COMMANDS = {
    "analyze": True,
    "compare": True,
    "check": True,
    "merge": True,
    "sweep": True,
    "presets": False,
    "watch": True,
}
"""Sub-command -> whether it shows its help when given no arguments, in the order ``rcdiag --help`` lists them.
Each is the function of that name in ``rcdiag.cli.<name>``."""


def command_function(name: str) -> Any:
    """The function behind ``rcdiag NAME``."""
    return getattr(importlib.import_module(f"rcdiag.cli.{name}"), name)


_paused = {"collection": False, "frozen": False}


@contextmanager
def collection_paused() -> Iterator[None]:
    """The cyclic garbage collector off until a command starts (``resume_collection``); on the way out, what was
    frozen is thawed and the collector is as it was."""
    was_enabled = gc.isenabled()
    gc.disable()
    _paused["collection"] = was_enabled
    try:
        yield
    finally:
        _paused["collection"] = False
        if _paused["frozen"]:
            _paused["frozen"] = False
            gc.unfreeze()
        if was_enabled:
            gc.enable()


def resume_collection() -> None:
    """A command starts: what the start-up allocated is frozen, and collection resumes."""
    if _paused["collection"]:
        _paused["collection"] = False
        gc.freeze()
        _paused["frozen"] = True
        gc.enable()


class Command(typer.core.TyperCommand):
    """typer's command; garbage collection resumes when it runs."""

    def invoke(self, ctx: Any) -> Any:
        resume_collection()
        return super().invoke(ctx)


def build(name: str, markup: Literal["markdown", "rich"]) -> Any:
    """The click command of ``rcdiag NAME``, as typer builds it in a group whose ``rich_markup_mode`` is
    ``markup``."""
    single = typer.Typer(rich_markup_mode=markup, pretty_exceptions_enable=False, add_completion=False)
    single.command(cls=Command, no_args_is_help=COMMANDS[name])(command_function(name))
    return typer.main.get_command(single)


def listed(name: str, markup: Literal["markdown", "rich"]) -> Any | None:
    """``rcdiag NAME`` as a group's help lists it: a command without parameters whose name, help and settings are
    those ``build`` gives it, the help being its function's docstring read from the module's source (typer takes
    ``inspect.getdoc`` of the function, which ``functools.wraps`` carries through ``with_flags``). None when the
    source or a literal docstring cannot be found (the caller builds the command)."""
    spec = importlib.util.find_spec(f"rcdiag.cli.{name}")
    get_source = getattr(spec.loader, "get_source", None) if spec is not None else None
    source = get_source(f"rcdiag.cli.{name}") if get_source is not None else None
    if not source:
        return None
    functions = (node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef) and node.name == name)
    function = next(functions, None)
    help_text = ast.get_docstring(function) if function is not None else None
    if help_text is None:
        return None
    return Command(name=name, help=help_text, no_args_is_help=COMMANDS[name], rich_markup_mode=markup)


class LazyCommands(Mapping[str, Any]):
    """A group's ``commands``: names known at once (for listing and typo suggestions), each command built on first
    access and kept; while the group's help is drawn (``listing``), a command not built yet is its ``listed``
    stand-in."""

    def __init__(self, markup: Literal["markdown", "rich"]) -> None:
        self._markup = markup
        self._built: dict[str, Any] = {}
        self._listing = False

    @contextmanager
    def listing(self) -> Iterator[None]:
        """While the group's help lists the commands."""
        self._listing = True
        try:
            yield
        finally:
            self._listing = False

    def __getitem__(self, name: str) -> Any:
        if name not in COMMANDS:
            raise KeyError(name)
        if name not in self._built:
            stand_in = listed(name, self._markup) if self._listing else None
            if stand_in is not None:
                return stand_in
            self._built[name] = build(name, self._markup)
        return self._built[name]

    def __iter__(self) -> Iterator[str]:
        return iter(COMMANDS)

    def __len__(self) -> int:
        return len(COMMANDS)
