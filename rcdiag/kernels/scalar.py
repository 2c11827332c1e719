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

# One line a formula (not a map over a tuple), so each keeps its signature for mypy.
clamp = _inline(formulas.clamp)
clip = _inline(formulas.clip)
clamped_expm1 = _inline(formulas.clamped_expm1)
exp_overflows = _inline(formulas.exp_overflows)
k1 = _inline(formulas.k1)
k2 = _inline(formulas.k2)
k3 = _inline(formulas.k3)
k3_verl = _inline(formulas.k3_verl)
chi2_term = _inline(formulas.chi2_term)
truncate = _inline(formulas.truncate)
rs_keep = _inline(formulas.rs_keep)
order_key = _inline(formulas.order_key)
ulp_distance = _inline(formulas.ulp_distance)
chan_merge = _inline(formulas.chan_merge)
chan_merge_share = _inline(formulas.chan_merge_share)
