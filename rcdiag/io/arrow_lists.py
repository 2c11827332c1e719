"""Turning Arrow list columns into flat numpy values + offsets, with one clear error per problem."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from rcdiag.runtime.errors import InputError

_LIST_TYPES = (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list)


def is_list_type(arrow_type: pa.DataType) -> bool:
    """A list, large list or fixed-size list type."""
    return any(check(arrow_type) for check in _LIST_TYPES)


def _first_null_row(array: pa.Array) -> int:
    return int(np.flatnonzero(~np.asarray(array.is_valid()))[0])


def flatten_list(array: pa.Array, column: str, path: str, first_row: int) -> tuple[np.ndarray, pa.Array]:
    """``(offsets from 0, flat child values)`` of a list array; nulls are an ``InputError``."""
    if array.null_count:
        raise InputError(
            "is null; every response needs a list (use an empty list for an empty response)",
            path=path,
            row=first_row + _first_null_row(array),
            column=column,
        )
    if pa.types.is_fixed_size_list(array.type):
        size = array.type.list_size
        offsets = np.arange(len(array) + 1, dtype=np.int64) * size
        start = array.offset * size
        values = array.values.slice(start, len(array) * size)
    else:
        raw = np.asarray(array.offsets, dtype=np.int64)
        values = array.values.slice(int(raw[0]), int(raw[-1] - raw[0]))
        offsets = raw - raw[0]
    if values.null_count:
        flat_index = _first_null_row(values)
        row = int(np.searchsorted(offsets, flat_index, side="right") - 1)
        raise InputError(
            f"has a null value at position {flat_index - int(offsets[row])} of the list",
            path=path,
            row=first_row + row,
            column=column,
        )
    return offsets, values


def float_values(values: pa.Array) -> np.ndarray:
    """Flat float32 numpy values (zero-copy when the column is already float32). A float64 value beyond float32's
    range becomes +-inf, as float32 arithmetic (verl's) would make it (docs/input.md: -1e300 is read as -inf, a
    probability 0; +1e300 as +inf, refused by the screen), without numpy's overflow warning on stderr."""
    out = values.to_numpy(zero_copy_only=False)
    if out.dtype == np.float32:
        return out
    with np.errstate(over="ignore", under="ignore"):
        return out.astype(np.float32)


def check_same_lengths(
    reference: np.ndarray, other: np.ndarray, names: tuple[str, str], path: str, first_row: int
) -> None:
    """Per-row list lengths of two columns must agree."""
    if reference.shape == other.shape and np.array_equal(reference, other):
        return
    lengths_a, lengths_b = np.diff(reference), np.diff(other)
    row = int(np.flatnonzero(lengths_a != lengths_b)[0])
    raise InputError(
        f"'{names[0]}' has {lengths_a[row]} values but '{names[1]}' has {lengths_b[row]}; every column must "
        "have one value per token of the response",
        path=path,
        row=first_row + row,
        column=names[1],
    )
