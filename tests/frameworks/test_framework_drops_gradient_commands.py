"""``framework_drops_gradient`` through every command that takes ``--as NAME``: ``check``'s findings gate, each side
of ``compare``, the verdict heading ``sweep``, and ``merge`` of states saved under ``--as``, on the real model's
dumps: int4 seed 0 (the pooled finding under TRL's defaults) and the bf16 run with its last step 4-bit
(tests/gradient_dumps.py, the per-step finding), bf16 seed 0 the clean side."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import run
from gradient_dumps import BAD_STEP, one_bad_step
from shape_dumps import dump

from rcdiag.catalogue.findings import Code

CODE = Code.FRAMEWORK_DROPS_GRADIENT


def _found(findings: list[dict]) -> list[dict]:
    return [f for f in findings if f["code"] == CODE]


@pytest.fixture(scope="module")
def bad_step(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return one_bad_step(0, tmp_path_factory.mktemp("gradient"))


def test_check_fails_on_it_by_severity_by_code_and_by_the_analyze_pack(
    bad_step: Path, capsys: pytest.CaptureFixture
) -> None:
    for gate in (["--fail-on", "warning"], ["--fail-on", str(CODE)], ["--pack", "analyze"]):
        code, out, _ = run(capsys, "check", bad_step, "--as", "trl", *gate, "--format", "json")
        report = json.loads(out)
        failed = _found(report["failing_findings"])
        assert code == 1 and report["passed"] is False and len(failed) == 1, gate
        assert f"at 1 of 4 steps ({BAD_STEP})" in failed[0]["message"]
        # the same gate on the clean run under the same framework passes
        code, _, _ = run(capsys, "check", dump("bf16", 0), "--as", "trl", *gate, "--format", "json")
        assert code == 0, gate
    # without --as the framework is not judged, so the gate has nothing of it to see
    code, out, _ = run(capsys, "check", bad_step, "--fail-on", str(CODE), "--format", "json")
    assert code == 0 and not _found(json.loads(out)["failing_findings"])


def test_compare_gives_each_sides_finding_with_its_side(bad_step: Path, capsys: pytest.CaptureFixture) -> None:
    clean, int4 = dump("bf16", 0), dump("int4", 0)
    code, out, _ = run(capsys, "compare", clean, bad_step, "--as", "trl", "--format", "json")
    report = json.loads(out)
    found = _found(report["findings"])
    assert code == 0 and [f["side"] for f in found] == ["b"]
    (side_b,) = _found(report["b"]["findings"])  # the side's own analyze finding, carried with its side
    assert found[0]["message"] == f"side b: {side_b['message']}" and found[0]["value"] == side_b["value"]
    assert found[0]["metric"] == "rcdiag/trl/weight_mean" and found[0]["threshold"] == 0.5
    # swapped, and with the pooled finding on both sides
    code, out, _ = run(capsys, "compare", bad_step, clean, "--as", "trl", "--format", "json")
    assert [f["side"] for f in _found(json.loads(out)["findings"])] == ["a"]
    code, out, _ = run(capsys, "compare", int4, bad_step, "--as", "trl", "--format", "json")
    assert [f["side"] for f in _found(json.loads(out)["findings"])] == ["a", "b"]
    code, out, _ = run(capsys, "compare", clean, bad_step, "--as", "trl")
    assert code == 0 and "side b: TRL 1.16.0's" in out
    # without --as neither side is judged under a framework
    code, out, _ = run(capsys, "compare", clean, bad_step, "--format", "json")
    assert code == 0 and not _found(json.loads(out)["findings"])


@pytest.mark.parametrize("which", ["pooled", "per_step"])
def test_sweep_verdict_names_it(which: str, bad_step: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = dump("int4", 0) if which == "pooled" else bad_step
    state = tmp_path / "sweep.json"
    code, out, _ = run(capsys, "sweep", path, "--as", "trl", "--format", "json", "--save-state", state)
    report = json.loads(out)
    assert code == 0 and len(_found(report["findings"])) == 1
    assert any(f"the configured correction: {CODE}" in step for step in report["verdict"]["next_steps"])
    # the same finding analyze --as gives, and merge of the sweep's saved state gives it again
    _, one, _ = run(capsys, "analyze", path, "--as", "trl", "--format", "json", "-q")
    assert _found(report["findings"]) == _found(json.loads(one)["findings"])
    code, merged, _ = run(capsys, "merge", state, "--format", "json")
    assert code == 0 and _found(json.loads(merged)["findings"]) == _found(report["findings"])
    head = run(capsys, "sweep", path, "--as", "trl")[1].split("the first recommendation")[0]
    assert f"the configured correction: {CODE}" in head
    # without --as the sweep's verdict says nothing of any framework
    code, out, _ = run(capsys, "sweep", path, "--format", "json")
    assert code == 0 and not _found(json.loads(out)["findings"])


def _halves(path: Path, root: Path) -> list[Path]:
    """Two shards of a dump directory, each with half the rows of every step file."""
    shards = [root / "a", root / "b"]
    for shard in shards:
        shard.mkdir()
    for file in sorted(path.glob("*.parquet")):
        table = pq.read_table(file)
        half = table.num_rows // 2
        pq.write_table(table.slice(0, half), shards[0] / file.name)
        pq.write_table(table.slice(half), shards[1] / file.name)
    return shards


@pytest.mark.parametrize("which", ["pooled", "per_step"])
def test_merge_of_states_saved_under_as_gives_the_one_pass_finding(
    which: str, bad_step: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = dump("int4", 0) if which == "pooled" else bad_step
    states = []
    for i, shard in enumerate(_halves(path, tmp_path)):
        state = tmp_path / f"s{i}.json"
        code, _, _ = run(capsys, "analyze", shard, "--as", "trl", "--save-state", state, "-q", "--format", "json")
        assert code == 0
        states.append(state)
    _, one, _ = run(capsys, "analyze", path, "--as", "trl", "--format", "json", "-q")
    code, merged, _ = run(capsys, "merge", *states, "--format", "json")
    want = _found(json.loads(one)["findings"])
    assert code == 0 and len(want) == 1 and _found(json.loads(merged)["findings"]) == want
    assert (want[0]["steps"] is None) == (which == "pooled")
    code, text, _ = run(capsys, "merge", *states)
    assert code == 0 and f"the configured correction: {CODE}" in text
