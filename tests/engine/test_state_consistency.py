"""Issue 32 (engine and state items), through the real CLI in subprocesses: steps of every integer type stay exact
(uint64 included) from the dump to the JSON, the text and the state files, or are refused in one line where an
output cannot hold them; a state whose counts contradict each other, or whose kind is not the one its contents or
its reader expect, is refused naming the file and both counts or kinds; a float64 value beyond float32 is read as
docs/input.md says without a warning on stderr; repeated rule packs and identical rules are checked once."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.conftest import SAMPLES, write_dump
from tests.hostile import Result, run_capped

ROWS = [[-1.0, -2.0, -0.5], [-0.3, -0.2], [-1.5], [-0.7, -0.1, -0.2, -0.9]]
ROLLOUT = [[-1.1, -2.0, -0.4], [-0.3, -0.25], [-1.4], [-0.7, -0.1, -0.3, -0.9]]
MASKS = [[1, 1, 1], [1, 1], [1], [1, 1, 0, 1]]
HUGE = [5, 2**63, 2**64 - 1, 2**63]
"""uint64 steps: one below int64's top, two at and beyond it (int64 would read them as negative)."""


def one_line_error(done: Result, code: int = 2) -> str:
    """The run's exit code is ``code`` and stderr is one ``rcdiag: error:`` line, no traceback."""
    assert done.returncode == code, (done.returncode, done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rcdiag: error: "), done.stderr
    return lines[0]


def uint64_dump(path: Path, steps: list[int] = HUGE) -> Path:
    return write_dump(
        path,
        {"old_log_prob": ROWS, "rollout_log_prob": ROLLOUT, "response_mask": MASKS, "step": steps},
        types={"step": pa.uint64()},
    )


def report_json(*args: str | Path) -> dict[str, Any]:
    done = run_capped(*args, "--format", "json")
    assert done.returncode in (0, 1), done.stderr
    assert done.stderr == ""
    return json.loads(done.stdout)


# ------------------------------------------------------------------------------------------------ 1: exact steps


def test_uint64_steps_stay_exact_in_json_text_and_state_files(tmp_path: Path) -> None:
    dump = uint64_dump(tmp_path / "u64.parquet")
    report = report_json("analyze", dump)
    assert [(s["step"], s["rows"]) for s in report["steps"]] == [(5, 1), (2**63, 2), (2**64 - 1, 1)]
    state = tmp_path / "u64.state.json"
    saved = run_capped("analyze", dump, "--save-state", state, "-q", "--format", "json")
    assert saved.returncode in (0, 1), saved.stderr
    assert [step for step, _ in json.loads(state.read_text())["state"]["batches"]] == [5, 2**63, 2**64 - 1]
    merged = report_json("merge", state)
    assert [s["step"] for s in merged["steps"]] == [5, 2**63, 2**64 - 1]
    assert merged["steps"] == report["steps"]
    text = run_capped("analyze", dump, "--details")
    assert text.returncode in (0, 1), text.stderr
    assert "18446744073709551615" in text.stdout and "9223372036854775808" in text.stdout
    assert "-9223372036854775808" not in text.stdout


def test_int64_and_uint64_shards_merge_with_every_step_exact(tmp_path: Path) -> None:
    low = write_dump(
        tmp_path / "low.parquet",
        {"old_log_prob": ROWS, "rollout_log_prob": ROLLOUT, "response_mask": MASKS, "step": [-(2**63), -1, 0, 7]},
    )
    high = uint64_dump(tmp_path / "high.parquet")
    states = []
    for dump in (low, high):
        states.append(tmp_path / f"{dump.stem}.json")
        done = run_capped("analyze", dump, "--save-state", states[-1], "-q", "--format", "json")
        assert done.returncode in (0, 1), done.stderr
    merged = report_json("merge", *states)
    assert [s["step"] for s in merged["steps"]] == [-(2**63), -1, 0, 5, 7, 2**63, 2**64 - 1]


def test_uint64_steps_with_explain_and_sweep(tmp_path: Path) -> None:
    dump = uint64_dump(tmp_path / "u64.parquet")
    explained = report_json("analyze", dump, "--explain")
    assert [s["step"] for s in explained["steps"]] == [5, 2**63, 2**64 - 1]
    swept = report_json("sweep", dump)
    steps = {step["step"] for row in swept["sweep"] for step in row["steps"]}
    assert steps == {5, 2**63, 2**64 - 1}


def test_a_step_an_output_cannot_hold_is_refused_in_one_line(tmp_path: Path) -> None:
    dump = uint64_dump(tmp_path / "u64.parquet")
    sequences = tmp_path / "seq.parquet"
    line = one_line_error(run_capped("analyze", dump, "--sequences", sequences, "-q"))
    assert f"cannot write {sequences}: step 9223372036854775808 is beyond int64" in line
    assert not sequences.exists()
    pytest.importorskip("tensorboard", reason="pip install 'rcdiag[tracking]' for the TensorBoard export")
    board = tmp_path / "tb"
    line = one_line_error(run_capped("analyze", dump, "--tensorboard", board, "-q"))
    assert f"cannot write {board}: step 9223372036854775808 is beyond int64" in line
    assert not board.exists()


def test_a_file_name_step_beyond_uint64_is_refused(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    path = tmp_path / f"step_{2**64}.npz"
    np.savez(
        path,
        old_log_prob=np.array([[-1.0, -0.5]], dtype=np.float32),
        rollout_log_prob=np.array([[-1.1, -0.5]], dtype=np.float32),
    )
    line = one_line_error(run_capped("analyze", path))
    assert f"{path}: states step {2**64} (from its file name), beyond the range of a step" in line


# ------------------------------------------------------------------------------------------- 3: state invariants


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """An analyze state and a sweep state of two sample dumps (different files: they merge)."""
    out = tmp_path_factory.mktemp("states")
    states: dict[str, Any] = {}
    for kind, sample in (("analyze", "healthy"), ("sweep", "outliers")):
        path = out / f"{kind}.json"
        done = run_capped(kind, SAMPLES / f"{sample}.parquet", "--save-state", path, "-q", "--format", "json")
        assert done.returncode in (0, 1), done.stderr
        states[kind] = json.loads(path.read_text())
    return states


def edited(tmp_path: Path, payload: dict[str, Any], change: Any, name: str = "edited.json") -> Path:
    data = json.loads(json.dumps(payload))
    change(data)
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def first_batch(data: dict[str, Any]) -> dict[str, Any]:
    return data["state"]["batches"][0][1]


def group(data: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(g["state"] for g in first_batch(data)["groups"] if g["kind"] == kind)


CONTRADICTIONS = [
    (lambda p: p["state"].__setitem__("rows", p["state"]["rows"] * 2), "rows is 768 but its steps' batches hold 384"),
    (
        lambda p: p["state"].__setitem__("valid_tokens", 10**6),
        "valid_tokens is 1000000 but tokens is 92509",
    ),
    (
        lambda p: first_batch(p).__setitem__("rows", 128),
        "rows is 384 but its steps' batches hold 448",
    ),
    (
        lambda p: [p["state"].__setitem__("rows", 448), first_batch(p).__setitem__("rows", 128)],
        "step 0: OffPolicyMetrics.rows is 64 but rows is 128",
    ),
    (
        lambda p: group(p, "OffPolicyMetrics").__setitem__("tokens", 15000.0),
        "step 0: OffPolicyMetrics.tokens is 15000 but valid_tokens is 14192",
    ),
    (
        lambda p: group(p, "LogRatioHistogram")["counts"].__setitem__(20, 5000),
        "step 0: LogRatioHistogram holds 18118 tokens (counts and nan) but valid_tokens is 14192",
    ),
    (lambda p: first_batch(p).__setitem__("empty_rows", 65), "step 0: empty_rows is 65 but rows is 64"),
]


@pytest.mark.parametrize(("change", "says"), CONTRADICTIONS)
def test_merge_refuses_a_state_whose_counts_contradict(
    tmp_path: Path, saved: dict[str, Any], change: Any, says: str
) -> None:
    path = edited(tmp_path, saved["analyze"], change)
    line = one_line_error(run_capped("merge", path))
    assert line == (
        f"rcdiag: error: {path}: holds counts that contradict each other: {says} (a damaged or edited state; write "
        "it again with 'rcdiag analyze ... --save-state')"
    )


def test_merge_refuses_a_sweep_state_whose_counts_contradict(tmp_path: Path, saved: dict[str, Any]) -> None:
    path = edited(tmp_path, saved["sweep"], lambda p: group(p, "ISMetrics").__setitem__("valid_rows", 99.0))
    line = one_line_error(run_capped("merge", path))
    assert f"{path}: holds counts that contradict each other: step 0: ISMetrics.valid_rows is 99 but" in line
    assert "'rcdiag sweep ... --save-state'" in line


def test_every_state_rcdiag_writes_passes_its_own_checks(tmp_path: Path, saved: dict[str, Any]) -> None:
    paths = [edited(tmp_path, saved[kind], lambda p: None, f"{kind}.json") for kind in ("analyze", "sweep")]
    for path in paths:
        done = run_capped("merge", path, "--format", "json")
        assert done.returncode in (0, 1) and done.stderr == "", done.stderr


@pytest.mark.parametrize(
    ("kind", "declared", "says"),
    [
        ("analyze", "sweep", "says it is a sweep state (kind 'sweep') but holds an analyze state"),
        ("sweep", "analyze", "says it is an analyze state (kind 'analyze') but holds a sweep state"),
    ],
)
def test_a_state_whose_kind_is_not_its_contents_is_refused_naming_both(
    tmp_path: Path, saved: dict[str, Any], kind: str, declared: str, says: str
) -> None:
    path = edited(tmp_path, saved[kind], lambda p: p.__setitem__("kind", declared))
    line = one_line_error(run_capped("merge", path))
    assert line.startswith(f"rcdiag: error: {path}: {says}") and "KeyError" not in line


def test_merge_refuses_a_state_of_the_other_kind_naming_both(tmp_path: Path, saved: dict[str, Any]) -> None:
    analyze = edited(tmp_path, saved["analyze"], lambda p: None, "a.json")
    sweep = edited(tmp_path, saved["sweep"], lambda p: None, "s.json")
    line = one_line_error(run_capped("merge", analyze, sweep))
    assert line == (
        f"rcdiag: error: {sweep}: is a sweep state (written by 'rcdiag sweep --save-state') where an analyze state "
        "is expected: give states of 'rcdiag analyze --save-state'"
    )
    line = one_line_error(run_capped("merge", sweep, analyze))
    assert line.startswith(f"rcdiag: error: {analyze}: is an analyze state (written by 'rcdiag analyze")
    assert "where a sweep state is expected" in line


# ------------------------------------------------------------------------------------- 4: float64 beyond float32


def float64_dump(path: Path, old_value: float) -> Path:
    return write_dump(
        path,
        {
            "old_log_prob": [[-1.0, old_value, -0.5], [-0.2, -0.3]],
            "rollout_log_prob": [[-1.1, -2.0, -0.4], [-0.2, -0.35]],
            "response_mask": [[1, 1, 1], [1, 1]],
        },
        types={"old_log_prob": pa.list_(pa.float64()), "rollout_log_prob": pa.list_(pa.float64())},
    )


def test_a_float64_value_beyond_float32_is_minus_inf_without_a_warning(tmp_path: Path) -> None:
    dump = float64_dump(tmp_path / "f64.parquet", -1e300)
    for args in ((), ("--explain",)):
        done = run_capped("analyze", dump, *args, "--format", "json")
        assert done.returncode in (0, 1) and done.stderr == "", done.stderr
        report = json.loads(done.stdout)
        assert report["input"]["neg_inf_tokens"] == {"old_log_prob": 1, "rollout_log_prob": 0}
        assert "logprob_neg_inf" in {f["code"] for f in report["findings"]}
    done = run_capped("sweep", dump, "--format", "json")
    assert done.returncode in (0, 1) and done.stderr == "", done.stderr
    tiny = run_capped("analyze", float64_dump(tmp_path / "tiny.parquet", -1e-300), "--format", "json")
    assert tiny.returncode in (0, 1) and tiny.stderr == "", tiny.stderr


def test_a_float64_value_beyond_float32_above_zero_is_refused_in_one_line(tmp_path: Path) -> None:
    dump = write_dump(
        tmp_path / "pos.parquet",
        {"old_log_prob": [[-1.0, -0.5]], "rollout_log_prob": [[1e300, -0.5]], "response_mask": [[1, 1]]},
        types={"old_log_prob": pa.list_(pa.float64()), "rollout_log_prob": pa.list_(pa.float64())},
    )
    line = one_line_error(run_capped("analyze", dump))
    assert f"{dump}, row 0, column 'rollout_log_prob': holds +inf at valid position 0" in line
    assert "RuntimeWarning" not in line


# ------------------------------------------------------------------------------------------ 5: repeated packs


def test_repeated_packs_and_identical_rules_are_checked_once_and_fast(tmp_path: Path) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text("packs = [" + ", ".join(['"verl"'] * 5000) + ', "nemo-rl", "verl"]\n[max]\nk3_kl = 0.5\n')
    start = time.perf_counter()
    done = run_capped(
        "check", SAMPLES / "healthy.parquet", "--rules", rules, "--pack", "verl", "--pack", "verl",
        "--max", "k3_kl=0.5", "--max", "k3_kl=0.5", "--format", "json", "--no-pyproject",
    )  # fmt: skip
    took = time.perf_counter() - start
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)["results"]
    labels = [(r["rule"]["source"], r["label"]) for r in results]
    assert len(labels) == len(set(labels))
    once = run_capped(
        "check", SAMPLES / "healthy.parquet", "--pack", "verl", "--pack", "nemo-rl", "--max", "k3_kl=0.5",
        "--format", "json", "--no-pyproject",
    )  # fmt: skip
    expected = [(r["rule"]["source"], r["label"]) for r in json.loads(once.stdout)["results"]]
    file_rule = ("rules.toml", "rollout_corr/k3_kl <= 0.5 (every step)")
    assert sorted(labels) == sorted([*expected, file_rule])
    assert [label for label in labels if label[0] == "pack verl"] == [e for e in expected if e[0] == "pack verl"]
    assert took < 30, f"check took {took:.1f} s"
