"""``framework_drops_gradient`` per step: a run whose pooled readings hold but where a step loses most of its gradient.

The real model's bf16 run with its last step's rollout 4-bit (tests/gradient_dumps.py ``one_bad_step``), under TRL's
default ``sequence_mask``: the step's readings, from TRL's own code run on its rows, fail the bounds while the
pooled ones hold, and the finding names that step and its values. A step exactly on a bound holds (a hand-built
dump); the clean scenarios stay quiet under every framework's defaults with the per-step rule on
(test_framework_drops_gradient.py, 0 of 56)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import run
from framework_cases import all_rows, dump_rows, padded, readings
from framework_oracles import require, token_weights
from gradient_dumps import BAD_STEP, one_bad_step

import rcdiag
from rcdiag.catalogue.findings import Code
from rcdiag.frameworks.gradient import ESS_FLOOR, WEIGHT_MEAN_MIN, ZEROED_MAX

CODE = Code.FRAMEWORK_DROPS_GRADIENT


def _trl_readings(rows: list) -> dict[str, float | None]:
    """rcdiag's five readings of TRL's default correction on ``rows``, from the weights TRL's own code puts."""
    old, rollout, mask = padded(rows)
    return readings(token_weights("trl", {}, old, rollout, mask), mask)


def _holds(values: dict[str, float | None]) -> bool:
    weight_mean, zeroed, ess = values["weight_mean"], values["zeroed_fraction"], values["ess"]
    assert weight_mean is not None and zeroed is not None and ess is not None
    return weight_mean >= WEIGHT_MEAN_MIN and zeroed <= ZEROED_MAX and ess >= ESS_FLOOR


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_bad_step_is_named_though_the_pool_holds(seed: int, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    require("trl")
    path = one_bad_step(seed, tmp_path)
    steps = dump_rows(path)
    pooled, bad = _trl_readings(all_rows(steps)), _trl_readings(steps[BAD_STEP])
    assert _holds(pooled) and not _holds(bad)  # the oracle's view: only the step fails
    assert all(_holds(_trl_readings(steps[step])) for step in steps if step != BAD_STEP)
    code, out, _ = run(capsys, "analyze", path, "--as", "trl", "--format", "json", "-q")
    found = [f for f in json.loads(out)["findings"] if f["code"] == CODE]
    assert code == 0 and len(found) == 1  # one finding, not one per step
    item = found[0]
    assert item["steps"] == [BAD_STEP] and item["metric"] == "rcdiag/trl/weight_mean" and item["threshold"] == 0.5
    weight_mean, ess = bad["weight_mean"], bad["ess"]
    assert weight_mean is not None and ess is not None
    assert math.isclose(item["value"], weight_mean, rel_tol=2e-6)
    assert f"at 1 of 4 steps ({BAD_STEP}) though not pooled over the dump; worst at step {BAD_STEP}" in item["message"]
    assert f"weight mean {weight_mean:.3g} < 0.5" in item["message"]
    assert f"ESS of the weights {ess:.3g} < 0.3" in item["message"]
    # the text report's next steps name it too
    code, out, _ = run(capsys, "analyze", path, "--as", "trl")
    assert code == 0 and f"WARNING [{CODE}]" in out and f"the configured correction: {CODE}" in out


def _stepped_one_token_rows(path: Path, steps: dict[int, list[float]]) -> Path:
    """Responses of one token each, old log-prob -0.1, at these rollout log-probs, by step."""
    rows = [(step, value) for step, values in steps.items() for value in values]
    table = pa.table(
        {
            "old_log_prob": [[-0.1]] * len(rows),
            "rollout_log_prob": [[value] for _, value in rows],
            "response_mask": [[1]] * len(rows),
            "step": [step for step, _ in rows],
        }
    )
    pq.write_table(table, path)
    return path


def test_a_step_exactly_on_the_bounds_does_not_fire(tmp_path: Path) -> None:
    # TRL's sequence_mask on one-token responses: weight exp(old - rollout) at ratio 1, 0 beyond exp(4.9) > 3.
    # Step 0: weights [1, 0]: mean 0.5, zeroed 0.5, ESS 1 / (2 * 1) = 0.5, on the bounds; step 1: [1, 1, 1, 1].
    on_bounds = _stepped_one_token_rows(tmp_path / "on.parquet", {0: [-0.1, -5.0], 1: [-0.1] * 4})
    on = rcdiag.analyze(on_bounds, framework="trl")
    step = on.sections["framework"].step_metrics(0).extras
    assert (step["rcdiag/trl/weight_mean"], step["rcdiag/trl/zeroed_fraction"]) == (0.5, 0.5)
    assert CODE not in {f.code for f in on.findings}
    # Step 0 with one more masked response: [1, 0, 0], mean 1/3, 2/3 zeroed, ESS 1/3; the pool [1, 0, 0, 1, 1, 1, 1]
    # keeps 5/7 of the weight with 2/7 zeroed and an ESS of 5/7: only step 0 fires.
    off = rcdiag.analyze(
        _stepped_one_token_rows(tmp_path / "off.parquet", {0: [-0.1, -5.0, -5.0], 1: [-0.1] * 4}), framework="trl"
    )
    pooled = off.sections["framework"].pooled.extras
    assert pooled["rcdiag/trl/weight_mean"] == pytest.approx(5 / 7) and pooled["rcdiag/trl/ess"] == pytest.approx(5 / 7)
    found = next(f for f in off.findings if f.code == CODE)
    assert found.steps == (0,) and found.value == pytest.approx(1 / 3)
    assert "at 1 of 2 steps (0) though not pooled over the dump; worst at step 0" in found.message
    assert "weight mean 0.333 < 0.5; 66.7% of the tokens zeroed > 50%" in found.message
    assert "ESS of the weights" not in found.message  # 1/3 holds the 0.3 bound


def test_a_pooled_failure_stays_one_finding_about_the_whole_dump(tmp_path: Path) -> None:
    # both steps fail and so does the pool: the finding is the pooled one (no steps), as before the per-step rule
    report = rcdiag.analyze(
        _stepped_one_token_rows(tmp_path / "both.parquet", {0: [-0.1, -5.0, -5.0], 1: [-0.1, -5.0, -5.0]}),
        framework="trl",
    )
    found = [f for f in report.findings if f.code == CODE]
    assert len(found) == 1 and found[0].steps is None and "on this dump" in found[0].message
