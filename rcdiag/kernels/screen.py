"""The value screen's fast path on CPU: the least and greatest of a float32 array in one vectorized pass.

numpy's ``min`` and ``max`` are two passes; a float loop in numba stays scalar (LLVM does not vectorize float
min/max without assuming no NaN). Comparing order-preserving int32 keys instead vectorizes (0.04 ns a token), and
keeps NaN visible: a NaN's key lies beyond the infinities' on its sign's side, so it comes back as an extreme.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from rcdiag.core.formulas import KEY_HIGHEST, KEY_LOWEST, order_key_floats
from rcdiag.kernels import JIT, compiling  # noqa: F401 (compiling: a notice when kernels compile)
from rcdiag.kernels.scalar import order_key


@njit(**JIT)
def _key_range(bits):
    lo = KEY_HIGHEST
    hi = KEY_LOWEST
    for i in range(bits.shape[0]):
        k = order_key(bits[i])
        lo = k if k < lo else lo
        hi = k if k > hi else hi
    return lo, hi


def value_range(values: np.ndarray) -> tuple[float, float]:
    """(least, greatest) of a non-empty float32 array; both NaN when it holds a NaN (as numpy's)."""
    keys = _key_range(np.ascontiguousarray(values).view(np.int32))
    lo, hi = (float(x) for x in order_key_floats(np.array(keys, dtype=np.int32)))
    return (lo, hi) if lo == lo and hi == hi else (float("nan"), float("nan"))
