"""The by-token table's one addition: a run of valid tokens' terms added to their ids' rows.

Shared by the explain pass (``rcdiag.kernels.explain``, which adds each row's tokens while the row's terms are in
L1) and the stand-alone pass (``rcdiag.kernels.token_ids``), so both add the same terms in the same order: a
row of ``out`` per id holds the sums of ``rcdiag.explain.by_token.SUMS`` (tokens, log-ratio, |log-ratio|, k3, chi2,
log-ratio squared).

``prefetch_token_rows`` asks the CPU for a run's rows of the table ahead of the addition (a hint: no value changes).
The table (7.3 MB for 151,936 ids) is larger than a core's L2, so the rare ids' rows come from L3 or memory; in the
addition's loop each token's six loads and stores fill the out-of-order window, and few of those misses overlap. A
loop of prefetches alone keeps many more of them in flight (docs/performance.md, "Explain with token ids").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from rcdiag.kernels import JIT

N_TOKEN_SUMS = 6
PREFETCH_TABLE_BYTES = 4 << 20
"""``prefetch_token_rows`` prefetches only for a table larger than this (87,381 ids): over a smaller one the rows
mostly stay in L2 and the prefetches cost more than they save (measured, ``benchmarks/explain_tokens.py
--kernels``: 1,024 to 32,000 ids 1-2 ns a token slower, 65,536 ids (3 MB) within noise, 151,936 ids 20-45%
faster)."""


@intrinsic
def _prefetch_address(typingctx, address):
    """LLVM's ``llvm.prefetch`` of the byte at ``address`` (int64), for writing (the line comes exclusive, as the
    addition's stores want it), into every cache level."""
    if address != types.int64:
        return None

    def codegen(context, builder, signature, args):
        pointer = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        # the intrinsic is overloaded on its pointer type: "p0" with opaque pointers, "p0i8" with typed ones
        name = "llvm.prefetch.p0" if str(pointer) == "ptr" else "llvm.prefetch.p0i8"
        signature_ = ir.FunctionType(ir.VoidType(), [pointer, i32, i32, i32])
        function = cgutils.get_or_insert_function(builder.module, signature_, name)
        write, keep_everywhere, data = ir.Constant(i32, 1), ir.Constant(i32, 3), ir.Constant(i32, 1)
        builder.call(function, [builder.inttoptr(args[0], pointer), write, keep_everywhere, data])
        return context.get_dummy_value()

    return types.void(types.int64), codegen


_prefetch = cast("Callable[[int], None]", _prefetch_address)
"""``_prefetch_address`` as compiled code calls it (numba supplies ``typingctx``), for mypy; the same object."""


@njit(**JIT)
def prefetch_token_rows(ids: np.ndarray, out: np.ndarray) -> None:
    """Prefetch the rows of ``out`` (both cache lines of a row that straddles two) of the ids in
    ``[0, out.shape[0])``, when ``out`` is larger than ``PREFETCH_TABLE_BYTES``."""
    if out.nbytes <= PREFETCH_TABLE_BYTES:
        return
    rows = out.shape[0]
    base = out.ctypes.data
    stride = out.strides[0]
    for j in range(ids.shape[0]):
        row = ids[j]
        if row >= 0 and row < rows:
            at = base + np.int64(row) * stride
            _prefetch(at)
            _prefetch(at + stride - 1)


@njit(**JIT)
def add_token_terms(
    ids: np.ndarray, old: np.ndarray, rollout: np.ndarray, k3: np.ndarray, chi2: np.ndarray, out: np.ndarray
) -> int:
    """Add each token whose id is in ``[0, out.shape[0])`` to its id's row of ``out``; returns how many were not
    (left for the caller)."""
    rows = out.shape[0]
    skipped = 0
    for j in range(ids.shape[0]):
        row = ids[j]
        if row < 0 or row >= rows:
            skipped += 1
            continue
        d = np.float64(old[j] - rollout[j])
        out[row, 0] += 1.0
        out[row, 1] += d
        out[row, 2] += abs(d)
        out[row, 3] += k3[j]
        out[row, 4] += chi2[j]
        out[row, 5] += d * d
    return skipped
