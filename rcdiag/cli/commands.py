"""rcdiag's sub-commands, each built when first asked for: a run or ``rcdiag CMD --help`` imports one command's
module and turns one signature into click parameters, not all seven (``rcdiag --help`` lists them all, so it still
builds every one). Each is built as typer builds a command of a group (``typer.main.get_command`` of a Typer that
holds that command alone), so its help and behaviour are those of the eager build (tests/test_cli_lazy.py).

While the command line starts, the cyclic garbage collector is off: imports, typer and its option checks allocate
a few hundred thousand objects that live as long as the process, and each full collection would walk them all.
When the command starts, they are frozen out of later collections (``gc.freeze``) and collection resumes."""

from __future__ import annotations

import gc
import importlib
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


class LazyCommands(Mapping[str, Any]):
    """A group's ``commands``: names known at once (for listing and typo suggestions), each command built on first
    access and kept."""

    def __init__(self, markup: Literal["markdown", "rich"]) -> None:
        self._markup = markup
        self._built: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in COMMANDS:
            raise KeyError(name)
        if name not in self._built:
            self._built[name] = build(name, self._markup)
        return self._built[name]

    def __iter__(self) -> Iterator[str]:
        return iter(COMMANDS)

    def __len__(self) -> int:
        return len(COMMANDS)
