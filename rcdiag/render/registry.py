"""Every ``--format`` value and the renderer it uses for each kind of result, in one table.

A command names the kind of result it produces (``report``, ``comparison``, ``check``); a format that has no
renderer for that kind is refused before any file is read. A new output format is a renderer module and one line
in ``FORMATS``. Renderers are named as ``module:function`` so that ``rcdiag --help`` loads none of them.

A format with a ``flag`` (``--html FILE``, ``--png FILE``) is a picture written to its own file beside the
``--format`` output, not a ``--format`` value; one with an ``extra`` needs that optional extra's packages, and is
refused (exit 2, naming the extra) before anything is read when they are missing.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from rcdiag.runtime.errors import ConfigError

ResultKind = Literal["report", "comparison", "check", "sweep", "watch", "watch_line"]
"""``watch`` is the live view on a terminal (a screen object fed every event); ``watch_line`` one event as lines."""


@dataclass(frozen=True)
class Renderer:
    """``target`` is ``module:function``. A console renderer draws on a rich ``Console`` (terminal colours on a
    terminal, plain text in a file); any other returns the text."""

    target: str
    console: bool = False
    binary: bool = False
    """It returns bytes (a PNG), not text."""

    def load(self) -> Callable[..., Any]:
        module, name = self.target.split(":")
        return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Format:
    """One ``--format`` value: what it writes (for ``--help``) and its renderer for each kind of result."""

    description: str
    renderers: dict[ResultKind, Renderer]
    flag: str | None = None
    """``--html``: written to the file this flag names, in addition to the ``--format`` output."""
    extra: str | None = None
    """The optional extra (``pip install "rcdiag[EXTRA]"``) whose packages the renderers import."""
    module: str | None = None
    """The package ``extra`` provides, checked (without importing it) when the flag is given."""


_JSON = Renderer("rcdiag.render:render_json")

FORMATS: dict[str, Format] = {
    "table": Format(
        "terminal tables",
        {
            "report": Renderer("rcdiag.render.table:render_table", console=True),
            "comparison": Renderer("rcdiag.render.compare_table:render_comparison", console=True),
            "check": Renderer("rcdiag.render.check_table:render_check", console=True),
            "sweep": Renderer("rcdiag.render.sweep_table:render_sweep", console=True),
            "watch": Renderer("rcdiag.render.watch_table:WatchScreen", console=True),
            "watch_line": Renderer("rcdiag.render.watch_table:text_line"),
        },
    ),
    "json": Format(
        "one JSON object",
        {
            "report": _JSON,
            "comparison": _JSON,
            "check": _JSON,
            "sweep": _JSON,
            "watch_line": Renderer("rcdiag.render.watch_table:json_line"),
        },
    ),
    "html": Format(
        "a self-contained HTML report (findings, charts as inline SVG, tables; opens offline)",
        {
            "report": Renderer("rcdiag.render.html:render_html"),
            "comparison": Renderer("rcdiag.render.html:render_comparison_html"),
            "sweep": Renderer("rcdiag.render.html:render_sweep_html"),
        },
        flag="--html",
        extra="plot",
        module="matplotlib",
    ),
    "png": Format(
        "the six-panel dashboard over steps (IS mean, ESS, RS rejected share, kl vs k3_kl, PPL ratio, chi2) as a "
        "1920x1200 PNG",
        {"report": Renderer("rcdiag.render.dashboard:render_png", binary=True)},
        flag="--png",
        extra="plot",
        module="matplotlib",
    ),
}
"""Every output format -> what it writes and its renderer for each kind of result it can write."""


def format_names() -> list[str]:
    """``--format`` values (formats without their own flag)."""
    return [name for name, fmt in FORMATS.items() if fmt.flag is None]


def pictures(kind: ResultKind) -> dict[str, Format]:
    """Formats written by their own flag that can render ``kind``."""
    return {name: fmt for name, fmt in FORMATS.items() if fmt.flag is not None and kind in fmt.renderers}


def check_extra(fmt: Format) -> None:
    """``ConfigError`` naming the extra to install when a format's plotting package is missing (found without
    importing it, so this costs nothing)."""
    import importlib.util

    if fmt.module is not None and importlib.util.find_spec(fmt.module) is None:
        raise ConfigError(f'{fmt.flag} needs {fmt.module}, which is not installed: pip install "rcdiag[{fmt.extra}]".')


def renderer(name: str, kind: ResultKind, command: str) -> Renderer:
    """The renderer of format ``name`` for ``kind``; ``ConfigError`` when the format cannot write that kind."""
    if name not in format_names():
        raise ConfigError(f"unknown --format '{name}'; use one of {', '.join(format_names())}.")
    found = FORMATS[name].renderers.get(kind)
    if found is None:
        usable = ", ".join(f for f in format_names() if kind in FORMATS[f].renderers)
        raise ConfigError(f"rcdiag {command} cannot write --format {name}; it writes {usable}.")
    return found
