"""prime-rl's token exports, ``token_exports/step_*/rank_*.jsonl`` (one JSON object per sequence).

``trainer_logprobs`` are the trainer's log-probs, ``inference_logprobs`` the inference engine's and
``loss_mask`` the mask (false on prompt tokens); ``step`` is a field of every record (else the ``step_N``
directory name) and the per-token ``temperatures`` become the report's ``temperature``. The exporter writes every
non-finite float as JSON ``null`` (``_json_float``, ``src/prime_rl/trainer/rl/token_export.py:247-253`` at
PrimeIntellect-ai/prime-rl 559b4477): a null log-prob is read as NaN and counted (``JsonRecordsFile``).
"""

from __future__ import annotations

import re
from pathlib import Path

from rcdiag.io.base import ColumnMap
from rcdiag.io.json_records import JsonRecordsFile, first_keys

STEP_DIR = re.compile(r"^step_(\d+)$")
KEYS = {"trainer_logprobs", "inference_logprobs"}


def claims(path: Path) -> bool:
    """A prime-rl export: by its place under a ``token_exports`` directory, or by its keys."""
    return "token_exports" in path.parts or first_keys(path) >= KEYS


class PrimeRlFile(JsonRecordsFile):
    """One ``rank_*.jsonl`` export file."""

    def __init__(self, path: str | Path, columns: ColumnMap | None = None) -> None:
        match = STEP_DIR.match(Path(path).parent.name)
        super().__init__(
            path,
            columns,
            format="prime-rl",
            step=int(match.group(1)) if match else None,
            step_origin="directory name",
            null_floats=True,
        )
