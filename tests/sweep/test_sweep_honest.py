"""sweep's recommendations never print a threshold beyond verl's clamp without a warning, and say when a target
cannot be met instead of printing a number (issue 24, item 2)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import run
from dumps24 import long_biased

from rcdiag.sweep.recommend import CLAMP_WEIGHT, unreachable, warnings

SEQUENCE_OPTIONS = {"is_sequence", *(f"seq_{a}_{k}" for a in ("sum", "mean") for k in ("k1", "k2", "k3"))}
SEQUENCE_OPTIONS |= {"seq_max_k2", "seq_max_k3"}


def sweep(capsys: pytest.CaptureFixture, path: Path, *args: str) -> tuple[dict, str]:
    code, out, err = run(capsys, "sweep", str(path), *args, "--format", "json", "-q")
    assert code == 0, err
    code, table, err = run(capsys, "sweep", str(path), *args)
    assert code == 0, err
    return json.loads(out), table


def test_a_target_below_one_response_is_said_not_printed(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    """24 responses: 1% is a quarter of a response, so no per-response threshold meets it."""
    result, table = sweep(capsys, long_biased(tmp_path / "d.parquet", rows=24, bias=0.05))
    recs = {r["option"]: r for r in result["recommendations"]}
    for option in SEQUENCE_OPTIONS:
        assert recs[option]["threshold"] is None, option
        assert recs[option]["unreachable"] == (
            "the target cannot be met: 0.01 of 24 responses is less than one response (it needs at least 100 responses)"
        )
    assert recs["token_k3"]["threshold"] is not None and recs["token_k3"]["unreachable"] is None  # 24,000 tokens
    assert table.count("cannot be met") >= len(SEQUENCE_OPTIONS)
    assert "rollout_rs: seq_sum_k1" not in table  # no YAML for an option without a threshold


def test_a_threshold_beyond_verls_clamp_is_flagged(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    """At 5% of 24 responses (one response), the sequence IS threshold is e^50-ish: beyond what verl can apply."""
    result, table = sweep(capsys, long_biased(tmp_path / "d.parquet", rows=24, bias=0.05), "--target-reject", "0.05")
    recs = {r["option"]: r for r in result["recommendations"]}
    assert float(recs["is_sequence"]["threshold"]) > CLAMP_WEIGHT
    assert any("beyond verl's clamp" in w for w in recs["is_sequence"]["warnings"])
    upper = float(recs["seq_sum_k1"]["threshold"].split("_")[1])
    assert math.log(upper) > 20 and any("beyond e^20" in w for w in recs["seq_sum_k1"]["warnings"])
    assert "WARNING is_sequence: beyond verl's clamp" in table.replace("\n", " ")
    for rec in result["recommendations"]:  # no threshold beyond the clamp goes unflagged
        if rec["threshold"] is not None and float(rec["threshold"].split("_")[-1]) > CLAMP_WEIGHT:
            assert rec["warnings"], rec


def test_unreachable_boundary_is_one_unit() -> None:
    assert unreachable(100, 0.01, "response") is None  # exactly one response
    assert unreachable(99, 0.01, "response") is not None
    assert unreachable(5, 0.2, "response") is None


def test_clamp_warnings_boundary() -> None:
    clamp = f"{CLAMP_WEIGHT:.9g}"
    above = f"{CLAMP_WEIGHT * 1.001:.9g}"
    assert not [w for w in warnings("is_sequence", clamp) if "clamp" in w]
    assert [w for w in warnings("is_sequence", above) if "clamp" in w]
    assert warnings("is_sequence", "2.0") == () and warnings("is_sequence", "10.0") == ()
    assert warnings("is_sequence", "10.5") == ("outside verl's typical range for is_sequence (2-10)",)
    assert warnings("seq_sum_k1", "0.5_2.0") == ()
    assert warnings("seq_sum_k1", f"{1 / CLAMP_WEIGHT / 1.001:.9g}_{above}")
    assert warnings("seq_max_k3", "94239940") == ("outside verl's typical range for seq_max_k3 (0.001-0.1)",)
