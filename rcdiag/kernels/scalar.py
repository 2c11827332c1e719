"""The core's formulas (``rcdiag.core.formulas``) compiled for the kernels: the same Python functions, wrapped with
``njit(inline="always")``, so numba inlines each into the calling kernel, where it compiles under that kernel's own
fast-math flags (what the kernel computed when it wrote the formula itself). Import these, never re-write them.

numba's on-disk cache keys a kernel on its own file: after editing ``rcdiag/core/formulas.py`` in a checkout, clear
the cache (``find rcdiag -name '*.nb[ic]' -delete``) or the kernels keep the old formula (an installed release has
fresh files, so users never see this)."""

from __future__ import annotations

from numba import njit

from rcdiag.core import formulas

_inline = njit(inline="always")

clamp, clip, clamped_expm1, exp_overflows, k1, k2, k3, k3_verl, chi2_term, truncate, rs_keep, order_key = map(
    _inline,
    (
        formulas.clamp, formulas.clip, formulas.clamped_expm1, formulas.exp_overflows, formulas.k1, formulas.k2,
        formulas.k3, formulas.k3_verl, formulas.chi2_term, formulas.truncate, formulas.rs_keep, formulas.order_key,
    ),
)  # fmt: skip
chan_merge, chan_merge_share = map(_inline, (formulas.chan_merge, formulas.chan_merge_share))
