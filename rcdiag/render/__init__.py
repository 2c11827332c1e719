"""Renderers: a ``Report`` -> text. One module per output format; ``OutputFormat`` lists them."""

from __future__ import annotations

import enum
import json

from rcdiag.report import Report


@enum.unique
class OutputFormat(str, enum.Enum):
    """``--format`` choices."""

    table = "table"
    json = "json"

    def __str__(self) -> str:
        return self.value


def render_json(report: Report) -> str:
    """The report as one JSON object (schema: docs/json.md); non-finite numbers are ``null``."""
    return json.dumps(report.to_dict(), indent=2, allow_nan=False) + "\n"
