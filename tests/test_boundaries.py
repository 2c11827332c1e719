"""Values exactly on every bound: k1 both sides (inclusive), k2/k3 upper (inclusive), IS truncation and the ratio
fractions (strict), IcePop both sides (inclusive). Each token is its own row, with a float32 log-ratio d that puts
its statistic exactly on the float32 bound verl compares against, or one float32 step beyond it. The expected
values are counted by hand, and checked against verl v0.9.0 itself."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import run_padded
from test_scenarios import rows_with_ratios
from verl_oracle import require_verl, verl_metrics

import rcdiag
from rcdiag.catalogue.metrics import thresholds_with_findings
from rcdiag.health import evaluate
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
    return {f.code: f for f in report.findings}


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
