"""Values exactly on every bound: k1 both sides (inclusive), k2/k3 upper (inclusive), IS truncation and the ratio
fractions (strict), IcePop both sides (inclusive). Each token is its own row, with a float32 log-ratio d that puts
its statistic exactly on the float32 bound verl compares against, or one float32 step beyond it. The expected
values are counted by hand, and checked against verl v0.9.0 itself."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, SAMPLES, rows_with_ratios, run_padded
from severities import SEVERITIES, checked
from verl_oracle import require_verl, verl_metrics

import rcdiag
from rcdiag.catalogue.findings import FINDINGS
from rcdiag.catalogue.metrics import thresholds_with_findings
from rcdiag.diagnosis.health import evaluate
from rcdiag.diagnosis.signature_rules import SIGNATURE_CODES
from rcdiag.explain.breakdowns import GROUPS, N_DOUBLING, SUMS
from rcdiag.explain.detectors import DETECTORS, TREND_K3_FLOOR, logprob_offset, mismatch_trend, position_drift
from rcdiag.explain.state import ExplainState
from rcdiag.metrics.batch import BatchResult

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


# ===================================================================================== judgement thresholds
# Every finding's and detector's threshold, pinned from both sides: a value on the threshold, one just inside and
# one just outside. Expected judgements follow from the inputs' parameters (the ratios of a hand-built batch, the
# sums a detector reads, the k3_kl of each step) and the documented rule, never from rcdiag's own output.

WARNING = "warning"  # every finding below is a warning (docs/findings.md); asserted where each fires


def findings_of(report: rcdiag.Report) -> dict[str, rcdiag.Finding]:
    return {f.code: f for f in checked(report.findings)}


# the documented bound of every threshold finding: (metric, kind, bound, code); a constant changed in the catalogue
# fails here, whatever the docs say
THRESHOLD_FINDINGS = {
    ("kl", "max_abs", 0.1, "kl_high"),
    ("chi2_token", "max", 1.0, "chi2_token_high"),
    ("rollout_is_mean", "range", (0.5, 2.0), "is_mean_out_of_range"),
    ("rollout_is_eff_sample_size", "min", 0.3, "is_ess_low"),
    ("rollout_is_std", "max", 1.0, "is_std_high"),
    ("rollout_rs_masked_fraction", "max", 0.2, "rs_rejects_most_tokens"),
}


def test_threshold_findings_have_their_documented_bounds() -> None:
    found = {(spec.short, t.kind, t.bound, t.finding) for spec, t in thresholds_with_findings()}
    assert found == THRESHOLD_FINDINGS


def _sides(kind: str, bound: float | tuple[float, float]) -> list[tuple[float, bool]]:
    """(value, fires) on every bound of a threshold: on it (holds, every bound is inclusive), one float64 step
    inside (holds) and one step outside (fires)."""

    def around(b: float, outward: float) -> list[tuple[float, bool]]:
        return [(b, False), (math.nextafter(b, -outward), False), (math.nextafter(b, outward), True)]

    if kind == "range":
        lo, hi = bound  # type: ignore[misc]
        return around(lo, -math.inf) + around(hi, math.inf)
    assert isinstance(bound, float)
    if kind == "min":
        return around(bound, -math.inf)
    if kind == "max_abs":
        return around(bound, math.inf) + around(-bound, -math.inf)
    return around(bound, math.inf)


@pytest.mark.parametrize(("metric", "kind", "bound", "code"), sorted(THRESHOLD_FINDINGS, key=str), ids=lambda v: str(v))
def test_threshold_findings_on_their_bound(metric: str, kind: str, bound: float | tuple, code: str) -> None:
    """A batch whose metric sits exactly on, just inside and just outside the bound (the value handed to the
    rules directly: no dump puts a metric exactly on 0.1)."""
    for value, fires in _sides(kind, bound):
        metrics = {P + metric: value}
        result = BatchResult(metrics, {}, dict(metrics), (), 10, 100, 0)
        found = {f.code: f for f in evaluate([(None, result)], rcdiag.CorrectionConfig().resolve())}
        assert (code in found) == fires, (value, fires)
        if fires:
            assert (found[code].severity, found[code].value, found[code].threshold) == (WARNING, value, bound)
            assert found[code].metric == P + metric


def ratios(*groups: tuple[int, float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A padded batch of rows of 10 tokens: ``count`` tokens of each ratio pi_train/pi_rollout (then padding)."""
    flat = [r for count, r in groups for _ in range(count)]
    return rows_with_ratios([flat[i : i + 10] for i in range(0, len(flat), 10)])


def ess(a: float, rows: int) -> float:
    """ESS of sequence weights: one row of weight ``a``, the others 1: (sum w)^2 / (n sum w^2)."""
    return (a + rows - 1) ** 2 / (rows * (a * a + rows - 1))


SEQ_IS = {"rollout_is": "sequence", "rollout_is_threshold": 100.0}  # no truncation below a weight of 100
HEALTH_PAIRS = [
    # (id, rows of ratios, config, code, fires, the metric's value by hand)
    ("kl-inside", [[math.exp(-0.099)] * 10] * 4, {}, "kl_high", False, 0.099),
    ("kl-outside", [[math.exp(-0.101)] * 10] * 4, {}, "kl_high", True, 0.101),
    ("kl-negative-inside", [[math.exp(0.099)] * 10] * 4, {}, "kl_high", False, -0.099),
    ("kl-negative-outside", [[math.exp(0.101)] * 10] * 4, {}, "kl_high", True, -0.101),
    ("chi2-inside", [[math.sqrt(1.99)] * 10] * 4, {}, "chi2_token_high", False, 0.99),
    ("chi2-outside", [[math.sqrt(2.01)] * 10] * 4, {}, "chi2_token_high", True, 1.01),
    ("ess-inside", [[11.3]] + [[1.0]] * 9, SEQ_IS, "is_ess_low", False, ess(11.3, 10)),
    ("ess-outside", [[11.45]] + [[1.0]] * 9, SEQ_IS, "is_ess_low", True, ess(11.45, 10)),
    ("std-inside", [[0.2]] * 20 + [[2.18]] * 20, SEQ_IS, "is_std_high", False, 0.99),  # population std (b - a) / 2
    ("std-outside", [[0.2]] * 20 + [[2.22]] * 20, SEQ_IS, "is_std_high", True, 1.01),
    ("mean-high-inside", [[1.99]] * 4, SEQ_IS, "is_mean_out_of_range", False, 1.99),
    ("mean-high-outside", [[2.01]] * 4, SEQ_IS, "is_mean_out_of_range", True, 2.01),
    ("mean-low-inside", [[0.51]] * 4, SEQ_IS, "is_mean_out_of_range", False, 0.51),
    ("mean-low-outside", [[0.49]] * 4, SEQ_IS, "is_mean_out_of_range", True, 0.49),
]
HEALTH_METRIC = {
    "kl_high": "kl",
    "chi2_token_high": "chi2_token",
    "is_ess_low": "rollout_is_eff_sample_size",
    "is_std_high": "rollout_is_std",
    "is_mean_out_of_range": "rollout_is_mean",
}


@pytest.mark.parametrize(
    ("rows", "config", "code", "fires", "value"), [p[1:] for p in HEALTH_PAIRS], ids=[p[0] for p in HEALTH_PAIRS]
)
def test_health_findings_just_inside_and_outside(
    rows: list[list[float]], config: dict, code: str, fires: bool, value: float
) -> None:
    report = run_padded(*rows_with_ratios(rows), **config)
    assert report.metrics[P + HEALTH_METRIC[code]] == pytest.approx(value, rel=1e-5)
    found = findings_of(report)
    assert (code in found) == fires
    if fires:
        assert found[code].severity == WARNING and found[code].value == pytest.approx(value, rel=1e-5)


def test_is_mean_exactly_on_its_bounds_in_a_dump() -> None:
    """Weights exactly 2 (every ratio truncated at U = 2) and exactly 0.5 on average (IcePop zeroes half the
    tokens, the rest have ratio 1): both hold; U one float32 step above 2, or one more token zeroed, fires."""
    old, rollout, mask = ratios((8, 3.0))
    assert "is_mean_out_of_range" not in findings_of(run_padded(old, rollout, mask, rollout_is="token"))
    above = float(np.nextafter(np.float32(2.0), np.float32(3.0)))
    found = findings_of(run_padded(old, rollout, mask, rollout_is="token", rollout_is_threshold=above))
    assert found["is_mean_out_of_range"].value == above and found["is_mean_out_of_range"].severity == WARNING
    icepop = {"rollout_is": "token", "rollout_is_threshold": "0.5_2.0"}
    report = run_padded(*ratios((500, 1.0), (500, 3.0)), **icepop)
    assert report.metrics[P + "rollout_is_mean"] == 0.5 and "is_mean_out_of_range" not in findings_of(report)
    found = findings_of(run_padded(*ratios((499, 1.0), (501, 3.0)), **icepop))
    assert found["is_mean_out_of_range"].value == 0.499 and found["is_mean_out_of_range"].severity == WARNING


@pytest.mark.parametrize(("rejected", "kept", "codes"), [
    (1, 4, set()),  # 1 of 5 = 0.2 exactly: holds
    (1, 3, {"rs_rejects_most_tokens"}),  # 1 of 4
    (3, 1, {"rs_rejects_most_tokens"}),  # 3 of 4: most, not all
    (4, 0, {"rs_rejects_all_tokens"}),  # every token: the all-tokens finding alone
])  # fmt: skip
def test_rs_findings_on_both_sides(rejected: int, kept: int, codes: set[str]) -> None:
    report = run_padded(*ratios((rejected, 3.0), (kept, 1.0)), rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0")
    assert report.metrics[P + "rollout_rs_masked_fraction"] == rejected / (rejected + kept)
    found = findings_of(report)
    assert set(found) & {"rs_rejects_most_tokens", "rs_rejects_all_tokens"} == codes
    assert all(found[code].severity == WARNING for code in codes)


@pytest.mark.parametrize(("empty", "fires"), [(3, False), (4, True)])  # 3 of 6 rows: exactly half; 4 of 7
def test_mask_looks_inverted_on_both_sides(empty: int, fires: bool) -> None:
    found = findings_of(run_padded(*rows_with_ratios([[1.0]] * 3 + [[]] * empty)))
    assert ("mask_looks_inverted" in found) == fires
    if fires:
        assert found["mask_looks_inverted"].severity == WARNING


# ------------------------------------------------------------------------------------------------ detectors
# Each detector reads per-row-group sums (``rcdiag.explain``); the sums here are built from chosen per-group
# values, so the statistic each threshold applies to is known exactly (powers of two where it sits on the bound).

E = 2.0**-8  # an early-position k3_kl; late ones are multiples of it, so every ratio is exact


def drift_state(late_over_early: list[float], tokens: list[int] | None = None) -> ExplainState:
    """Row group g holds ``tokens[g]`` early tokens (positions [0, 32)) with k3_kl E and as many late tokens
    (positions [256, 512)) with k3_kl ``late_over_early[g]`` x E; the other groups hold nothing."""
    tokens = tokens or [1024] * len(late_over_early)
    state = ExplainState()
    sums = np.zeros((GROUPS, N_DOUBLING, len(SUMS)))
    for g, (ratio, n) in enumerate(zip(late_over_early, tokens, strict=True)):
        sums[g, 0, 0] = sums[g, 4, 0] = n
        sums[g, 0, SUMS.index("k3")] = n * E
        sums[g, 4, SUMS.index("k3")] = n * E * ratio
    state.breakdowns.position = sums
    return state


BELOW_3 = 3.0 * (1 - 2.0**-10)  # a ratio just below 3, exact in float64
DRIFT_CASES = [
    # (id, per-group late/early ratios, tokens per group, fires)
    # the share of groups above 2x, with 10 of 16 groups holding data: 8 of 10 is exactly 0.8 (fires), 7 is not;
    # a group at exactly 2x is not above it
    ("share-on-0.8", [4.0] * 8 + [2.0] * 2, None, True),
    ("share-below-0.8", [4.0] * 7 + [2.0] * 3, None, False),
    # the pooled ratio: exactly 3 (8 groups at 3.5, 2 at 1: (28 + 2) / 10) fires, a hair below does not
    ("pooled-on-3", [3.5] * 8 + [1.0] * 2, None, True),
    ("pooled-below-3", [3.5] * 8 + [1.0 - 2.0**-9] * 2, None, False),
    # the median group's ratio: exactly 3 fires, a hair below does not (the pooled ratio stays far above 3)
    ("median-on-3", [2.5, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 10.0, 10.0, 10.0], None, True),
    ("median-below-3", [2.5, *[BELOW_3] * 5, 3.0, 10.0, 10.0, 10.0], None, False),
    # groups with data: 8 fire, 7 do not
    ("eight-groups", [4.0] * 8, None, True),
    ("seven-groups", [4.0] * 7, None, False),
    # early tokens: 2000 fire, 1999 do not
    ("tokens-2000", [4.0] * 10, [200] * 10, True),
    ("tokens-1999", [4.0] * 10, [200] * 9 + [199], False),
]


@pytest.mark.parametrize(("ratios_", "tokens", "fires"), [c[1:] for c in DRIFT_CASES], ids=[c[0] for c in DRIFT_CASES])
def test_position_drift_thresholds(ratios_: list[float], tokens: list[int] | None, fires: bool) -> None:
    found = position_drift(drift_state(ratios_, tokens))
    assert (found is not None) == fires
    if found is not None:
        n = tokens or [1024] * len(ratios_)
        pooled = sum(r * k for r, k in zip(ratios_, n, strict=True)) / sum(n)
        assert found.evidence["ratio"] == pytest.approx(pooled, rel=1e-12)
        assert found.evidence["median_group_ratio"] == float(np.median(ratios_))
        assert found.evidence["groups_above"] == sum(r > 2.0 for r in ratios_) / len(ratios_)
        assert (found.code, found.severity, found.threshold) == ("position_drift", WARNING, 3.0)


@pytest.mark.parametrize(("late", "fires"), [(1.01e-5, True), (0.99e-5, False)])
def test_position_drift_floor(late: float, fires: bool) -> None:
    """Late k3_kl of 1e-5 is the floor below which growth is numerically negligible."""
    state = drift_state([4.0] * 10)
    sums = state.breakdowns.position
    sums[:10, 0, SUMS.index("k3")] = 1024 * late / 4
    sums[:10, 4, SUMS.index("k3")] = 1024 * late
    assert (position_drift(state) is not None) == fires


def offset_state(ratios_: list[float], up: int, down: int, n: int = 1024) -> ExplainState:
    """Row group g: ``n`` tokens with mean capped IS ratio ``ratios_[g]``, ``up`` of them scored higher by the
    rollout side (beyond the tolerance) and ``down`` lower."""
    state = ExplainState()
    for g, r in enumerate(ratios_):
        state.offset.sums[g] = [n, n * r, up, down]
    return state


SE_01 = 0.01 / math.sqrt(15)  # groups alternating at m +- 0.01: their standard error
OFFSET_CASES = [
    # (id, per-group mean ratios, up, down per 1024 tokens, fires)
    ("gap-outside", [0.98 - 1e-9] * 16, 512, 0, "rollout"),  # a gap of 0.02 from 1 is the bound (strict)
    ("gap-inside", [0.98 + 1e-9] * 16, 512, 0, None),
    ("trainer-outside", [1.02 + 1e-9] * 16, 0, 512, "trainer"),
    ("trainer-inside", [1.02 - 1e-9] * 16, 0, 512, None),
    ("scatter-outside", [0.98 - 3 * SE_01 + 0.01 - 1e-9, 0.98 - 3 * SE_01 - 0.01 - 1e-9] * 8, 512, 0, "rollout"),
    ("scatter-inside", [0.98 - 3 * SE_01 + 0.01 + 1e-9, 0.98 - 3 * SE_01 - 0.01 + 1e-9] * 8, 512, 0, None),
    ("share-on-0.25", [0.9] * 16, 320, 64, "rollout"),  # net 256 of 1024: the share holds on its bound
    ("share-below-0.25", [0.9] * 16, 320, 65, None),
    ("share-the-other-way", [0.9] * 16, 0, 512, None),  # gap and shifted tokens disagree in sign
    ("eight-groups", [0.9] * 8, 512, 0, "rollout"),
    ("seven-groups", [0.9] * 7, 512, 0, None),
]


@pytest.mark.parametrize(
    ("ratios_", "up", "down", "higher"), [c[1:] for c in OFFSET_CASES], ids=[c[0] for c in OFFSET_CASES]
)
def test_logprob_offset_thresholds(ratios_: list[float], up: int, down: int, higher: str | None) -> None:
    found = logprob_offset(offset_state(ratios_, up, down).offset)
    assert (found is None) == (higher is None)
    if found is None:
        return
    assert (found.code, found.severity, found.threshold) == ("logprob_offset", WARNING, 0.02)
    mean = float(np.mean(ratios_))
    assert found.evidence["mean_capped_ratio"] == pytest.approx(mean, rel=1e-12)
    assert found.evidence["share_shifted"] == abs(up - down) / 1024
    assert found.value == pytest.approx(abs(math.log(mean)), rel=1e-9)
    assert found.message.startswith(f"the {higher} side's log-probs sit systematically higher")


def trend(values: list[float]) -> list[tuple[int, dict[str, float | None]]]:
    return [(s, {P + "k3_kl": v}) for s, v in enumerate(values)]


def fitted(values: list[float]) -> tuple[float, float, float]:
    """Growth over the run, slope in standard errors and halves ratio, by numpy's least squares and medians."""
    x = np.arange(len(values), dtype=np.float64)
    (slope, _), cov = np.polyfit(x, np.log(values), 1, cov="unscaled")
    residual = np.log(values) - np.polyval([slope, _], x)
    se = math.sqrt(float((residual**2).sum()) / (len(values) - 2) * cov[0, 0])
    half = len(values) // 2
    return math.exp(slope * x[-1]), slope / se, float(np.median(values[-half:]) / np.median(values[:half]))


def _tilted(b: float, e: float) -> list[float]:
    """Six steps on log k3_kl = b s with residuals (e, -e, 0, 0, -e, e), orthogonal to the line: the fit's slope is
    b and its standard error e / sqrt(17.5)."""
    return [1e-4 * math.exp(b * s + e * r) for s, r in enumerate((1, -1, 0, 0, -1, 1))]


def _ends(b: float, lift: float = 0.3) -> list[float]:
    """Six steps on log k3_kl = b s, the first lowered and the last raised by ``lift``: the halves' medians (steps 1
    and 4) are e^(3b) apart, while the fit grows faster."""
    return [1e-4 * math.exp(b * s + lift * ((s == 5) - (s == 0))) for s in range(6)]


B8 = math.log(8) / 5  # 8x over six steps
TREND_CASES = [
    # (id, k3_kl per step, fires)
    ("growth-outside", [1e-4 * (2 * (1 + 1e-6)) ** (s / 3) for s in range(4)], True),  # 2x over the run fires
    ("growth-inside", [1e-4 * (2 * (1 - 1e-6)) ** (s / 3) for s in range(4)], False),
    ("t-outside", _tilted(B8, B8 * math.sqrt(17.5) / 4 * (1 - 1e-6)), True),  # 4 standard errors of the fit
    ("t-inside", _tilted(B8, B8 * math.sqrt(17.5) / 4 * (1 + 1e-6)), False),
    ("halves-outside", _ends(math.log(1.4) / 3 * (1 + 1e-6)), True),  # median of the later half 1.4x
    ("halves-inside", _ends(math.log(1.4) / 3 * (1 - 1e-6)), False),
]


def test_mismatch_trend_leaves_steps_at_the_rounding_floor_out_of_its_fit() -> None:
    """The tests' real model drifting from identical weights (k3_kl per step, measured): step 0 is float rounding.
    At the floor a step is left out (the rest fires); a hair above it, its logarithm drowns the growth."""
    drift = [1.36e-4, 5.11e-4, 1.278e-3, 2.437e-3, 3.67e-3, 5.784e-3, 6.702e-3]
    assert mismatch_trend(trend([TREND_K3_FLOOR, *drift])) is not None
    assert mismatch_trend(trend([5.7e-13, *drift])) is not None
    assert mismatch_trend(trend([math.nextafter(TREND_K3_FLOOR, 1.0), *drift])) is None


@pytest.mark.parametrize(("values", "fires"), [c[1:] for c in TREND_CASES], ids=[c[0] for c in TREND_CASES])
def test_mismatch_trend_thresholds(values: list[float], fires: bool) -> None:
    growth, t, halves = fitted(values)
    assert growth >= 2.0 * (1 - 2e-6) and t >= 4.0 * (1 - 2e-6) and halves >= 1.4 * (1 - 2e-6)  # one gate at a time
    found = mismatch_trend(trend(values))
    assert (found is not None) == fires
    if found is not None:
        assert (found.code, found.severity, found.threshold) == ("mismatch_trend", WARNING, 2.0)
        assert found.evidence["growth_over_run"] == pytest.approx(growth, rel=1e-9)
        assert found.evidence["halves_ratio"] == pytest.approx(halves, rel=1e-12)
        assert found.evidence["t"] is None or found.evidence["t"] == pytest.approx(t, rel=1e-6)


def test_logprob_offset_needs_2000_tokens() -> None:
    assert logprob_offset(offset_state([0.9] * 10, 100, 0, n=200).offset) is not None
    state = offset_state([0.9] * 10, 100, 0, n=200)
    state.offset.sums[9] = [199, 199 * 0.9, 100, 0]
    assert logprob_offset(state.offset) is None


# ------------------------------------------------------------------------------------------------ severities


def test_every_code_has_its_severity_written_out() -> None:
    assert set(SEVERITIES) == {spec.code for spec in FINDINGS}


def test_ess_zero_division_is_an_error_where_it_fires() -> None:
    """IcePop zeroes every weight (each ratio of 3 is outside [0.5, 2]): verl's ESS would divide by 0."""
    found = findings_of(run_padded(*ratios((4, 3.0)), rollout_is="token", rollout_is_threshold="0.5_2.0"))
    assert found["verl_crash_ess_zero_division"].severity == "error"
    assert "verl_crash_ess_zero_division" not in findings_of(
        run_padded(*ratios((3, 3.0), (1, 1.0)), rollout_is="token", rollout_is_threshold="0.5_2.0")
    )


# ------------------------------------------------------------------------------------------------ not computed

NOT_COMPUTED_PLAIN = {  # the checks whose metric needs IS or RS, which plain analyze does not turn on
    "verl_crash_ess_zero_division": P + "rollout_is_eff_sample_size",
    "is_mean_out_of_range": P + "rollout_is_mean",
    "is_ess_low": P + "rollout_is_eff_sample_size",
    "is_std_high": P + "rollout_is_std",
    "rs_rejects_all_tokens": P + "rollout_rs_masked_fraction",
    "rs_rejects_most_tokens": P + "rollout_rs_masked_fraction",
    "is_saturated": P + "rollout_is_ratio_fraction_high",
}
COMPUTED_PLAIN = {  # every other check of plain analyze (the bias detectors' rows: DETECTORS, below)
    "verl_crash_empty_batch", "mask_looks_inverted", "mask_missing", "kl_high", "chi2_token_high", "kl_k3_disagree",
    "logprob_neg_inf", "metric_not_finite", "temperature_recorded_mismatch", "kl_negative", "sparse_outliers",
    "seq_is_hopeless", "slice_concentrated", *SIGNATURE_CODES,
}  # fmt: skip


def checklist_rows(*args: str) -> dict[str, tuple[str, str]]:
    """``rcdiag analyze`` in a subprocess: each checklist row's code -> (mark, the rest of the row)."""
    env = {**os.environ, "COLUMNS": "250", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "rcdiag", "analyze", "--details", *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    text = done.stdout.split("Findings checklist", 1)[1]
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) == 4 and cells[2] in SEVERITIES:
            rows[cells[2]] = (cells[0], cells[3])
    return rows


def test_plain_analyze_marks_each_check_without_its_metric_not_computed() -> None:
    healthy = str(SAMPLES / "healthy.parquet")
    done = subprocess.run(
        [sys.executable, "-m", "rcdiag", "analyze", healthy, "--format", "json"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    )
    data = json.loads(done.stdout)
    assert data["findings"] == []
    assert not set(NOT_COMPUTED_PLAIN.values()) & set(data["metrics"])  # none of those metrics was computed
    assert {P + "kl", P + "chi2_token", P + "k3_kl"} <= set(data["metrics"])
    rows = checklist_rows(healthy)
    assert set(rows) == set(NOT_COMPUTED_PLAIN) | COMPUTED_PLAIN | set(DETECTORS)  # every analyze runs the detectors
    for code in NOT_COMPUTED_PLAIN:
        assert rows[code] == ("–", "not computed for this config"), code
    # token_specific needs --explain's by-token table (and token ids, which the sample lacks): "–" with why
    assert rows.pop("token_specific") == ("–", "not run: the dump has no token ids (--token-col NAME)")
    for code in COMPUTED_PLAIN | set(DETECTORS) - {"token_specific"}:
        assert rows[code] == ("✓", ""), code


def test_checks_with_their_metric_computed_are_checked() -> None:
    """With IS and RS on, the same rows are checked (and hold on the healthy sample); with --explain, the
    detectors' rows appear, checked, except one that could not run, which says why."""
    rows = checklist_rows(
        str(SAMPLES / "healthy.parquet"), "--is", "token", "--rs", "token_k1", "--rs-threshold", "0.5_2.0", "--explain"
    )
    assert set(rows) == set(NOT_COMPUTED_PLAIN) | COMPUTED_PLAIN | set(DETECTORS)
    # token_specific needs token ids, which the sample lacks: "–" with why, never a ✓ it did not earn
    assert rows.pop("token_specific") == ("–", "not run: the dump has no token ids (--token-col NAME)")
    assert all(mark == ("✓", "") for mark in rows.values()), rows


def kl_k3_batch(kl: float, k3: float, se: float = 0.0) -> BatchResult:
    metrics = {P + "kl": kl, P + "k3_kl": k3}
    extras = {"rcdiag/kl_std_error": se, "rcdiag/kl_std_error_dof": 1e9}
    return BatchResult(metrics, extras, {**metrics, **extras}, (), 10, 100, 0)


@pytest.mark.parametrize(
    ("kl", "k3", "fires"),
    [
        (0.01, 0.005, False),  # the gap exactly half the larger KL (0.01 - 0.01 / 2, exact): holds
        (0.01, math.nextafter(0.005, 0.0), True),
        (1e-5, 0.0, False),  # the gap exactly on the 1e-5 floor (above half the KL): holds
        (math.nextafter(1e-5, 1.0), 0.0, True),
        (-0.01, -0.005, False),  # the same, both negative (the bound is on |gap| against the larger |KL|)
        (-0.01, math.nextafter(-0.005, 0.0), True),
    ],
)
def test_kl_k3_disagree_on_its_relative_and_absolute_bounds(kl: float, k3: float, fires: bool) -> None:
    """No noise (standard error 0), so the gap is judged against half the larger KL and the absolute floor."""
    found = {f.code: f for f in evaluate([(None, kl_k3_batch(kl, k3))], rcdiag.CorrectionConfig().resolve())}
    assert ("kl_k3_disagree" in found) == fires
    if fires:
        assert found["kl_k3_disagree"].severity == WARNING
        assert found["kl_k3_disagree"].threshold == max(abs(kl) / 2, 1e-5)
