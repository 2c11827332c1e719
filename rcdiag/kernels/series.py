"""The kernels' Taylor series for ``e^d - 1`` and ``e^d - 1 - d``: polynomials LLVM vectorizes, where numba's
``math.expm1`` calls libm one value at a time (5 ns a token).

There are two, on purpose, each pinned bit for bit by its tests (tests/engine/test_token_kernel.py,
tests/engine/test_explain_kernel.py) and by the numbers analyze and ``--explain`` have written:

* ``k3_series`` (the analyze token pass and the RS statistics, ``kernels/tokens.py``, ``kernels/statistics.py``):
  k3 = e^d - 1 - d itself, its even and odd parts in d^2 to d^13/13!, for |d| < ``K3_SERIES_MAX``
  (``rcdiag.core.formulas.k3_series_parts``, which the numpy path evaluates too); inlined, so it compiles under the
  calling kernel's fast-math flags. Taking k3 directly (not as ``expm1(d) - d``) keeps its
  digits for a small d, and the split gives e^|d| at no cost.
* ``expm1_reduced`` (``--explain``'s kernel, ``kernels/explain.py``): e^x - 1 for any x, by range reduction
  x = k ln2 + r and ``expm1_series(r)``, Horner's scheme in r to r^14/14!, compiled with ``contract`` only and never
  inlined (reassociation would fold the two halves of ln 2 back together and move the last bits). Its cut-off,
  below which the reduction is the identity, is the ``--explain`` encoding's ``SMALL`` (``explain_encoding.py``),
  part of the state layout.

One series cannot serve both without moving last bits: k3 from ``expm1_series(d) - d`` cancels where the direct
series does not, and ``expm1_series`` evaluated under the token pass's reassociation rounds differently. So explain's
k3 sums and analyze's agree to float64 rounding, not bit for bit (as before this module).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from rcdiag.core import formulas
from rcdiag.kernels import JIT, JitOptions
from rcdiag.kernels.explain_encoding import SERIES_TERMS

# --------------------------------------------------------------------------------------- k3, directly

k3_series_parts = njit(inline="always")(formulas.k3_series_parts)
"""The even and odd parts of e^d - 1 - d for |d| < K3_SERIES_MAX (``rcdiag.core.formulas.k3_series_parts``,
compiled and inlined)."""


@njit(inline="always")
def k3_series(d: float) -> float:
    """e^d - 1 - d for |d| < K3_SERIES_MAX."""
    even, odd = k3_series_parts(d)
    return even + odd


# ----------------------------------------------------------------------------- expm1, range-reduced

LN2_HI = 6.93147180369123816490e-01
LN2_LO = 1.90821492927058770002e-10
INV_LN2 = 1.44269504088896338700e00
EXPM1_HI = 90.0
"""Log-ratios above this give k3 = inf anyway (float32 exp overflows at 88.7): the polynomial stops here."""
EXPM1_LO = -40.0
"""``expm1`` of anything below rounds to -1 in float64."""
_CONTRACT: JitOptions = {**JIT, "fastmath": {"contract"}}
"""The kernels' options with fused multiply-add as the only fast-math flag (no reassociation)."""
_SERIES = tuple(1.0 / math.factorial(k) for k in range(SERIES_TERMS))
"""1/k!: the Taylor coefficients of ``expm1`` to degree 14 (truncation below 1e-17 of the value for
|r| <= ln2/2)."""


@intrinsic
def _bits_to_float64(typingctx, bits):
    """The float64 whose bit pattern is the int64 ``bits`` (a register move, so the loop still vectorizes)."""
    if bits != types.int64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen


_bits_as_float64 = cast("Callable[[np.int64], float]", _bits_to_float64)
"""``_bits_to_float64`` as compiled code calls it (numba supplies ``typingctx``), for mypy; the same object."""


@njit(**_CONTRACT)
def expm1_series(r: float) -> float:
    """``expm1(r)`` for |r| <= ln2/2: r + r^2 (1/2 + r (1/6 + ...)), Horner's scheme (correctly rounded but for
    an ulp now and then). Not ``inline="always"``: numba would inline it under the caller's fast-math flags, and
    reassociating Horner's scheme changes the last bits (LLVM inlines it with its own flags)."""
    p = r * _SERIES[14]
    p = r * (p + _SERIES[13])
    p = r * (p + _SERIES[12])
    p = r * (p + _SERIES[11])
    p = r * (p + _SERIES[10])
    p = r * (p + _SERIES[9])
    p = r * (p + _SERIES[8])
    p = r * (p + _SERIES[7])
    p = r * (p + _SERIES[6])
    p = r * (p + _SERIES[5])
    p = r * (p + _SERIES[4])
    p = r * (p + _SERIES[3])
    p = r * (p + _SERIES[2])
    return r + r * p


@njit(**_CONTRACT)
def expm1_reduced(x: float) -> float:
    """``exp(x) - 1`` in float64 without the cancellation near 0: x = k ln2 + r with |r| <= ln2/2,
    ``expm1_series(r)``, then ``2^k expm1(r) + (2^k - 1)``. NaN stays NaN; below -40 it is -1, above 90 it is
    ``expm1(90)`` (the callers never need more). No reassociation here: it would fold the two halves of ln 2 back
    into one and lose the reduction's precision. Within two ulps of numpy's ``np.expm1``."""
    xc = x if x > EXPM1_LO else EXPM1_LO
    xc = xc if xc < EXPM1_HI else EXPM1_HI
    k = np.rint(xc * INV_LN2)
    r = (xc - k * LN2_HI) - k * LN2_LO
    em1_r = expm1_series(r)
    scale = _bits_as_float64((np.int64(k) + 1023) << 52)
    out = scale * em1_r + (scale - 1.0)
    return x if x != x else out
