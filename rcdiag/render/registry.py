"""Every ``--format`` value and the renderer it uses for each kind of result, in one table.

A command names the kind of result it produces (``report``, ``comparison``, ``check``); a format that has no
renderer for that kind is refused before any file is read. A new output format is a renderer module and one line
in ``FORMATS``. Renderers are named as ``module:function`` so that ``rcdiag --help`` loads none of them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from rcdiag.errors import ConfigError

ResultKind = Literal["report", "comparison", "check", "sweep"]


@dataclass(frozen=True)
class Renderer:
    """``target`` is ``module:function``. A console renderer draws on a rich ``Console`` (terminal colours on a
    terminal, plain text in a file); any other returns the text."""

    target: str
    console: bool = False

    def load(self) -> Callable[..., Any]:
        module, name = self.target.split(":")
        return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Format:
    """One ``--format`` value: what it writes (for ``--help``) and its renderer for each kind of result."""

    description: str
    renderers: dict[ResultKind, Renderer]


_JSON = Renderer("rcdiag.render:render_json")

FORMATS: dict[str, Format] = {
    "table": Format(
        "terminal tables",
        {
            "report": Renderer("rcdiag.render.table:render_table", console=True),
            "comparison": Renderer("rcdiag.render.compare_table:render_comparison", console=True),
            "check": Renderer("rcdiag.render.check_table:render_check", console=True),
            "sweep": Renderer("rcdiag.render.sweep_table:render_sweep", console=True),
        },
    ),
    "json": Format("one JSON object", {"report": _JSON, "comparison": _JSON, "check": _JSON, "sweep": _JSON}),
}
"""``--format`` value -> the format, with the renderer for each kind of result it can write."""


def renderer(name: str, kind: ResultKind, command: str) -> Renderer:
    """The renderer of format ``name`` for ``kind``; ``ConfigError`` when the format cannot write that kind."""
    if name not in FORMATS:
        raise ConfigError(f"unknown --format '{name}'; use one of {', '.join(FORMATS)}.")
    found = FORMATS[name].renderers.get(kind)
    if found is None:
        usable = ", ".join(f for f, fmt in FORMATS.items() if kind in fmt.renderers)
        raise ConfigError(f"rcdiag {command} cannot write --format {name}; it writes {usable}.")
    return found
