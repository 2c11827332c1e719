"""Dicts of arrays (from ``.pt`` or ``.npz`` files) -> one Arrow record batch.

* a 2-D array (responses x padded length) becomes a fixed-size list column: padding must carry mask 0;
* a list of 1-D arrays or lists (ragged, as slime keeps them) becomes a list column;
* a 1-D array becomes a scalar column: per-response (``step``) or, for log-probs, per-token (the long layout);
* a 0-d value is a fact about the whole file: a step (``step``, ``global_step``, ``rollout_id``) or run metadata.

Without a step column or 0-d step, the file name gives the step (``step_3.pt``, ``global_step-3.npz``), so the
files of ``torch.save(dict(batch.batch), f"step_{n}.pt")`` keep their steps; a file name that disagrees with the
step inside the file is an error, never a silent choice.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from rcdiag.io.base import ColumnMap
from rcdiag.io.record_batches import Batch
from rcdiag.io.tables import METADATA_COLUMNS, TableFile
from rcdiag.runtime.errors import InputError

FILE_STEP_KEYS = ("step", "global_step", "rollout_id")
NAME_STEP = re.compile(r"step[_-]?(\d+)", re.IGNORECASE)


def name_step(path: str) -> int | None:
    """The step a file name states (the last ``step<N>``, ``step_<N>`` or ``step-<N>`` of its stem), if any."""
    found = NAME_STEP.findall(Path(path).stem)
    return int(found[-1]) if found else None


def to_arrow(value: np.ndarray | list) -> pa.Array | None:
    """An Arrow column for one entry, or ``None`` when it is not array data we can use."""
    if isinstance(value, list):
        if not value or not all(isinstance(v, np.ndarray) and v.ndim == 1 for v in value):
            return None
        lengths = np.array([v.shape[0] for v in value], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(np.concatenate(value)))
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "biuf":
        return None
    if value.ndim == 1:
        return pa.array(value)
    if value.ndim == 2 and value.shape[1] == 0:  # rows of no tokens (Arrow builds no width-0 list from values)
        return pa.array([[]] * value.shape[0], type=pa.list_(pa.from_numpy_dtype(value.dtype), 0))
    if value.ndim == 2:
        return pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(value).reshape(-1)), value.shape[1])
    return None


class TensorFile(TableFile):
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
        name = str(path)
        self.load = load
        arrays, scalars = load(name)
        columns_found = _columns(arrays, name)
        key = next((k for k in FILE_STEP_KEYS if isinstance(scalars.get(k), (int, np.integer))), None)
        self.name_step = name_step(name)
        if key is not None and self.name_step is not None and int(scalars[key]) != self.name_step:
            raise InputError(
                f"is named for step {self.name_step} but holds {key}={int(scalars[key])}; rename the file or fix "
                f"'{key}' so that they agree",
                path=name,
            )
        super().__init__(
            name,
            columns,
            format=format,
            schema=pa.schema([(n, column.type) for n, column in columns_found.items()]),
            kv_metadata={
                METADATA_COLUMNS[k]: str(v) for k, v in scalars.items() if k in METADATA_COLUMNS and v is not None
            },
            step=int(scalars[key]) if key is not None else self.name_step,
            step_origin=f"key '{key}'" if key is not None else "file name",
            extra_aliases=extra_aliases,
        )
        sizes = {n: len(columns_found[n]) for n in self.read_columns()}
        if len(set(sizes.values())) > 1:
            listed = ", ".join(f"'{n}': {size}" for n, size in sizes.items())
            raise InputError(
                f"holds arrays with different numbers of rows ({listed}); every array needs one row per response "
                "(or, in the long layout, one per token)",
                path=name,
            )
        rows = next(iter(sizes.values()))
        if rows == 0:
            raise InputError("has no rows: there is nothing to analyze", path=name)
        self.total_rows = rows

    def batches(self, chunk_tokens: int, columns: list[str], part: Any = None) -> Iterator[Batch]:
        arrays, _ = self.load(self.path)
        data = {name: to_arrow(arrays[name]) for name in columns}
        old = data[self.cols.old]
        assert old is not None  # the log-prob columns were checked to be arrays when the file was opened
        rows = len(old)
        data = {name: column for name, column in data.items() if column is not None and len(column) == rows}
        if self.cols.step is not None and self.name_step is not None:
            self._check_step_column(data[self.cols.step])
        yield Batch(pa.RecordBatch.from_pydict(data), self.path, 0, self.step)

    def _check_step_column(self, column: pa.Array) -> None:
        steps = column.to_numpy(zero_copy_only=False)
        differ = np.flatnonzero(steps != self.name_step)
        if differ.size:
            raise InputError(
                f"holds step {steps[differ[0]]} but the file is named for step {self.name_step}; rename the file or "
                "fix the step column so that they agree",
                path=self.path,
                row=int(differ[0]) if not self.long else None,
                column=self.cols.step,
            )


def _columns(arrays: Mapping[str, Any], path: str) -> dict[str, pa.Array]:
    columns = {name: column for name, value in arrays.items() if (column := to_arrow(value)) is not None}
    if not columns:
        raise InputError(
            f"holds no numeric arrays (keys: {', '.join(map(str, arrays)) or 'none'}); save a dict of tensors "
            "such as old_log_probs, rollout_log_probs and response_mask",
            path=path,
        )
    return columns
