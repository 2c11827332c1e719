"""The numbers and formulas every engine path shares, written once (a leaf: it imports numpy and, for ``forecast``'s
Student-t, ``rcdiag.core.stats``).

``limits``: verl's ±20 log-ratio clamp, float32's range, and the two ways a report drops what is not a number.
``formulas``: k1/k2/k3 and chi2 per token, IS weights and their truncation, the RS keep rule and a band's clip, the
float order key and Chan's merge of moments. ``bins``: the log-ratio histogram's edges and the float32 bin table.
``forecast``: when a per-step series crosses a limit (``rcdiag watch`` and ``mismatch_trend``).

Each formula is plain arithmetic, so the same function serves a Python float, a numpy array, a torch tensor and,
compiled by numba inside a kernel (``rcdiag.kernels.scalar``), a kernel's scalar: the kernels inline it under their
own fast-math flags, so a kernel computes what it computed when it wrote the formula itself.
"""
