"""The shape detectors find what is planted in real-model dumps, and their thresholds hold exactly at their limits.

temperature_mismatch: a rollout at T = 0.9 (kl ~5e-3 on ~44k tokens) and T = 0.7 (sharper), and at T = 1.2
(flatter), each with the trainer at T = 1. sampling_truncation: top-k 50 of 256 and top-p 0.95 renormalised on
the rollout side. Each fires on its own dumps, for several seeds, and not on the other's.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow.parquet as pq
import pytest
from severities import WARNING
from shape_dumps import FLATTER, detector_findings, dump

from rcdiag.explain import detectors
from rcdiag.explain.detectors import (
    FLAT_MIN_MOVED,
    FLAT_SHARE_MIN,
    MIN_BUCKET_TOKENS,
    MIN_RESPONSES,
    TEMPERATURE_MIN_SHIFT,
    TRUNCATION_MIN_DEFICIT,
    TRUNCATION_SHARE_MIN,
    not_run,
    sampling_truncation,
    shape_critical,
    temperature_mismatch,
)
from rcdiag.explain.state import ExplainState
from rcdiag.explain.statistics import LIKELY, UNLIKELY, OffsetSums, ShapeSums

SEEDS = [0, 1]
PLANTED = [
    ("temperature_0.9", "temperature_mismatch", "sharper"),
    ("temperature_0.7", "temperature_mismatch", "sharper"),
    (FLATTER, "temperature_mismatch", "flatter"),
    ("topk_50", "sampling_truncation", None),
    ("topp_0.95", "sampling_truncation", None),
]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("scenario", "code", "direction"), PLANTED)
def test_planted_cause_fires_its_detector_only(scenario: str, code: str, direction: str | None, seed: int) -> None:
    found = detector_findings(dump(scenario, seed))
    assert set(found) == {code}
    finding = found[code]
    assert finding.severity == WARNING
    if direction is not None:
        assert finding.evidence["direction"] == direction
        assert f"is {direction} than the trainer's" in finding.message


def columns(path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flat old and rollout log-probs (float64) and each token's response."""
    table = pq.read_table(path)
    old = table.column("old_log_prob").combine_chunks()
    rollout = table.column("rollout_log_prob").combine_chunks()
    lengths = np.diff(np.asarray(old.offsets))
    response = np.repeat(np.arange(len(lengths)), lengths)
    return old.values.to_numpy().astype(np.float64), rollout.values.to_numpy().astype(np.float64), response


def test_temperature_evidence_is_the_brute_force_means() -> None:
    """T = 0.9: the unlikely tokens' mean log-ratio and its standard error (responses as clusters) by numpy."""
    path = dump("temperature_0.9", 0)
    old, rollout, response = columns(path)
    d = old - rollout
    finding = detector_findings(path)["temperature_mismatch"]
    for name, chosen in (("unlikely", np.exp(old) < UNLIKELY), ("likely", np.exp(old) >= LIKELY)):
        sums = np.bincount(response, weights=np.where(chosen, d, 0.0))
        counts = np.bincount(response, weights=chosen.astype(float))
        mean = sums.sum() / counts.sum()
        se = math.sqrt(((sums - mean * counts) ** 2).sum()) / counts.sum()
        assert finding.evidence[f"log_ratio_{name}"] == pytest.approx(mean, rel=1e-6)
        assert finding.evidence[f"std_error_{name}"] == pytest.approx(se, rel=1e-6)
        assert finding.evidence[f"tokens_{name}"] == int(counts.sum())
    assert finding.evidence["log_ratio_unlikely"] > 5 * TEMPERATURE_MIN_SHIFT  # ~0.12 nats
    assert finding.value == finding.evidence["log_ratio_unlikely"]


def test_truncation_evidence_is_the_missing_mass() -> None:
    """Top-k 50: every sampled token's rollout log-prob is the trainer's minus log(kept mass), so the mean ratio
    pi_train / pi_rollout is the mean kept mass; brute force over the tokens."""
    path = dump("topk_50", 0)
    old, rollout, _ = columns(path)
    d = old - rollout
    assert (d <= 1e-4).all()  # float32 rounding at most: the rollout never scores a token lower
    finding = detector_findings(path)["sampling_truncation"]
    ratio = np.minimum(np.exp(d), math.exp(3.0))
    assert finding.evidence["missing_mass"] == pytest.approx(1.0 - ratio.mean(), rel=1e-5)
    assert 0.015 < finding.value < 0.03
    assert finding.evidence["log_ratio_unlikely"] < 10 * finding.evidence["log_ratio_likely"] < 0


# ------------------------------------------------------------------------------------------------ boundaries

CRITICAL = 4.0
"""``shape_critical`` patched to this round value, so that a statistic can sit on it exactly."""


BELOW_CRITICAL = CRITICAL * (1 - 1e-9)


@pytest.fixture
def round_critical(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(detectors, "shape_critical", lambda responses: CRITICAL)


def cluster(mean: float, z: float, tokens: float = 1024.0, responses: int = 64) -> list[float]:
    """Cluster sums (n, s, ss, ns, nn) of ``responses`` responses of equal length whose token mean is ``mean`` and
    is ``z`` standard errors from 0: s = mean n and ns = mean nn cancel the cross terms, so the variance is
    ss - mean^2 nn exactly; with powers of two every step is exact."""
    n = tokens
    nn = n * n / responses
    se = abs(mean) / z if z else 1.0
    return [n, mean * n, mean * mean * nn + (se * n) ** 2, mean * nn, nn]


def shape(unlikely: list[float], likely: list[float], ratio: list[float], up: float = 0, down: float = 0) -> ShapeSums:
    out = ShapeSums()
    out.sums[:] = [*unlikely, *likely, *ratio, up, down]
    return out


NO_DEFICIT = cluster(0.0, 0.0, tokens=4096.0)


def sharper(unlikely_mean: float = 0.125, unlikely_z: float = 8.0, likely_z: float = 8.0) -> ShapeSums:
    return shape(cluster(unlikely_mean, unlikely_z), cluster(-0.0078125, likely_z), NO_DEFICIT)


def test_cluster_helper_is_exact() -> None:
    mean = shape(cluster(0.5, CRITICAL), NO_DEFICIT, NO_DEFICIT).mean("unlikely")
    assert (mean.mean, mean.z(), mean.tokens, mean.responses) == (0.5, CRITICAL, 1024.0, 64.0)


@pytest.mark.usefixtures("round_critical")
@pytest.mark.parametrize(
    ("state", "fires"),
    [
        (sharper(), True),
        (sharper(unlikely_mean=TEMPERATURE_MIN_SHIFT), True),  # exactly the minimum shift fires
        (sharper(unlikely_mean=math.nextafter(TEMPERATURE_MIN_SHIFT, 0.0)), False),
        (sharper(unlikely_z=CRITICAL), True),  # exactly the critical value fires
        (sharper(unlikely_z=BELOW_CRITICAL), False),
        (sharper(likely_z=CRITICAL), True),
        (sharper(likely_z=BELOW_CRITICAL), False),
    ],
)
def test_temperature_sharper_thresholds(state: ShapeSums, fires: bool) -> None:
    found = temperature_mismatch(state)
    assert (found is not None) == fires
    if found is not None:
        assert (found.code, found.threshold, found.evidence["direction"]) == (
            "temperature_mismatch",
            TEMPERATURE_MIN_SHIFT,
            "sharper",
        )
        assert found.value == state.mean("unlikely").mean


def flatter(down: float = 100.0, up: float = 0.0) -> ShapeSums:
    return shape(cluster(-0.25, 8.0), cluster(0.015625, 8.0), NO_DEFICIT, up=up, down=down)


@pytest.mark.usefixtures("round_critical")
@pytest.mark.parametrize(
    ("state", "fires"),
    [
        (flatter(down=95, up=5), True),  # exactly FLAT_SHARE_MIN fires
        (flatter(down=94, up=6), False),
        (flatter(down=FLAT_MIN_MOVED), True),  # exactly FLAT_MIN_MOVED moved likely tokens
        (flatter(down=FLAT_MIN_MOVED - 1), False),
        (shape(cluster(-0.25, CRITICAL), cluster(0.015625, 8.0), NO_DEFICIT, down=100), True),
        (shape(cluster(-0.25, BELOW_CRITICAL), cluster(0.015625, 8.0), NO_DEFICIT, down=100), False),
    ],
)
def test_temperature_flatter_thresholds(state: ShapeSums, fires: bool) -> None:
    assert FLAT_SHARE_MIN == 0.95 and FLAT_SHARE_MIN == 95 / 100
    found = temperature_mismatch(state)
    assert (found is not None) == fires
    if found is not None:
        assert (found.evidence["direction"], found.threshold) == ("flatter", FLAT_SHARE_MIN)


def truncated(deficit: float = 0.03125, z: float = 8.0, up: float = 512.0, n: float = 4096.0) -> ExplainState:
    """A state whose rollout lost ``deficit`` of the mass, unlikely tokens at -0.125 nats, likely at -0.001; ``up``
    of ``n`` tokens (in one hash group) scored higher by the rollout."""
    state = ExplainState()
    state.shape = shape(cluster(-0.125, 8.0), cluster(-0.0009765625, 8.0), cluster(-deficit, z, tokens=n))
    state.offset = OffsetSums()
    state.offset.sums[0] = [n, n * (1 - deficit), up, 0.0]
    return state


@pytest.mark.usefixtures("round_critical")
@pytest.mark.parametrize(
    ("state", "fires"),
    [
        (truncated(), True),
        (truncated(deficit=TRUNCATION_MIN_DEFICIT, n=2048.0, up=200.0), True),  # exactly the minimum deficit
        (truncated(deficit=math.nextafter(TRUNCATION_MIN_DEFICIT, 0.0), n=2048.0, up=200.0), False),
        (truncated(z=CRITICAL), True),
        (truncated(z=BELOW_CRITICAL), False),
        (truncated(up=TRUNCATION_SHARE_MIN * 4000, n=4000.0), True),  # exactly the minimum net share
        (truncated(up=TRUNCATION_SHARE_MIN * 4000 - 1, n=4000.0), False),
    ],
)
def test_truncation_thresholds(state: ExplainState, fires: bool) -> None:
    found = sampling_truncation(state.shape, state.offset)
    assert (found is not None) == fires
    if found is not None:
        assert (found.code, found.severity, found.threshold) == ("sampling_truncation", WARNING, 0.003)


@pytest.mark.usefixtures("round_critical")
def test_truncation_needs_the_deficit_where_the_trainer_is_unsure() -> None:
    """A constant offset (the same shift on unlikely and likely tokens) is not a truncation."""
    state = truncated()
    state.shape.sums[5:10] = cluster(-0.125, 8.0)
    assert sampling_truncation(state.shape, state.offset) is None


def test_shape_detectors_need_tokens_and_responses_in_both_sets() -> None:
    assert MIN_BUCKET_TOKENS == 200 and MIN_RESPONSES == 20
    assert temperature_mismatch(
        shape(cluster(0.125, 8.0, tokens=256.0, responses=32), cluster(-0.0078125, 8.0), NO_DEFICIT)
    )
    few_tokens = shape(cluster(0.125, 8.0, tokens=199.0, responses=1), cluster(-0.0078125, 8.0), NO_DEFICIT)
    assert temperature_mismatch(few_tokens) is None
    few_responses = shape(cluster(0.125, 8.0, tokens=256.0, responses=16), cluster(-0.0078125, 8.0), NO_DEFICIT)
    assert temperature_mismatch(few_responses) is None
    state = ExplainState()
    state.shape = few_responses
    reasons = not_run(state, [])
    assert reasons["temperature_mismatch"] == "not run: 16 effective responses with tokens at trainer p < 0.1, needs 20"
    assert reasons["sampling_truncation"] == reasons["temperature_mismatch"]


def test_critical_value_keeps_the_false_alarm_rate() -> None:
    """Student's t one-sided at 1e-4 / 2: 3.89 standard errors for many responses, more for few."""
    from statistics import NormalDist

    assert shape_critical(1e6) == pytest.approx(
        NormalDist().inv_cdf(1 - detectors.SHAPE_FALSE_ALARM_RATE / 2), rel=1e-4
    )
    assert shape_critical(21) > shape_critical(300) > 3.89
