"""Renderers: a result (a ``Report``, a ``Comparison``, a ``CheckResult``) -> text. One module per output format;
``rcdiag.render.registry`` maps every ``--format`` value to its renderer for each kind of result."""

from __future__ import annotations

import json
from typing import Any, Protocol


class Serialisable(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


def render_json(result: Serialisable) -> str:
    """Any result as one JSON object (schemas: docs/json.md, compare.md, check.md); non-finite numbers are
    ``null``."""
    return json.dumps(result.to_dict(), indent=2, allow_nan=False) + "\n"


def counted(count: int, noun: str) -> str:
    """``1 step``, ``6 steps``, ``1,024 rows``: a count with its noun in the right number."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"
