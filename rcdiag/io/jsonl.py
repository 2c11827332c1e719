"""Other JSON Lines dumps: one JSON object per response with list-valued log-prob keys."""

from __future__ import annotations

from pathlib import Path

from rcdiag.io.base import ColumnMap
from rcdiag.io.json_records import JsonRecordsFile


class JsonlFile(JsonRecordsFile):
    """One ``.jsonl`` file of no known trainer."""

    def __init__(self, path: str | Path, columns: ColumnMap | None = None) -> None:
        super().__init__(path, columns, format="jsonl")
