"""verl's five ``training/*`` debug metrics (``verl.utils.debug.metrics.calculate_debug_metrics``) against each
release's own function run on the same tensors (tests/verl_oracle.py), through the library and the real CLI.

rcdiag takes the probabilities and gaps in float32 as verl does and sums them in float64 (``rcdiag.metrics.debug``),
so verl's values lie within its float32 rounding of rcdiag's: a few units of 2^-23 of 1 (probabilities are at most
1) for the gaps' max, mean and std, 2e-5 for Pearson's r (float32 ``torch.corrcoef`` over thousands of pairs), and
rcdiag's within 2 units of 2^-23 of a float64 brute force. Chunk sizes, blocks, row splits and saved states
change nothing beyond float64 rounding. Bypass mode logs none of them; a batch without a valid token gives valid 0
and NaN from verl 0.8.0 on and raises in verl 0.7.1.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import ROOT, padded_chunk, ragged_lists, random_batch, run_padded, write_dump
from hostile import run_capped
from reference import debug
from verl_oracle import ORACLE_VERSIONS, require_verl, verl_debug_metrics

import rcdiag
from rcdiag.core.formulas import chan_merge_comoment, correlation
from rcdiag.metrics.base import CoMoments
from rcdiag.metrics.debug import DEBUG_KEYS

VERL = pytest.mark.verl
"""The tests that run verl's own code (a failure, not a skip, under CI=true when a release is missing)."""
F32_ULP = 2.0**-23
TOLERANCE = 8 * F32_ULP
"""verl's float32 error on the gaps' max, mean and std (inputs are probabilities, at most 1): a few ulps of 1."""
CORR_TOLERANCE = 2e-5
"""verl's float32 ``torch.corrcoef`` (its covariance a float32 matrix product) loses more than rounding over
thousands of pairs: 2.0e-6 at most on the sample dumps' pooled views."""
EXACT_TOLERANCE = 2 * F32_ULP
"""rcdiag against a float64 brute force: its probabilities and gaps are verl's float32 roundings (half an ulp of
at most 1 each), everything it sums is summed in float64 (so r too lies within that, not verl's 2e-6)."""
SAMPLES = ("healthy", "quantized_4bit", "outliers", "topk_offset")
"""Sample dumps (sample_data/make_samples.py): model-like log-probs, ragged responses, several steps."""


def _theirs(old: np.ndarray, rollout: np.ndarray, mask: np.ndarray, version: str) -> dict:
    """The release's own values on the padded tensors (each release's directory loaded, or the test fails under
    CI=true)."""
    torch = require_verl(version)
    tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in (old, rollout, mask.astype(np.int64))]
    return verl_debug_metrics(*tensors, version=version)


def _assert_close(ours: dict, theirs: dict) -> None:
    assert [k for k in ours if k.startswith("training/")] == list(DEBUG_KEYS) == list(theirs)
    for key, want in theirs.items():
        got = ours[key]
        if not math.isfinite(want):
            assert got is None, (key, got, want)
        else:
            tolerance = CORR_TOLERANCE if key.endswith("pearson_corr") else TOLERANCE
            assert got is not None and abs(got - want) <= tolerance, (key, got, want, got - want)


def _padded(path: Path, step: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A dump's rows (of one step) as padded float32 (B, T) arrays and an int64 mask."""
    table = pq.read_table(path).to_pydict()
    rows = [i for i, s in enumerate(table["step"]) if step is None or s == step]
    width = max(len(table["old_log_prob"][i]) for i in rows)
    old, rollout = np.zeros((len(rows), width), np.float32), np.zeros((len(rows), width), np.float32)
    mask = np.zeros((len(rows), width), np.int64)
    for r, i in enumerate(rows):
        n = len(table["old_log_prob"][i])
        old[r, :n], rollout[r, :n] = table["old_log_prob"][i], table["rollout_log_prob"][i]
        mask[r, :n] = table["response_mask"][i]
    return old, rollout, mask


def _cli_json(*args: str | Path) -> dict:
    done = run_capped("analyze", *args, "--format", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


# ------------------------------------------------------------------------------------------- the same tensors


@VERL
@pytest.mark.parametrize("version", ORACLE_VERSIONS)
@pytest.mark.parametrize("noise", [1e-3, 0.05, 0.5, 3.0])
def test_padded_batches_match_each_release(version: str, noise: float) -> None:
    """Ragged rows with padding, holes and empty rows, from a near-exact match to a gross mismatch."""
    old, rollout, mask = random_batch(np.random.default_rng(int(noise * 1000)), rows=40, width=60, noise=noise,
                                      empty_rows=4, hole_rate=0.15, outliers=0.02)  # fmt: skip
    ours = run_padded(old, rollout, mask, verl_version=version).metrics
    _assert_close(ours, _theirs(old, rollout, mask, version))
    assert ours["training/rollout_probs_diff_valid"] == 1.0
    assert 0.0 < ours["training/rollout_actor_probs_pearson_corr"] <= 1.0


@VERL
@pytest.mark.parametrize("version", ORACLE_VERSIONS)
def test_edge_batches_match_each_release(version: str) -> None:
    """One valid token (std and r NaN in verl: null here), -inf log-probs (probability 0), identical engines (gap
    0, r 1), a constant rollout probability (r NaN)."""
    one = np.array([[-0.5, -1.0], [-2.0, -3.0]], np.float32), np.array([[-0.7, -1.0], [-2.0, -3.0]], np.float32)
    cases = [
        (*one, np.array([[1, 0], [0, 0]])),
        (np.array([[-0.1, -np.inf, -3.0]], np.float32), np.array([[-np.inf, -0.2, -3.5]], np.float32), np.ones((1, 3))),
        (np.array([[-0.1, -0.4, -3.0]], np.float32), np.array([[-0.1, -0.4, -3.0]], np.float32), np.ones((1, 3))),
        (np.array([[-0.1, -0.4, -3.0]], np.float32), np.zeros((1, 3), np.float32), np.ones((1, 3))),
    ]
    for old, rollout, mask in cases:
        _assert_close(
            run_padded(old, rollout, mask, verl_version=version).metrics, _theirs(old, rollout, mask, version)
        )


@VERL
@pytest.mark.parametrize("version", ORACLE_VERSIONS)
def test_all_masked_batch_follows_each_release(version: str) -> None:
    """verl 0.8.0 on: valid 0 and NaN; verl 0.7.1 raises (a RuntimeError from torch.max), which rcdiag's crash note
    names. Rollout correction raises after it in every release: the batch's other metrics are null."""
    old, rollout, _ = random_batch(np.random.default_rng(3), rows=6, width=8)
    mask = np.zeros_like(old, dtype=np.int64)
    report = run_padded(old, rollout, mask, verl_version=version)
    ours = {k: v for k, v in report.metrics.items() if k.startswith("training/")}
    [crash] = report.findings
    assert crash.code == "verl_crash_empty_batch"
    if version == "0.7.1":
        with pytest.raises(RuntimeError, match="numel\\(\\) == 0"):
            _theirs(old, rollout, mask, version)
        assert ours == dict.fromkeys(DEBUG_KEYS) and "RuntimeError" in crash.message
    else:
        _assert_close(report.metrics, _theirs(old, rollout, mask, version))
        assert ours["training/rollout_probs_diff_valid"] == 0.0 and "ValueError" in crash.message


# ------------------------------------------------------------------------------- merging: chunks, rows, states


def test_comoment_merge_is_one_pass() -> None:
    """``chan_merge_comoment`` on parts equals the co-moment of all pairs; ``correlation`` equals numpy's."""
    rng = np.random.default_rng(9)
    x = rng.random(1001)
    y = 0.3 + 1e-3 * x + 1e-6 * rng.standard_normal(1001)  # r near 1, the spread far below the mean

    def moments(a: np.ndarray, b: np.ndarray) -> CoMoments:
        dx, dy = a - a.mean(), b - b.mean()
        return CoMoments(float(a.size), a.mean(), b.mean(), float(dx @ dx), float(dy @ dy), float(dx @ dy))

    whole = moments(x, y)
    merged = CoMoments()
    for part in np.array_split(np.arange(1001), [1, 2, 300, 301, 999]):
        merged = merged.merge(moments(x[part], y[part]))
    assert merged.n == whole.n and math.isclose(merged.c, whole.c, rel_tol=1e-12)
    assert math.isclose(merged.m2_y, whole.m2_y, rel_tol=1e-12)
    want = float(np.corrcoef(x, y)[0, 1])
    assert math.isclose(correlation(merged.m2_x, merged.m2_y, merged.c), want, rel_tol=1e-12)
    assert chan_merge_comoment(2.0, 0.0, 1.0, 0.0, 2.0, 1.0, 3.0, 0.0) == 2.0  # pairs (0,1),(0,1),(1,3),(1,3)
    assert math.isnan(correlation(0.0, 1.0, 0.0)) and correlation(1.0, 1.0, 1.0 + 1e-15) == 1.0


def test_row_splits_and_blocks_change_nothing() -> None:
    """The same rows as one chunk, as chunks of 1 to 17 rows, and read in blocks of 50 tokens: equal to float64
    rounding (every moment is merged by Chan's update)."""
    old, rollout, mask = random_batch(np.random.default_rng(21), rows=48, width=50, noise=0.2, empty_rows=5)
    one = run_padded(old, rollout, mask).metrics
    for rows in (1, 5, 17):
        chunks = [
            padded_chunk(old[a : a + rows], rollout[a : a + rows], mask[a : a + rows]) for a in range(0, 48, rows)
        ]
        for chunk_tokens in (50, 1 << 20):
            split = rcdiag.analyze_chunks(chunks, rcdiag.CorrectionConfig(), chunk_tokens=chunk_tokens).metrics
            for key in DEBUG_KEYS:
                assert math.isclose(split[key], one[key], rel_tol=1e-12, abs_tol=1e-15), (rows, key)


@VERL
@pytest.mark.parametrize("sample", SAMPLES)
def test_cli_per_step_matches_verl_at_every_chunk_size(sample: str) -> None:
    """End to end on model-like dumps: ``rcdiag analyze --format json`` at several ``--chunk-tokens``, each step
    and the pooled view against verl 0.9.0 on that step's (that dump's) padded tensors, and the values equal across
    chunk sizes to float64 rounding."""
    path = ROOT / "sample_data" / f"{sample}.parquet"
    reports = [_cli_json(path, "--chunk-tokens", str(n)) for n in (1, 333, 4096, 1 << 20)]
    first = reports[0]
    for step in first["steps"]:
        _assert_close(step["metrics"], _theirs(*_padded(path, step["step"]), "0.9.0"))
    _assert_close(first["metrics"], _theirs(*_padded(path), "0.9.0"))
    exact = debug(*(a.astype(np.float64) for a in _padded(path)[:2]), _padded(path)[2].astype(bool))
    for key in DEBUG_KEYS:  # float64 brute force (numpy's own functions): float32 probabilities, float64 sums
        assert abs(first["metrics"][key] - exact[key]) <= EXACT_TOLERANCE, (key, first["metrics"][key], exact[key])
    for report in reports[1:]:
        for ours, base in [(report["metrics"], first["metrics"])] + [
            (s["metrics"], b["metrics"]) for s, b in zip(report["steps"], first["steps"], strict=True)
        ]:
            for key in DEBUG_KEYS:
                assert math.isclose(ours[key], base[key], rel_tol=1e-12, abs_tol=1e-15), (sample, key)


def test_saved_states_merge_to_the_whole_dump(tmp_path: Path) -> None:
    """Two shards' ``--save-state`` merged by ``rcdiag merge`` give the whole dump's values; a state whose
    co-moment is damaged is refused (exit 2, one line naming the file and the field)."""
    old, rollout, mask = random_batch(np.random.default_rng(5), rows=30, width=40, noise=0.3)
    columns = ragged_lists(old, rollout, mask)
    whole = write_dump(tmp_path / "whole.parquet", columns)
    states = []
    for i, rows in enumerate((slice(0, 13), slice(13, 30))):
        part = write_dump(tmp_path / f"part{i}.parquet", {k: v[rows] for k, v in columns.items()})
        states.append(tmp_path / f"part{i}.state.json")
        _cli_json(part, "--save-state", states[-1])
    done = run_capped("merge", *states, "--format", "json")
    assert done.returncode == 0, done.stderr
    merged, direct = json.loads(done.stdout)["metrics"], _cli_json(whole)["metrics"]
    for key in DEBUG_KEYS:
        assert math.isclose(merged[key], direct[key], rel_tol=1e-12, abs_tol=1e-15), key

    saved = json.loads(states[0].read_text())
    text = json.dumps(saved)
    assert '"kind": "DebugMetrics"' in text
    damaged = tmp_path / "damaged.state.json"
    damaged.write_text(_break_comoments(saved))
    done = run_capped("merge", damaged, states[1], "--format", "json")
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("rcdiag: error: "), done.stderr
    assert "damaged.state.json" in done.stderr and "DebugMetrics.probs" in done.stderr, done.stderr


def _break_comoments(state: object) -> str:
    """The state with the DebugMetrics co-moments cut to three numbers."""

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if node.get("kind") == "DebugMetrics":
                node["state"]["probs"] = node["state"]["probs"][:3]
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(state)
    return json.dumps(state)


# ------------------------------------------------------------------------------------------ modes and releases


def test_bypass_mode_logs_no_debug_metrics(tmp_path: Path) -> None:
    """verl computes them only where it recomputes old_log_probs: never in bypass mode, in no step."""
    old, rollout, mask = random_batch(np.random.default_rng(8), rows=12, width=20)
    columns = ragged_lists(old, rollout, mask)
    columns["step"] = [i % 2 for i in range(12)]
    path = write_dump(tmp_path / "dump.parquet", columns)
    decoupled, bypass = _cli_json(path), _cli_json(path, "--preset", "bypass_ppo_clip")
    assert [k for k in decoupled["metrics"] if k.startswith("training/")] == list(DEBUG_KEYS)
    assert list(decoupled["metrics"])[:5] == list(DEBUG_KEYS)  # verl logs them before rollout correction
    assert all(list(s["metrics"])[:5] == list(DEBUG_KEYS) for s in decoupled["steps"])
    assert not [k for k in bypass["metrics"] if k.startswith("training/")]
    assert not [k for s in bypass["steps"] for k in s["metrics"] if k.startswith("training/")]
    assert bypass["metrics"] == {k: v for k, v in decoupled["metrics"].items() if k.startswith("rollout_corr/")}


def test_cli_empty_step_under_each_release(tmp_path: Path) -> None:
    """A step whose rows are all masked, through the CLI: verl 0.7.1 raises in calculate_debug_metrics (every key
    null, the crash note says so); 0.9.1 gives valid 0. The other step is unaffected."""
    old, rollout, mask = random_batch(np.random.default_rng(4), rows=10, width=12, empty_rows=0)
    mask[5:] = 0
    columns = ragged_lists(old, rollout, mask)
    columns["step"] = [0] * 5 + [1] * 5
    path = write_dump(tmp_path / "dump.parquet", columns)
    old_release, new_release = _cli_json(path, "--verl-version", "0.7.1"), _cli_json(path)
    for report in (old_release, new_release):
        assert report["steps"][0]["metrics"]["training/rollout_probs_diff_valid"] == 1.0
    assert [report["steps"][1]["metrics"][k] for k in DEBUG_KEYS for report in [old_release]] == [None] * 5
    assert [new_release["steps"][1]["metrics"][k] for k in DEBUG_KEYS] == [0.0] + [None] * 4
    [crash] = [f for f in old_release["findings"] if f["code"] == "verl_crash_empty_batch"]
    assert "RuntimeError" in crash["message"] and "calculate_debug_metrics" in crash["message"]
    [crash] = [f for f in new_release["findings"] if f["code"] == "verl_crash_empty_batch"]
    assert "ValueError" in crash["message"]
    assert not [f for f in new_release["findings"] if f["code"] == "metric_not_finite"]


def test_check_rules_read_the_keys(tmp_path: Path) -> None:
    """``rcdiag check`` resolves a ``training/`` key as written (exit 1 when the rule fails, 0 when it holds)."""
    old, rollout, mask = random_batch(np.random.default_rng(2), rows=12, width=20, noise=0.5)
    path = write_dump(tmp_path / "dump.parquet", ragged_lists(old, rollout, mask))
    value = run_padded(old, rollout, mask).metrics["training/rollout_probs_diff_max"]
    failing = run_capped("check", path, "--max", f"training/rollout_probs_diff_max={value / 2}")
    holding = run_capped("check", path, "--max", f"training/rollout_probs_diff_max={value * 2}")
    assert (failing.returncode, holding.returncode) == (1, 0), (failing.stderr, holding.stderr)


def test_torch_backend_agrees_with_numpy() -> None:
    """The array path on torch (``TorchBackend``, here on the CPU; a GPU runs the same operations) gives numpy's
    values to float32 rounding: the two libraries' float32 ``exp`` differ in the last bit or two."""
    pytest.importorskip("torch")
    from rcdiag.metrics.backend import TorchBackend

    old, rollout, mask = random_batch(np.random.default_rng(1), rows=30, width=40, noise=0.2, empty_rows=3)
    chunks = [padded_chunk(old[a : a + 7], rollout[a : a + 7], mask[a : a + 7]) for a in range(0, 30, 7)]
    numpy_path = rcdiag.analyze_chunks(chunks, rcdiag.CorrectionConfig()).metrics
    torch_path = rcdiag.analyze_chunks(chunks, rcdiag.CorrectionConfig(), device=TorchBackend("cpu")).metrics
    for key in DEBUG_KEYS:
        assert abs(torch_path[key] - numpy_path[key]) <= EXACT_TOLERANCE, key
