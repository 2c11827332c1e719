"""verl's clamp on log-ratios and float32's range: the constants every metric, kernel and report rounds against.
Without numpy at import (the CLI's ``--help`` reads ``SAFETY_BOUND`` through ``rcdiag.settings.correction``)."""

from __future__ import annotations

import math
from typing import Any

SAFETY_BOUND = 20.0
"""verl's clamp on log-ratios before ``exp`` (``SAFETY_BOUND`` in verl's rollout_corr_helper)."""
F32_MAX = float.fromhex("0x1.fffffep+127")
"""The largest float32: beyond it verl's float32 arithmetic gives an infinity."""
LOG_F32_MAX = math.log(F32_MAX)
"""Above this log-ratio verl's float32 ``exp`` overflows to inf."""
EXPM1_AT_BOUND = math.expm1(SAFETY_BOUND)
"""``e^d - 1`` at the clamp's upper end: what every d > 20 gives once clamped."""
EXPM1_AT_NEG_BOUND = math.expm1(-SAFETY_BOUND)
"""``e^d - 1`` at the clamp's lower end."""


def finite(value: float | None) -> float | None:
    """The value, or ``None`` for NaN and the infinities (JSON has no inf)."""
    return value if value is not None and math.isfinite(value) else None


def finite_tree(value: Any) -> Any:
    """Non-finite floats anywhere in nested dicts and lists as ``None`` (JSON has no inf), as in every JSON rcdiag
    writes; tuples become lists."""
    if isinstance(value, dict):
        return {k: finite_tree(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_tree(v) for v in value]
    return finite(value) if isinstance(value, float) else value


def finite_f32(value: float | None) -> float | None:
    """The value, or ``None`` for NaN and for what verl's float32 makes infinite (beyond ``F32_MAX``)."""
    return value if value is not None and abs(value) <= F32_MAX else None


def f32(x: float) -> float:
    """``x`` rounded to float32: verl compares float32 tensors with Python scalars in float32."""
    import numpy as np

    return float(np.float32(x))
