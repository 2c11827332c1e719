"""The flags of a rule set (``rcdiag.check.rule_set``), declared once for the two commands that gate on one, ``check``
and ``watch``: each command gives its own words and panel."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer


def bound_option(flag: str, help_text: str, panel: str) -> Any:
    """A repeatable ``NAME=VALUE`` bound (``--max``, ``--min``, ...)."""
    return Annotated[
        list[str] | None,
        typer.Option(flag, metavar="NAME=VALUE", help=help_text, rich_help_panel=panel, show_default=False),
    ]


def pack_option(help_text: str, panel: str) -> Any:
    """``--pack NAME``, repeatable."""
    return Annotated[
        list[str] | None,
        typer.Option("--pack", metavar="NAME", help=help_text, rich_help_panel=panel, show_default=False),
    ]


def fail_on_option(help_text: str, panel: str) -> Any:
    """``--fail-on SEVERITY|CODES``, repeatable."""
    return Annotated[
        list[str] | None,
        typer.Option("--fail-on", metavar="SEVERITY|CODES", help=help_text, rich_help_panel=panel, show_default=False),
    ]


def rules_option(help_text: str, panel: str) -> Any:
    """``--rules FILE``, a TOML rules file."""
    return Annotated[
        Path | None,
        typer.Option("--rules", metavar="FILE", help=help_text, rich_help_panel=panel, show_default=False),
    ]
