"""Dicts of arrays (from ``.pt`` or ``.npz`` files) -> one Arrow record batch.

* a 2-D array (responses x padded length) becomes a fixed-size list column: padding must carry mask 0;
* a list of 1-D arrays or lists (ragged, as slime keeps them) becomes a list column;
* a 1-D array becomes a scalar column: per-response (``step``) or, for log-probs, per-token (the long layout);
* a 0-d value is a fact about the whole file: a step (``step``, ``global_step``, ``rollout_id``) or run metadata.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from rcdiag.errors import InputError
from rcdiag.io.base import ColumnMap
from rcdiag.io.tables import METADATA_COLUMNS, Batch, TableSource

FILE_STEP_KEYS = ("step", "global_step", "rollout_id")


def to_arrow(value: np.ndarray | list) -> pa.Array | None:
    """An Arrow column for one entry, or ``None`` when it is not array data we can use."""
    if isinstance(value, list):
        if not value or not all(isinstance(v, np.ndarray) and v.ndim == 1 for v in value):
            return None
        lengths = np.array([v.shape[0] for v in value], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        flat = np.concatenate(value) if value else np.zeros(0)
        return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(flat))
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "biuf":
        return None
    if value.ndim == 1:
        return pa.array(value)
    if value.ndim == 2:
        return pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(value).reshape(-1)), value.shape[1])
    return None


class TensorSource(TableSource):
    """A file holding a dict of arrays; ``load`` returns ``(arrays, file-level scalars)`` as numpy."""

    def __init__(
        self,
        path: str | Path,
        columns: ColumnMap | None,
        *,
        format: str,
        load: Callable[[str], tuple[dict[str, Any], dict[str, Any]]],
        extra_aliases: dict[str, tuple[str, ...]] | None = None,
    ) -> None:
        self.path = str(path)
        self.format = format
        self.load = load
        self.extra_aliases = extra_aliases
        arrays, scalars = load(self.path)
        columns_found = _columns(arrays, self.path)
        self.schema = pa.schema([(name, column.type) for name, column in columns_found.items()])
        self.total_rows = None
        self.kv_metadata = {
            METADATA_COLUMNS[k]: str(v) for k, v in scalars.items() if k in METADATA_COLUMNS and v is not None
        }
        step = next((scalars[k] for k in FILE_STEP_KEYS if isinstance(scalars.get(k), (int, np.integer))), None)
        self.step_value = None if step is None else int(step)
        self.file_step = self.step_value is not None
        self.setup(columns)
        sizes = {name: len(columns_found[name]) for name in self.read_columns()}
        if len(set(sizes.values())) > 1:
            listed = ", ".join(f"'{n}': {size}" for n, size in sizes.items())
            raise InputError(
                f"holds arrays with different numbers of rows ({listed}); every array needs one row per response "
                "(or, in the long layout, one per token)",
                path=self.path,
            )
        self.total_rows = next(iter(sizes.values()))
        if self.total_rows == 0:
            raise InputError("has no rows: there is nothing to analyze", path=self.path)
        self.info.total_rows = None if self.long else self.total_rows

    def batches(self, chunk_tokens: int, columns: list[str]) -> Iterator[Batch]:
        arrays, _ = self.load(self.path)
        data = {name: to_arrow(arrays[name]) for name in columns}
        rows = len(data[self.cols.old])
        data = {name: column for name, column in data.items() if column is not None and len(column) == rows}
        yield Batch(pa.RecordBatch.from_pydict(data), self.path, 0, self.step_value)


def _columns(arrays: Mapping[str, Any], path: str) -> dict[str, pa.Array]:
    columns = {name: column for name, value in arrays.items() if (column := to_arrow(value)) is not None}
    if not columns:
        raise InputError(
            f"holds no numeric arrays (keys: {', '.join(map(str, arrays)) or 'none'}); save a dict of tensors "
            "such as old_log_probs, rollout_log_probs and response_mask",
            path=path,
        )
    return columns
