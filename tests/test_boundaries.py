"""Values exactly on every bound: k1 both sides (inclusive), k2/k3 upper (inclusive), IS truncation and the ratio
fractions (strict), IcePop both sides (inclusive). Each token is its own row, with a float32 log-ratio d that puts
its statistic exactly on the float32 bound verl compares against, or one float32 step beyond it. The expected
values are counted by hand, and checked against verl v0.9.0 itself."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import run_padded
from verl_oracle import require_verl, verl_metrics

P = "rollout_corr/"
LOG2 = float(np.float32(math.log(2.0)))  # verl compares k1 with log(U) rounded to float32
K3_AT_2 = float(np.float32(math.expm1(2.0) - 2.0))  # k3 of d = 2 in float32 (verl's torch float32 gives the same)
ULP_ABOVE_1, ULP_BELOW_1 = 2.0**-23, -(2.0**-24)  # d whose float32 ratio e^d is one step above / below 1


def up(x: float) -> float:
    """The next float32 above ``x``."""
    return float(np.nextafter(np.float32(x), np.float32(np.inf)))


def one_token_rows(ds: list[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One row per log-ratio, realised exactly: old - rollout == d in float32 (both log-probs <= 0)."""
    old = np.array([[0.0 if d > 0 else d] for d in ds], np.float32)
    rollout = np.array([[-d if d > 0 else 0.0] for d in ds], np.float32)
    assert (old - rollout).reshape(-1).tolist() == [float(np.float32(d)) for d in ds]
    return old, rollout, np.ones_like(old, dtype=np.int64)


K1_ROWS = [-LOG2, -up(LOG2), LOG2, up(LOG2)]  # k1 = -d: on log U, above it, on log L, below it
K2_ROWS = [1.0, -1.0, up(1.0), -up(1.0)]  # k2 = d^2/2: on 0.5 twice, above twice
K3_ROWS = [2.0, up(2.0), 0.0]  # k3: on K3_AT_2, above it, 0
RS_CASES = [
    ("token_k1", "0.5_2.0", K1_ROWS, {"masked_fraction": 0.5, "fraction_high": 0.25, "fraction_low": 0.25}),
    ("token_k1", 2.0, K1_ROWS, {"masked_fraction": 0.5, "fraction_high": 0.25, "fraction_low": 0.25}),
    ("seq_sum_k1", "0.5_2.0", K1_ROWS, {"masked_fraction": 0.5, "seq_fraction_high": 0.25, "seq_fraction_low": 0.25}),
    ("seq_mean_k1", "0.5_2.0", K1_ROWS, {"masked_fraction": 0.5, "seq_fraction_high": 0.25}),
    ("token_k2", 0.5, K2_ROWS, {"masked_fraction": 0.5, "fraction_high": 0.5}),
    ("seq_sum_k2", 0.5, K2_ROWS, {"masked_fraction": 0.5, "seq_fraction_high": 0.5}),
    ("seq_mean_k2", 0.5, K2_ROWS, {"masked_fraction": 0.5}),
    ("seq_max_k2", 0.5, K2_ROWS, {"masked_fraction": 0.5, "fraction_high": 0.5}),
    ("token_k3", K3_AT_2, K3_ROWS, {"masked_fraction": 1 / 3, "fraction_high": 1 / 3}),
    ("seq_sum_k3", K3_AT_2, K3_ROWS, {"masked_fraction": 1 / 3}),
    ("seq_mean_k3", K3_AT_2, K3_ROWS, {"masked_fraction": 1 / 3}),
    ("seq_max_k3", K3_AT_2, K3_ROWS, {"masked_fraction": 1 / 3, "seq_fraction_high": 1 / 3}),
]
# several options at once: the aggregate combines the options' rejection masks (a token option's own mask, not
# its counts), so its bounds are pinned too
COMBINED = [
    ("token_k1,seq_sum_k1,seq_mean_k1", "0.5_2.0", K1_ROWS, 0.5),
    ("token_k2,seq_max_k2", 0.5, K2_ROWS, 0.5),
    ("token_k3,seq_sum_k3", K3_AT_2, K3_ROWS, 1 / 3),
]
IS_CASES = [
    # TIS, U = 1: ratio 1 is not above U (strict), its truncated weight is U; one step above / below is counted
    (
        {"rollout_is": "token", "rollout_is_threshold": 1.0},
        [0.0, ULP_ABOVE_1, ULP_BELOW_1],
        {"ratio_fraction_high": 1 / 3, "ratio_fraction_low": 1 / 3, "max": 1.0, "seq_fraction_high": 1 / 3},
    ),
    (
        {"rollout_is": "sequence", "rollout_is_threshold": 1.0},
        [0.0, ULP_ABOVE_1, ULP_BELOW_1],
        {"ratio_fraction_high": 1 / 3, "ratio_fraction_low": 1 / 3, "seq_fraction_low": 1 / 3},
    ),
    # IcePop keeps L <= ratio <= U: ratio 1 on the lower bound, then on the upper bound, is kept
    (
        {"rollout_is": "token", "rollout_is_threshold": "1.0_2.0"},
        [0.0, ULP_BELOW_1, 0.5],
        {"oob_ratio": 1 / 3, "min": 0.0, "mean": (1.0 + math.exp(0.5)) / 3},
    ),
    (
        {"rollout_is": "token", "rollout_is_threshold": "0.5_1.0"},
        [0.0, ULP_ABOVE_1, -0.5],
        {"oob_ratio": 1 / 3, "max": 1.0, "mean": (1.0 + math.exp(-0.5)) / 3},
    ),
    (
        {"rollout_is": "sequence", "rollout_is_threshold": "1.0_2.0"},
        [0.0, ULP_BELOW_1, 0.5],
        {"oob_ratio": 1 / 3, "seq_min": 0.0, "seq_mean": (1.0 + math.exp(0.5)) / 3},
    ),
    (
        {"rollout_is": "sequence", "rollout_is_threshold": "0.5_1.0"},
        [0.0, ULP_ABOVE_1, -0.5],
        {"oob_ratio": 1 / 3, "seq_max": 1.0, "seq_mean": (1.0 + math.exp(-0.5)) / 3},
    ),
    ({"rollout_is": "token", "rollout_is_threshold": "1.0_1.0"}, [0.0, ULP_ABOVE_1, ULP_BELOW_1], {"oob_ratio": 2 / 3}),
]


def _rs_expected(option: str, expected: dict) -> dict[str, float]:
    """Every row has one token, so the row fractions equal the token fractions."""
    expected = {**expected, "seq_masked_fraction": expected["masked_fraction"]}
    out = {f"{P}rollout_rs_{option}_{key}": value for key, value in expected.items()}
    return out | _aggregate(expected["masked_fraction"])


def _aggregate(fraction: float) -> dict[str, float]:
    return {P + "rollout_rs_masked_fraction": fraction, P + "rollout_rs_seq_masked_fraction": fraction}


def _all_cases() -> list[tuple[dict, list[float], dict[str, float]]]:
    cases = [
        ({"rollout_rs": option, "rollout_rs_threshold": spec}, rows, _rs_expected(option, expected))
        for option, spec, rows, expected in RS_CASES
    ]
    cases += [
        ({"rollout_rs": options, "rollout_rs_threshold": spec}, rows, _aggregate(fraction))
        for options, spec, rows, fraction in COMBINED
    ]
    cases += [
        (config, rows, {f"{P}rollout_is_{k}": v for k, v in expected.items()}) for config, rows, expected in IS_CASES
    ]
    return cases


CASES = _all_cases()
IDS = [
    f"{c['rollout_rs'] if 'rollout_rs' in c else c['rollout_is']}-{c.get('rollout_rs_threshold', c.get('rollout_is_threshold'))}"
    for c, _, _ in CASES
]


@pytest.mark.parametrize(("config", "rows", "expected"), CASES, ids=IDS)
def test_values_on_the_bound(config: dict, rows: list[float], expected: dict[str, float]) -> None:
    metrics = run_padded(*one_token_rows(rows), **config).metrics
    assert {key: metrics[key] for key in expected} == pytest.approx(expected, rel=1e-6, abs=0.0)


@pytest.mark.parametrize(("config", "rows", "expected"), CASES, ids=IDS)
def test_values_on_the_bound_as_verl_decides(config: dict, rows: list[float], expected: dict[str, float]) -> None:
    torch = require_verl()
    old, rollout, mask = one_token_rows(rows)
    theirs = verl_metrics(torch.from_numpy(old), torch.from_numpy(rollout), torch.from_numpy(mask), **config)
    assert {key: theirs[key] for key in expected} == pytest.approx(expected, rel=1e-6, abs=0.0)
    ours = run_padded(old, rollout, mask, **config).metrics
    fractions = [key for key in theirs if "fraction" in key or key.endswith("oob_ratio")]
    assert {key: ours[key] for key in fractions} == pytest.approx(
        {key: theirs[key] for key in fractions}, rel=1e-6, abs=0.0
    )
