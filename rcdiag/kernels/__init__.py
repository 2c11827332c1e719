"""Fused per-token kernels for the CPU engine, compiled with numba.

numpy runs one pass over memory per operation (0.1-0.9 ns a token each, 25-40 passes per block); these kernels
take every per-token quantity a group needs in one or two passes. Conventions shared by every kernel module:

* ``@njit(**JIT)``: compiled on first use and cached on disk (numba's ``cache=True``), so only the first run on
  a machine pays the compile; ``nogil`` so the reader's thread is never held up.
* ``FASTMATH`` lets LLVM reorder float sums (and so vectorize them); it keeps NaN and inf semantics (no
  ``nnan``/``ninf``), which verl's metrics depend on.
* Loops run over ``range(x.shape[0])`` of a slice, never ``range(a, b)``: numba's negative-index wraparound
  on ``x[i]`` with a non-zero start stops LLVM vectorizing (0.59 against 0.07 ns a token, measured).
* Nothing here is imported by ``rcdiag --help``: the engine imports kernels when it first runs.
"""

from __future__ import annotations

from typing import TypedDict


class JitOptions(TypedDict, total=False):
    """The ``numba.njit`` keyword arguments the kernels set (a typed dict, so mypy matches them to ``njit``'s)."""

    cache: bool
    nogil: bool
    fastmath: bool | set[str]


FASTMATH = frozenset({"reassoc", "contract", "arcp"})
"""LLVM fast-math flags every kernel compiles with: reassociation (vectorized sums), fused multiply-add and
reciprocal approximations of divisions are allowed; NaN and infinity keep their IEEE meaning."""

JIT: JitOptions = {"cache": True, "nogil": True, "fastmath": set(FASTMATH)}
"""Keyword arguments of ``numba.njit`` for every kernel."""
