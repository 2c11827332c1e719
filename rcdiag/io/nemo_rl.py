"""NeMo-RL's per-step training dumps, ``train_data_step{N}.jsonl`` (one JSON object per sample).

``prev_logprobs`` are the trainer's log-probs, ``generation_logprobs`` the rollout engine's; the mask is
``token_loss_mask`` times the per-sample ``sample_loss_mask``. Rows are padded to the batch's longest sequence
and hold the prompt too; the mask is 0 there. The step is the ``N`` of the file name.
"""

from __future__ import annotations

import re
from pathlib import Path

from rcdiag.io.base import ColumnMap
from rcdiag.io.json_records import JsonRecordsFile, first_keys

FILE_PATTERN = re.compile(r"train_data_step(\d+)\.jsonl$")
KEYS = {"prev_logprobs", "generation_logprobs"}


def claims(path: Path) -> bool:
    """A NeMo-RL training dump: by its file name, or by its keys."""
    return FILE_PATTERN.search(path.name) is not None or first_keys(path) >= KEYS


class NemoRlFile(JsonRecordsFile):
    """One ``train_data_step{N}.jsonl`` file."""

    def __init__(self, path: str | Path, columns: ColumnMap | None = None) -> None:
        match = FILE_PATTERN.search(Path(path).name)
        super().__init__(
            path,
            columns,
            format="nemo-rl",
            step=int(match.group(1)) if match else None,
            mask_factor="sample_loss_mask",
        )
