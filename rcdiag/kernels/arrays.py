"""The kernels' input conventions that need no numba (the small-dump path, ``rcdiag.kernels.small``, and the
screen import them without loading numba)."""

from __future__ import annotations

import numpy as np


def id_array(tokens: np.ndarray) -> np.ndarray:
    """Raw token ids as the kernels take them: contiguous int32 (as Parquet stores them: no widened copy, half the
    memory traffic of int64) or int64."""
    dtype = tokens.dtype if tokens.dtype in (np.int32, np.int64) else np.int64
    return np.ascontiguousarray(tokens, dtype=dtype)
