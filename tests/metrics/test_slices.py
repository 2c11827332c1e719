"""Mismatch by slice (issue 35 item 2, issue 34's ``replica`` class): ``--by COLUMN`` tables against numpy, the
``slice_concentrated`` test on real-model dumps with a planted bad slice or replica (seeds the thresholds were not
read from: 1 and 2), its false-alarm rate on clean real-model dumps with synthetic slice columns, the policy-version
split, and every command that judges.

The planted causes: ``replica`` and ``replica_column`` (tests/realmodel ``DEFECTS``: one of 8 contiguous row blocks
sampled by a 4-bit engine among bf16 ones, with and without a ``replica`` column), and a scattered slice: the rows
of one of four random ``env`` values taken from the int4 dump of the same seed, the others from the bf16 one.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ROOT
from shape_dumps import defect_dump, dump

import rcdiag
from rcdiag import ColumnMap
from rcdiag.sections.slices import MAX_VALUES, RATIO_MIN, Z_MIN

HELD_OUT = (1, 2)
"""Seeds the thresholds were not read from (seed 0)."""
SLICES = 4
SYNTHETIC = ("round_robin", "random_0", "random_1", "random_2")
"""Slice columns written onto clean dumps for the false-alarm rate: rows assigned to 4 slices round-robin, and at
random with three generator seeds."""


def _cli(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rcdiag", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _files(path: Path) -> list[Path]:
    return sorted(path.glob("*.parquet"))


def _with_columns(source: Path, target: Path, make: Callable[[int], dict[str, np.ndarray]]) -> Path:
    """``source``'s files again under ``target``, with the columns ``make(total_rows)`` gives (in reading order)."""
    target.mkdir(parents=True, exist_ok=True)
    total = sum(pq.read_metadata(f).num_rows for f in _files(source))
    columns = make(total)
    start = 0
    for file in _files(source):
        table = pq.read_table(file)
        for name, values in columns.items():
            table = table.append_column(name, pa.array(values[start : start + table.num_rows]))
        pq.write_table(table, target / file.name)
        start += table.num_rows
    return target


def _synthetic(total: int) -> dict[str, np.ndarray]:
    out = {"round_robin": np.arange(total) % SLICES}
    for seed in range(3):
        out[f"random_{seed}"] = np.random.default_rng(100 + seed).integers(0, SLICES, total)
    return out


def _scattered(seed: int, target: Path) -> Path:
    """The bf16 dump of ``seed`` with the rows of env 2 (of 4, at random) taken from the int4 dump of that seed."""
    target.mkdir(parents=True, exist_ok=True)
    env = np.random.default_rng(seed).integers(0, SLICES, 512)
    start = 0
    for good, bad in zip(_files(dump("bf16", seed)), _files(dump("int4", seed)), strict=True):
        clean, int4 = pq.read_table(good), pq.read_table(bad)
        rows = env[start : start + clean.num_rows]
        pick = [int4.slice(i, 1) if rows[i] == 2 else clean.slice(i, 1) for i in range(clean.num_rows)]
        table = pa.concat_tables(pick).append_column("env", pa.array([f"env-{v}" for v in rows]))
        pq.write_table(table, target / good.name)
        start += clean.num_rows
    return target


def _report(path: Path, *by: str, **options: Any) -> rcdiag.Report:
    return rcdiag.analyze(path, columns=ColumnMap(by=by), **options)


def _classes(report: rcdiag.Report) -> tuple[str, list[str]]:
    assert report.verdict is not None
    return report.verdict.status, [c.cls for c in report.verdict.causes]


# ------------------------------------------------------------------------------------ the table against numpy


def _responses(path: Path, column: str) -> tuple[list[np.ndarray], list[np.ndarray], list[Any]]:
    """Each response's valid old and rollout log-probs (float32) and its value of ``column``, in reading order."""
    olds, rollouts, values = [], [], []
    for file in _files(path):
        table = pq.read_table(file)
        for old, rollout, mask, value in zip(
            table.column("old_log_prob").to_pylist(),
            table.column("rollout_log_prob").to_pylist(),
            table.column("response_mask").to_pylist(),
            table.column(column).to_pylist(),
            strict=True,
        ):
            keep = np.asarray(mask, dtype=bool)
            olds.append(np.asarray(old, np.float32)[keep])
            rollouts.append(np.asarray(rollout, np.float32)[keep])
            values.append(value)
    return olds, rollouts, values


def test_each_slice_equals_numpy_on_its_rows(tmp_path: Path) -> None:
    """rows, tokens, kl, k3_kl, mean |log-ratio|, the shares and the test's z of every value, each computed here from
    the dump's rows: kl, k3 and |d| from d = float32(old - rollout); z from each response's k3 with the token ratio
    capped at e^3 and the cluster standard error of a ratio of sums written out here."""
    path = _scattered(1, tmp_path / "dump")
    rows = _report(path, "env").to_dict()["breakdowns"]["by"]["env"]
    olds, rollouts, values = _responses(path, "env")
    assert [row["value"] for row in rows] == list(dict.fromkeys(values))  # reading order of first appearance
    d = [(o - r).astype(np.float64) for o, r in zip(olds, rollouts, strict=True)]
    n = np.array([x.size for x in d], dtype=np.float64)
    neg = np.array(
        [float(r.astype(np.float64).sum() - o.astype(np.float64).sum()) for o, r in zip(olds, rollouts, strict=True)]
    )
    k3 = np.array([float(np.sum(np.expm1(x) - x)) for x in d])
    absolute = np.array([float(np.abs(x).sum()) for x in d])
    capped = np.array([float(np.sum(np.minimum(np.exp(x), math.exp(3)) - 1 - x)) for x in d])
    value_of = np.array(values)

    def cluster(t: np.ndarray, s: np.ndarray) -> tuple[float, float]:
        t, s = t[t > 0], s[t > 0]
        mean = s.sum() / t.sum()
        return mean, float(((s - mean * t) ** 2).sum()) / t.sum() ** 2 * t.size / (t.size - 1)

    for row in rows:
        inside = value_of == row["value"]
        tokens = n[inside].sum()
        assert row["rows"] == inside.sum() and row["tokens"] == tokens
        assert row["token_share"] == pytest.approx(tokens / n.sum(), rel=1e-12)
        assert row["kl"] == pytest.approx(neg[inside].sum() / tokens, rel=1e-9)
        assert row["k3_kl"] == pytest.approx(k3[inside].sum() / tokens, rel=1e-9)
        assert row["abs_log_ratio_mean"] == pytest.approx(absolute[inside].sum() / tokens, rel=1e-9)
        assert row["k3_share"] == pytest.approx(k3[inside].sum() / k3.sum(), rel=1e-9)
        (m_in, v_in), (m_out, v_out) = cluster(n[inside], capped[inside]), cluster(n[~inside], capped[~inside])
        z = (m_in - m_out) / math.sqrt(v_in + v_out)
        assert row["z"] == pytest.approx(z, rel=1e-7)  # the compiled signature pass: expm1, its own order of sums
    assert {row["value"]: row["status"] for row in rows}["env-2"] == "correct"  # int4 rows: large precision noise
    assert {row["status"] for row in rows if row["value"] != "env-2"} == {"healthy"}


def test_chunks_workers_and_saved_states_give_the_same_slices(tmp_path: Path) -> None:
    """The table and the finding do not depend on how the dump is cut: one pass, small chunks in two processes, and
    two shards' saved states merged."""
    path = _scattered(2, tmp_path / "dump")
    one = _report(path, "env")
    parts = _report(path, "env", chunk_tokens=2000, workers=2)
    shards = []
    for i, files in enumerate((_files(path)[:2], _files(path)[2:])):
        shard = tmp_path / f"shard{i}"
        shard.mkdir()
        for file in files:
            shutil.copy(file, shard / file.name)
        _report(shard, "env", save_state=tmp_path / f"s{i}.json")
        shards.append(tmp_path / f"s{i}.json")
    merged = rcdiag.merge_states(shards)
    want = one.to_dict()["breakdowns"]["by"]
    for other in (parts, merged):
        got = other.to_dict()["breakdowns"]["by"]
        for a, b in zip(want["env"], got["env"], strict=True):
            assert a.keys() == b.keys()
            for key in a:
                assert a[key] == (pytest.approx(b[key], rel=1e-12) if isinstance(a[key], float) else b[key])
        assert [c.evidence for c in other.verdict.causes] == [c.evidence for c in one.verdict.causes]  # type: ignore[union-attr]


def test_the_block_scan_holds_across_chunks_and_workers() -> None:
    path = defect_dump("replica", 1)
    one, parts = rcdiag.analyze(path), rcdiag.analyze(path, chunk_tokens=1500, workers=2)
    assert [c.evidence for c in one.verdict.causes] == [c.evidence for c in parts.verdict.causes]  # type: ignore[union-attr]


# ------------------------------------------------------------------------------------------ planted slices


@pytest.mark.parametrize("seed", HELD_OUT)
def test_by_names_the_one_bad_slice_among_four(seed: int, tmp_path: Path) -> None:
    report = _report(_scattered(seed, tmp_path / "dump"), "env")
    assert _classes(report) == ("fix", ["replica"])
    found = next(f for f in report.findings if f.code == "slice_concentrated")
    assert found.message.startswith("the ") and "with env = 'env-2' carry" in found.message
    assert found.value is not None and found.value >= RATIO_MIN


@pytest.mark.parametrize("seed", HELD_OUT)
def test_without_by_a_scattered_slice_is_no_block(seed: int, tmp_path: Path) -> None:
    """The rows of the bad slice are spread over the dump: no block of rows carries them (no finding without --by)."""
    report = rcdiag.analyze(_scattered(seed, tmp_path / "dump"))
    assert "slice_concentrated" not in {f.code for f in report.findings}


@pytest.mark.parametrize("seed", HELD_OUT)
@pytest.mark.parametrize("name", ["replica", "replica_column"])
def test_one_bad_replica_is_fix_replica(name: str, seed: int) -> None:
    """The default analyze and --explain: the replica column's value 3 when the dump has the column, else rows
    192-255 (the block of step 1 the replica served)."""
    for explain in (False, True):
        report = rcdiag.analyze(defect_dump(name, seed), explain=explain)
        assert _classes(report) == ("fix", ["replica"])
        evidence = report.verdict.causes[0].evidence  # type: ignore[union-attr]
        named = "the 64 rows with replica = 3 carry" if name == "replica_column" else "rows 192-255 (block 2 of 2"
        assert evidence.startswith(named), evidence


# -------------------------------------------------------------------------------------------- false alarms

ENGINES = ("clean_fp32", "bf16", "fp16", "int4")
CLEAN = [("dump", name) for name in ENGINES] + [("defect", name) for name in ("kv_fp8", "stale")]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("kind", "name"), CLEAN)
def test_clean_dumps_have_no_concentrated_slice(kind: str, name: str, seed: int, tmp_path: Path) -> None:
    """No slice of 4 (round-robin, random at 3 generator seeds) and no block of rows stands out on a clean engine;
    the largest |z| of the 16 slices stays far below the critical value (2.6 at most measured, 18 dumps)."""
    source = dump(name, seed) if kind == "dump" else defect_dump(name, seed)
    report = _report(_with_columns(source, tmp_path / "dump", _synthetic), *SYNTHETIC)
    assert not {f.code for f in report.findings} & {"slice_concentrated", "slice_stale"}
    assert "replica" not in _classes(report)[1]
    zs = [row["z"] for rows in report.to_dict()["breakdowns"]["by"].values() for row in rows]
    assert max(abs(z) for z in zs) < 3.5 < Z_MIN


# ------------------------------------------------------------------------------------ policy-version split


def _versioned(seed: int, target: Path, *, stale: bool) -> Path:
    """bf16 and int4 rows of ``seed`` with ``replica`` (round-robin over 8) and ``policy_version`` columns.
    ``stale``: the int4 rows are the old version, which 80% of replica 3's rows and 10% of the others' hold (the
    excess follows the version); else the int4 rows are replica 3's, whose versions are those of the others."""
    target.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    start = 0
    for good, bad in zip(_files(dump("bf16", seed)), _files(dump("int4", seed)), strict=True):
        clean, int4 = pq.read_table(good), pq.read_table(bad)
        replica = (start + np.arange(clean.num_rows)) % 8
        old = rng.random(clean.num_rows) < np.where(replica == 3, 0.8, 0.1)
        version = np.where(old, 0, 1) if stale else rng.integers(0, 2, clean.num_rows)
        use = old if stale else replica == 3
        table = pa.concat_tables([int4.slice(i, 1) if use[i] else clean.slice(i, 1) for i in range(clean.num_rows)])
        table = table.append_column("replica", pa.array(replica)).append_column("policy_version", pa.array(version))
        pq.write_table(table, target / good.name)
        start += clean.num_rows
    return target


@pytest.mark.parametrize("seed", HELD_OUT)
def test_a_policy_version_column_splits_staleness_from_the_engine(seed: int, tmp_path: Path) -> None:
    engine = rcdiag.analyze(_versioned(seed, tmp_path / "engine", stale=False))
    assert _classes(engine) == ("fix", ["replica"])
    assert "an engine difference, not staleness" in engine.verdict.causes[0].evidence  # type: ignore[union-attr]
    stale = rcdiag.analyze(_versioned(seed, tmp_path / "stale", stale=True))
    codes = {f.code for f in stale.findings}
    assert "slice_stale" in codes and "slice_concentrated" not in codes
    assert "replica" not in _classes(stale)[1]
    message = next(f.message for f in stale.findings if f.code == "slice_stale")
    assert "the 64 rows with replica = 3 carry" in message and "follows the policy version (staleness)" in message


# ------------------------------------------------------------------------------------- every command that judges


@pytest.mark.parametrize("name", ["replica", "replica_column"])
def test_check_compare_and_watch_read_the_replica(name: str, tmp_path: Path) -> None:
    seed = HELD_OUT[0]
    checked = _cli("check", defect_dump(name, seed), "--pack", "verl", "--pack", "analyze", "--format", "json")
    assert checked.returncode == 1, checked.stderr
    compared = _cli("compare", dump("bf16", seed), defect_dump(name, seed), "--format", "json")
    assert compared.returncode == 0, compared.stderr
    verdicts = json.loads(compared.stdout)["verdicts"]
    assert verdicts["a"]["status"] == "healthy"
    assert (verdicts["b"]["status"], verdicts["b"]["causes"][0]["class"]) == ("fix", "replica")
    followed = tmp_path / "run"
    shutil.copytree(defect_dump(name, HELD_OUT[1]), followed)
    watched = _cli("watch", followed, "--once", "--settle", "0", "--state", tmp_path / "watch.state")
    assert watched.returncode in (0, 1), watched.stderr
    assert "verdict fix: mismatch concentrated in a subset of rows" in watched.stdout


def test_a_watch_fed_file_by_file_keeps_every_row(tmp_path: Path) -> None:
    """Two polls, two files each: the second reads the state (and its log) the first left, and still names the
    replica's rows."""
    source, followed = defect_dump("replica", HELD_OUT[1]), tmp_path / "run"
    followed.mkdir()
    for files in (_files(source)[:2], _files(source)[2:]):
        for file in files:
            shutil.copy(file, followed / file.name)
        done = _cli("watch", followed, "--once", "--settle", "0", "--state", tmp_path / "watch.state")
        assert done.returncode in (0, 1), done.stderr
    assert "verdict fix: mismatch concentrated in a subset of rows" in done.stdout
    merged = _cli("merge", tmp_path / "watch.state", "--format", "json")
    assert merged.returncode == 0, merged.stderr
    causes = json.loads(merged.stdout)["verdict"]["causes"]
    assert causes[0]["class"] == "replica" and causes[0]["evidence"].startswith("rows 192-255 (block 2 of 2")


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("kind", "name"), CLEAN)
def test_clean_dumps_raise_no_replica_by_default(kind: str, name: str, seed: int) -> None:
    report = rcdiag.analyze(dump(name, seed) if kind == "dump" else defect_dump(name, seed))
    assert not {f.code for f in report.findings} & {"slice_concentrated", "slice_stale"}


def test_a_trend_across_steps_is_no_replica() -> None:
    """Blocks are compared within their step: a mismatch growing over steps is the trend, not a replica."""
    for seed in (0, 1, 2):
        assert _classes(rcdiag.analyze(dump("drift", seed))) == ("fix", ["trend"])


# -------------------------------------------------------------------------------- the command line and bad input


def test_by_prints_its_table_in_every_output(tmp_path: Path) -> None:
    path = defect_dump("replica_column", HELD_OUT[0])
    shown = _cli("analyze", path, "--by", "replica", "-q", "--html", tmp_path / "r.html")
    assert shown.returncode == 0, shown.stderr
    assert "By replica (--by replica)" in shown.stdout and "98.6%" in shown.stdout
    html = (tmp_path / "r.html").read_text()
    assert "Mismatch by slice (--by)" in html and "the 64 rows with replica = 3" in html
    both = json.loads(_cli("analyze", path, "--by", "replica", "--by", "step", "--explain", "--format", "json").stdout)
    assert set(both["breakdowns"]) == {"position", "rollout_prob", "length", "token", "by"}
    assert [row["value"] for row in both["breakdowns"]["by"]["step"]] == [0, 1, 2, 3]
    assert sum(row["rows"] for row in both["breakdowns"]["by"]["replica"]) == 512


def test_a_missing_column_is_one_line_and_exit_2() -> None:
    done = _cli("analyze", defect_dump("replica", HELD_OUT[0]), "--by", "environment")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "has no column 'environment' (given with --by)" in lines[0]


def _small(path: Path, rows: int, **columns: Any) -> Path:
    rng = np.random.default_rng(0)
    old = [(-rng.exponential(1.0, 4)).astype(np.float32) for _ in range(rows)]
    table = pa.table(
        {
            "old_log_prob": pa.array(old, pa.list_(pa.float32())),
            "rollout_log_prob": pa.array([o - np.float32(0.01) for o in old], pa.list_(pa.float32())),
            **columns,
        }
    )
    pq.write_table(table, path)
    return path


def test_a_column_of_ids_is_refused(tmp_path: Path) -> None:
    rows = MAX_VALUES + 5
    path = _small(tmp_path / "ids.parquet", rows, uid=pa.array([f"u{i}" for i in range(rows)]))
    done = _cli("analyze", path, "--by", "uid")
    assert done.returncode == 2
    assert f"column 'uid': has more than {MAX_VALUES:,} distinct values" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_list_column_is_refused_and_a_recognised_one_left_alone(tmp_path: Path) -> None:
    lists = pa.array([[1, 2]] * 20, pa.list_(pa.int64()))
    path = _small(tmp_path / "lists.parquet", 20, env=lists, rank=lists)
    done = _cli("analyze", path, "--by", "env")
    assert done.returncode == 2 and "column 'env': has type list<element: int64>, expected one number" in done.stderr
    assert _cli("analyze", path).returncode == 0  # 'rank' holds lists: not read as a replica column


def test_values_keep_their_type_nulls_and_dictionary_strings(tmp_path: Path) -> None:
    env = pa.array(["a", None, "b", "a"] * 5).dictionary_encode()
    path = _small(tmp_path / "env.parquet", 20, env=env, flag=pa.array([True, False] * 10))
    rows = _report(path, "env", "flag").to_dict()["breakdowns"]["by"]
    assert [(r["value"], r["rows"]) for r in rows["env"]] == [("a", 10), (None, 5), ("b", 5)]
    assert [(r["value"], r["rows"]) for r in rows["flag"]] == [(True, 10), (False, 10)]
    assert [r["z"] is None for r in rows["env"]] == [False, True, True]  # 5 responses (fewer than 8): not tested


def test_the_long_layout_takes_each_sequence_value(tmp_path: Path) -> None:
    table = pa.table(
        {
            "seq_id": [0, 0, 1, 1, 1, 2],
            "old_log_prob": pa.array([-1.0, -2.0, -1.0, -0.5, -0.2, -3.0], pa.float32()),
            "rollout_log_prob": pa.array([-1.1, -2.0, -1.0, -0.4, -0.2, -3.0], pa.float32()),
            "env": ["x", "x", "y", "y", "y", "x"],
        }
    )
    pq.write_table(table, tmp_path / "long.parquet")
    rows = _report(tmp_path / "long.parquet", "env").to_dict()["breakdowns"]["by"]["env"]
    assert [(r["value"], r["rows"], r["tokens"]) for r in rows] == [("x", 2, 3), ("y", 1, 3)]


def test_sweep_refuses_by() -> None:
    done = _cli("sweep", defect_dump("replica", HELD_OUT[0]), "--by", "step")
    assert done.returncode == 2 and "a sweep scans thresholds over the whole dump" in done.stderr


@pytest.mark.parametrize("seed", [0, 1])
def test_the_compiled_pass_equals_the_numpy_twin(seed: int) -> None:
    """The per-row sums of ``--by`` on one block: masked tokens, empty rows, -inf on one side and on both."""
    from rcdiag.kernels.slices import slice_pass
    from rcdiag.sections.slices import slice_arrays

    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 30, 100).astype(np.int64)
    n = int(lengths.sum())
    old = (-rng.exponential(1.0, n)).astype(np.float32)
    rollout = (old + rng.normal(0, 0.1, n)).astype(np.float32)
    old[rng.random(n) < 0.02] = -np.inf
    both = rng.random(n) < 0.02
    old[both], rollout[both] = -np.inf, -np.inf
    mask = rng.random(n) > 0.1
    for m in (None, mask):
        out = np.empty((lengths.size, 6))
        with np.errstate(all="ignore"):
            slice_pass(old, rollout, np.zeros(0, bool) if m is None else m, m is not None, lengths, out)
            twin = slice_arrays(old, rollout, m, lengths)
        np.testing.assert_allclose(out, twin, rtol=1e-12, atol=1e-12)


def test_by_reaches_check_and_compare() -> None:
    """--by is an input flag: check refuses a missing column as analyze does, and compare's verdict of each side
    tests the column's values."""
    seed = HELD_OUT[0]
    missing = _cli("check", defect_dump("replica", seed), "--pack", "analyze", "--by", "env")
    assert missing.returncode == 2 and "has no column 'env' (given with --by)" in missing.stderr
    compared = _cli(
        "compare", dump("bf16", seed), defect_dump("replica_column", seed), "--by", "replica", "--format", "json"
    )
    assert compared.returncode == 2 and "has no column 'replica' (given with --by)" in compared.stderr  # A has none
    both = _cli(
        "compare", defect_dump("replica_column", HELD_OUT[1]), defect_dump("replica_column", seed), "--by", "step",
        "--format", "json",
    )  # fmt: skip
    assert both.returncode == 0, both.stderr
    verdicts = json.loads(both.stdout)["verdicts"]
    assert [verdicts[side]["causes"][0]["evidence"][:33] for side in "ab"] == ["the 64 rows with replica = 3 carr"] * 2
