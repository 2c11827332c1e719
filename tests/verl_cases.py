"""What rcdiag is checked against verl on, and how close it must come: the fixed and the random correction
configurations, and the tolerance of verl's own float32 arithmetic (``close_to_verl``, with the ``spreads`` of the
float64 reference that bound it). Shared by the conformance, release and sweep tests."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st
from reference import all_metrics

from rcdiag.settings.correction import PRESETS, RS_OPTIONS

F32_ULP = 2.0**-23
"""Spacing of float32 numbers in [1, 2): one unit in the last place, relative."""
VARIANCE_ULPS = 16
"""verl's population std is sqrt(E[x^2] - E[x]^2) in float32 with both means float32 sums (torch sums pairwise):
its variance is within about 16 ulps of E[x^2] of the exact one."""
VALUE_ULPS = 4
"""verl's per-value inputs (an exp, a float32 row sum) are within a few ulps of their magnitude of exact ones."""


def close_to_verl(got: float, want: float, key: str, spreads: dict[str, tuple[float, float]]) -> bool:
    """Ours (float64, accurate) against verl's value, within verl's own float32 error where its arithmetic loses
    more than rounding; relative 1e-4 elsewhere.

    A population ``*_std``: verl's variance is within ``VARIANCE_ULPS`` ulps of E[x^2] of the exact one, so its std
    lies in [sqrt(var - e), sqrt(var + e)], widened by the rounding of its inputs (a std moves by at most the
    largest change of a value). A sample std (N - 1) in place of the population std falls outside. ``seq_std``
    is torch.std (accurate) of float32 values: their rounding. chi2 is E[ratio^2] - 1 in float32 in verl.
    """
    name = key.removeprefix("rollout_corr/")
    if name.endswith("seq_std") and name.removesuffix("seq_std") + "std" in spreads:
        _, magnitude = spreads[name.removesuffix("seq_std") + "std"]
        return math.isclose(got, want, rel_tol=1e-4, abs_tol=VALUE_ULPS * F32_ULP * magnitude + 1e-6)
    if name in spreads:
        second_moment, magnitude = spreads[name]
        error = VARIANCE_ULPS * F32_ULP * second_moment
        inputs = VALUE_ULPS * F32_ULP * magnitude
        variance = got * got
        return math.sqrt(max(variance - error, 0.0)) - inputs <= want <= math.sqrt(variance + error) + inputs
    return math.isclose(got, want, rel_tol=1e-4, abs_tol=1e-5 if "chi2" in key else 1e-6)


def spreads(old: np.ndarray, rollout: np.ndarray, mask: np.ndarray, config: dict) -> dict[str, tuple[float, float]]:
    """E[x^2] and the float32 rounding magnitude behind each population std metric (the float64 reference)."""
    out: dict[str, tuple[float, float]] = {}
    all_metrics(old, rollout, mask, out, **config)
    return out


CONFIGS = [
    {},
    {"rollout_is": "token"},
    {"rollout_is": "sequence", "rollout_is_batch_normalize": True},
    {"rollout_is": "token", "rollout_is_threshold": "0.5_5.0", "rollout_is_batch_normalize": True},
    {"rollout_is": "sequence", "rollout_is_threshold": "0.5_5.0"},
    {
        "rollout_rs": ",".join(RS_OPTIONS),
        "rollout_rs_threshold": "0.7_1.3,2,0.02,0.5_2.0,5,0.5,0.99_1.01,0.01,0.01,0.5,0.2",
    },
    {"rollout_is": "token", "rollout_rs": "token_k1,seq_mean_k3", "rollout_rs_threshold": "0.9_1.05,0.001"},
    *[{k: v for k, v in build().to_dict().items() if k.startswith("rollout_")} for build in PRESETS.values()],
]


@st.composite
def rs_config(draw: st.DrawFn) -> dict:
    options = draw(st.lists(st.sampled_from(RS_OPTIONS), min_size=1, max_size=4))
    unique = list(dict.fromkeys(options))
    specs = []
    for option in unique:
        if option.endswith("k1"):
            lo = draw(st.floats(0.3, 1.0))
            hi = draw(st.floats(1.0, 3.0))
            specs.append(draw(st.sampled_from([f"{lo}_{hi}", f"{hi}"])))
        else:
            specs.append(str(draw(st.floats(1e-3, 2.0))))
    shared = (draw(st.booleans()) and all(o.endswith("k1") for o in unique)) or len(unique) == 1
    return {"rollout_rs": ",".join(options), "rollout_rs_threshold": specs[0] if shared else ",".join(specs)}


@st.composite
def any_config(draw: st.DrawFn) -> dict:
    config: dict = {}
    level = draw(st.sampled_from([None, "token", "sequence"]))
    if level:
        config["rollout_is"] = level
        upper = draw(st.floats(1.01, 10.0))
        if draw(st.booleans()):
            config["rollout_is_threshold"] = f"{draw(st.floats(0.05, 1.0))}_{upper}"
        else:
            config["rollout_is_threshold"] = upper
        config["rollout_is_batch_normalize"] = draw(st.booleans())
    if draw(st.booleans()):
        config.update(draw(rs_config()))
    return config
