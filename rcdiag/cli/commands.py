"""rcdiag's sub-commands, each built when first asked for: a run or ``rcdiag CMD --help`` imports one command's
module and turns one signature into click parameters, not all eight. Each is built as typer builds a command of a
group (``typer.main.get_command`` of a Typer that holds that command alone), so its help and behaviour are those of
the eager build (tests/cli/test_cli_lazy.py). ``rcdiag --help`` lists every command by its name and help alone, so it
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

COMMANDS = ("analyze", "compare", "check", "merge", "sweep", "presets", "translate", "watch")
"""The sub-commands, in the order ``rcdiag --help`` lists them; each is the function of that name in
``rcdiag.cli.<name>``. None shows its help when its arguments are missing: a missing PATH is a usage error (exit 2,
one line), as in every command; ``rcdiag`` alone (no command) shows the help."""
HELP_NAMES = ["-h", "--help"]
"""The help flag's names, in every command (``context_settings``, which each sub-command's context inherits)."""


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


def bare_flags(params: list[Any]) -> None:
    """Flags shown without a value placeholder: typer 0.29's help panels print a flag's type (``--explain
    <bool>``, ``--help <bool>``) as if it took a value, unless it has a metavar; an empty one prints nothing. A
    flag's metavar is read nowhere else (click names an option by its flags in errors)."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""


def usage_name(param: Any) -> str:
    """An argument on the usage line as click writes it: ``PATH`` (required), ``[PATH]`` (optional), ``STATE...``
    (any number); typer 0.29 writes a required one ``{PATH}``."""
    name = str(param.metavar or (param.name or "").upper())
    name += "..." if param.nargs != 1 else ""
    return name if param.required else f"[{name}]"


class Group(typer.core.TyperGroup):
    """typer's group, its flags shown as flags (``bare_flags``)."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        bare_flags(self.get_params(ctx))
        return super().format_help(ctx, formatter)


class Command(typer.core.TyperCommand):
    """typer's command, its flags shown as flags and its arguments on the usage line as click writes them
    (``bare_flags``, ``usage_name``); garbage collection resumes when it runs."""

    def invoke(self, ctx: Any) -> Any:
        resume_collection()
        return super().invoke(ctx)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        bare_flags(self.get_params(ctx))
        return super().format_help(ctx, formatter)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            pieces += [usage_name(param)] if param.param_type_name == "argument" else param.get_usage_pieces(ctx)
        return pieces


def build(name: str, markup: Literal["markdown", "rich"]) -> Any:
    """The click command of ``rcdiag NAME``, as typer builds it in a group whose ``rich_markup_mode`` is
    ``markup``."""
    single = typer.Typer(rich_markup_mode=markup, pretty_exceptions_enable=False, add_completion=False)
    single.command(cls=Command)(command_function(name))
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
    return Command(name=name, help=help_text, rich_markup_mode=markup)


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
