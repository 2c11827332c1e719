"""Statistics that cancel in float32 (k3 = e^d - 1 - d, chi2 = E[r^2] - 1, raw-moment spreads) are evaluated
accurately. Expected values are exact: Python's ``math.expm1`` and ``fractions.Fraction`` on the float32 inputs."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from conftest import run_padded
from verl_oracle import require_verl, verl_metrics

P = "rollout_corr/"

# A float32 log-ratio d = old - rollout whose exact k3 is 1.00007e-3, just above a token_k3 threshold of 0.001:
# float32 numpy exp(d) - 1 - d gives 0.00099998 (kept); verl's float32 torch and exact arithmetic reject it.
D_ABOVE = np.float32(0.04439205)
ROLLOUT, OLD = np.float32(-1.0), np.float32(-0.95560795)


def _planted(clean: int = 999) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One row holding the planted token, then ``clean`` tokens with small log-ratios in rows of 37."""
    rng = np.random.default_rng(8)
    width = 37
    rows = 1 + -(-clean // width)
    old = np.full((rows, width), -1.0, np.float32)
    rollout = (old - rng.uniform(-0.01, 0.01, old.shape)).astype(np.float32)
    mask = np.zeros((rows, width), np.int64)
    mask[1:].reshape(-1)[:clean] = 1
    old[0, 0], rollout[0, 0], mask[0, 0] = OLD, ROLLOUT, 1
    return old, rollout, mask


def test_the_planted_token_is_where_float32_cancels() -> None:
    d = np.float32(OLD - ROLLOUT)
    assert d == D_ABOVE
    exact = math.expm1(float(d)) - float(d)
    assert exact == pytest.approx(1.00007e-3, rel=1e-6) and exact > np.float32(1e-3)
    assert np.exp(d) - np.float32(1.0) - d <= np.float32(1e-3)  # what float32 numpy computed before


@pytest.mark.parametrize("option", ["token_k3", "seq_max_k3", "seq_sum_k3", "seq_mean_k3"])
def test_a_token_whose_exact_k3_is_above_the_threshold_is_rejected(option: str) -> None:
    old, rollout, mask = _planted()
    tokens, rows = int(mask.sum()), mask.shape[0]
    m = run_padded(old, rollout, mask, rollout_rs=option, rollout_rs_threshold=0.001).metrics
    # the clean tokens' k3 is at most 0.01^2/2 (far below), so exactly the planted token (row 0) is rejected
    assert m[P + f"rollout_rs_{option}_masked_fraction"] == 1 / tokens
    assert m[P + "rollout_rs_seq_masked_fraction"] == 1 / rows
    assert m[P + f"rollout_rs_{option}_fraction_high"] == (1 / tokens if option == "token_k3" else 1 / rows)


def test_the_planted_token_against_verl() -> None:
    torch = require_verl()
    old, rollout, mask = _planted()
    config = {"rollout_rs": "token_k3,seq_max_k3", "rollout_rs_threshold": 0.001}
    ours = run_padded(old, rollout, mask, **config).metrics
    theirs = verl_metrics(*(torch.from_numpy(a) for a in (old, rollout, mask)), **config)
    for key in ("rollout_rs_token_k3_masked_fraction", "rollout_rs_seq_max_k3_masked_fraction"):
        assert theirs[P + key] == pytest.approx(1 / mask.sum(), rel=1e-6)
        assert ours[P + key] == pytest.approx(theirs[P + key], rel=1e-6)


def _exact_row_sums(values: np.ndarray, mask: np.ndarray) -> list[Fraction]:
    return [
        sum((Fraction(float(v)) for v, k in zip(row, keep, strict=True) if k), Fraction(0))
        for row, keep in zip(values, mask, strict=True)
    ]


def test_k3_kl_and_chi2_of_tiny_log_ratios_are_exact() -> None:
    """d = 1e-4 per token: k3 = 5e-9 and e^(2d) - 1 = 2e-4, where float32 keeps no digit of k3 and about three of
    chi2 (an ulp of e^d is 1.2e-7)."""
    old = np.full((3, 5), -2.0, np.float32)
    rollout = (old - np.float32(1e-4) * np.arange(1, 16, dtype=np.float32).reshape(3, 5)).astype(np.float32)
    mask = np.ones_like(old, dtype=np.int64)
    m = run_padded(old, rollout, mask).metrics
    d = [float(np.float32(o - r)) for o, r in zip(old.reshape(-1), rollout.reshape(-1), strict=True)]
    assert m[P + "k3_kl"] == pytest.approx(sum(math.expm1(x) - x for x in d) / 15, rel=1e-6)
    assert m[P + "chi2_token"] == pytest.approx(sum(math.expm1(2 * x) for x in d) / 15, rel=1e-9)
    s = [float(v) for v in _exact_row_sums(old, mask)]
    r = [float(v) for v in _exact_row_sums(rollout, mask)]
    assert m[P + "chi2_seq"] == pytest.approx(
        sum(math.expm1(2 * (a - b)) for a, b in zip(s, r, strict=True)) / 3, rel=1e-9
    )


def test_kl_std_error_does_not_cancel() -> None:
    """Rows with the same large per-token shift and lengths 40..200: S_i = kl * n_i up to one perturbed token,
    so the spread is tiny next to sum S_i^2 (the raw-moment expansion loses it entirely)."""
    lengths = [40, 70, 110, 200, 150]
    width = max(lengths)
    old = np.full((len(lengths), width), -0.5, np.float32)
    rollout = np.full_like(old, -3.0)
    mask = (np.arange(width)[None, :] < np.array(lengths)[:, None]).astype(np.int64)
    old[2, 7] = np.float32(-0.5) + np.float32(2.0**-18)
    report = run_padded(old, rollout, mask)
    # exact: S_i and n_i from the float32 values, then sqrt(sum_i (S_i - kl n_i)^2) / N in rationals
    s = [a - b for a, b in zip(_exact_row_sums(rollout, mask), _exact_row_sums(old, mask), strict=True)]
    n = [Fraction(k) for k in lengths]
    kl = sum(s) / sum(n)
    spread = sum((si - kl * ni) ** 2 for si, ni in zip(s, n, strict=True))
    expected = math.sqrt(spread) / float(sum(n))
    assert expected > 0
    assert report.extras["rcdiag/kl_std_error"] == pytest.approx(expected, rel=1e-9)
