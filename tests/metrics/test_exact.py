"""Exact match (``rcdiag.sections.exact``, JSON ``exact``, verdict ``identical``, ``check --exact``): every count,
ulp distance and first position against a brute force over the dump's own rows (``view(np.int32)``, token by
token), through the library and the CLI, whatever the chunk size, row order, workers, device path or saved-state
merges."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import require, run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rcdiag
from rcdiag.core.formulas import ulp_distance
from rcdiag.io import Chunk
from rcdiag.kernels.small import row_differences
from rcdiag.metrics.backend import NumpyBackend
from rcdiag.metrics.token_passes import fused_token_sums
from rcdiag.sections.exact import FIRST_RESPONSES

F32_MAX = np.finfo(np.float32).max


def ordered(bits: np.ndarray) -> np.ndarray:
    """A float32's place in the ordered integer representation, written with a branch: its magnitude bits, negated
    when the sign bit is set (both zeros at 0)."""
    wide = np.asarray(bits, dtype=np.int32).astype(np.int64)
    return np.where(wide < 0, -(wide & 0x7FFFFFFF), wide)


def ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Brute-force ulp distance between float32 arrays."""
    return np.abs(ordered(np.asarray(a, np.float32).view(np.int32)) - ordered(np.asarray(b, np.float32).view(np.int32)))


@dataclass
class Rows:
    """A ragged dump: per row float32 old/rollout, 0/1 mask and a step."""

    old: list[np.ndarray]
    rollout: list[np.ndarray]
    mask: list[np.ndarray]
    step: list[int]

    def write(self, path: Path, row_group: int = 1 << 20) -> Path:
        offsets = pa.array(np.concatenate([[0], np.cumsum([len(r) for r in self.old])]).astype(np.int32))
        flat = {
            "old_log_prob": np.concatenate([*self.old, np.zeros(0, np.float32)]).astype(np.float32),
            "rollout_log_prob": np.concatenate([*self.rollout, np.zeros(0, np.float32)]).astype(np.float32),
            "response_mask": np.concatenate([*self.mask, np.zeros(0, np.int8)]).astype(np.int8),
        }
        table = pa.table(
            {
                **{name: pa.ListArray.from_arrays(offsets, pa.array(values)) for name, values in flat.items()},
                "step": pa.array(np.asarray(self.step, np.int64)),
            }
        )
        pq.write_table(table, path, row_group_size=row_group)
        return path

    def chunks(self, cuts: list[int]) -> list[Chunk]:
        """The rows as chunks split before each row of ``cuts``."""
        bounds = [0, *cuts, len(self.old)]
        out = []
        for a, b in itertools.pairwise(bounds):
            lengths = [len(r) for r in self.old[a:b]]
            out.append(
                Chunk(
                    old=np.concatenate([*self.old[a:b], np.zeros(0, np.float32)]).astype(np.float32),
                    rollout=np.concatenate([*self.rollout[a:b], np.zeros(0, np.float32)]).astype(np.float32),
                    offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                    mask=np.concatenate([*self.mask[a:b], np.zeros(0, np.int8)]).astype(bool),
                    steps=np.asarray(self.step[a:b], np.int64),
                )
            )
        return out


def brute(rows: Rows) -> dict:
    """The JSON ``exact`` object, token by token."""
    compared = different = 0
    largest = 0
    listed = []
    for r, (old, rollout, mask) in enumerate(zip(rows.old, rows.rollout, rows.mask, strict=True)):
        valid = mask.astype(bool)
        a, b = old.view(np.int32), rollout.view(np.int32)
        differ = [i for i in range(len(a)) if valid[i] and a[i] != b[i]]
        compared += int(valid.sum())
        different += len(differ)
        if differ:
            apart = int(max(ulps(old[differ], rollout[differ])))
            largest = max(largest, apart)
            listed.append({"row": r, "position": differ[0], "tokens_different": len(differ), "max_ulp": apart})
    return {
        "responses_compared": len(rows.old),
        "tokens_compared": compared,
        "tokens_different": different,
        "responses_different": len(listed),
        "max_ulp": largest,
        "first_difference": listed[:FIRST_RESPONSES],
    }


def per_row(rows: Rows) -> list[tuple[int, int, int | None]]:
    """Every row's (tokens_different, max_ulp, first_difference or None), token by token."""
    out = []
    for old, rollout, mask in zip(rows.old, rows.rollout, rows.mask, strict=True):
        valid = mask.astype(bool)
        differ = [i for i in range(len(old)) if valid[i] and old.view(np.int32)[i] != rollout.view(np.int32)[i]]
        apart = int(max(ulps(old[differ], rollout[differ]))) if differ else 0
        out.append((len(differ), apart, differ[0] if differ else None))
    return out


def identical_rows(seed: int, n: int = 48, steps: int = 3) -> Rows:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 40, n)
    old = [-np.abs(rng.normal(0, 1.5, k)).astype(np.float32) for k in lengths]
    mask = [(rng.random(k) > 0.15).astype(np.int8) for k in lengths]
    return Rows(old, [o.copy() for o in old], mask, [int(s) for s in rng.integers(0, steps, n)])


def planted(seed: int, plants: int = 6) -> tuple[Rows, list[tuple[int, int]]]:
    """An identical dump with ``plants`` valid tokens moved one float32 step (``np.nextafter``), up or down."""
    rows = identical_rows(seed)
    rng = np.random.default_rng(seed + 1000)
    spots = [(r, i) for r, m in enumerate(rows.mask) for i in np.flatnonzero(m).tolist()]
    chosen = sorted(spots[j] for j in rng.choice(len(spots), plants, replace=False))
    for r, i in chosen:
        value = rows.rollout[r][i]
        rows.rollout[r][i] = np.nextafter(value, np.float32(-np.inf) if rng.random() < 0.5 else np.float32(0))
    return rows, chosen


def exact_json(path: Path, *flags: str, capsys: pytest.CaptureFixture) -> dict:
    code, out, err = run(capsys, "analyze", str(path), "--format", "json", *flags)
    assert code == 0, err
    return json.loads(out)


# ------------------------------------------------------------------------------------------------ ulps


def test_the_ulp_distance_is_the_steps_between_two_floats() -> None:
    """Walking k float32 steps with ``np.nextafter`` is k ulps, from any start, across zero too (where nextafter
    steps over -0.0: both zeros are 0 ulps apart, though their bits differ); -inf is one step beyond -FLT_MAX."""
    rng = np.random.default_rng(0)
    starts = np.concatenate([-np.abs(rng.normal(0, 3, 200)), [0.0, -0.0, 1e-45, -1e-45, -F32_MAX]]).astype(np.float32)
    for start in starts:
        for direction in (np.float32(-np.inf), np.float32(np.inf)):
            value = start
            for k in range(6):
                assert ulps(np.array([start]), np.array([value]))[0] == k, (start, k)
                bits = [np.array([x], np.float32).view(np.int32).astype(np.int64) for x in (start, value)]
                assert int(ulp_distance(*bits)[0]) == k
                if abs(value) == F32_MAX and np.sign(value) == np.sign(direction):
                    break
                value = np.nextafter(value, direction)
    pairs = {(-0.0, 0.0): 0, (-np.inf, -F32_MAX): 1, (-np.inf, -np.inf): 0, (-np.inf, np.inf): 4278190080}
    for (a, b), want in pairs.items():
        assert ulps(np.array([a]), np.array([b]))[0] == want
    # the kernel and its numpy form on rows holding every case: the same counts, ulps and first positions
    old = np.array([-0.0, -1.0, -np.inf, -np.inf, 1e-45, -3.0], np.float32)
    rollout = np.array(
        [0.0, np.nextafter(np.float32(-1.0), np.float32(0)), -F32_MAX, -np.inf, -1e-45, -3.0], np.float32
    )
    lengths = np.array([2, 2, 2], np.int64)
    want = np.array([[2, 1, 0], [1, 1, 0], [1, 2, 0]])
    assert (row_differences(old, rollout, None, lengths) == want).all()
    found = fused_token_sums(old, rollout, None, lengths).differences
    assert (np.stack([found.tokens, found.max_ulp, found.first], axis=1) == want).all()
    masked = np.array([False, True, True, True, False, True])
    want_masked = np.array([[1, 1, 1], [1, 1, 0], [0, 0, -1]])
    assert (row_differences(old, rollout, masked, lengths) == want_masked).all()
    found = fused_token_sums(old, rollout, masked, lengths).differences
    assert (np.stack([found.tokens, found.max_ulp, found.first], axis=1) == want_masked).all()


# ----------------------------------------------------------------------------------------- identical dumps


def test_a_bitwise_identical_dump_reads_identical(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rows = identical_rows(1)
    for r in range(0, len(rows.old), 5):  # masked tokens that differ do not count
        masked = np.flatnonzero(rows.mask[r] == 0)
        rows.rollout[r][masked] -= np.float32(0.5)
    path = rows.write(tmp_path / "identical.parquet")
    report = exact_json(path, capsys=capsys)
    want = brute(rows)
    assert want["tokens_different"] == 0 and want["tokens_compared"] > 0
    assert report["exact"] == want
    assert report["verdict"]["status"] == "identical"
    assert report["verdict"]["headline"].startswith(
        f"identical: the two log-prob columns are bitwise identical at all {want['tokens_compared']:,}"
    )
    assert report["verdict"]["causes"] == [] and report["verdict"]["recommendation"] is None
    code, out, _ = run(capsys, "analyze", str(path))
    assert code == 0 and "verdict  IDENTICAL" in out
    assert f"exact: bitwise identical at all {want['tokens_compared']:,} valid tokens" in out.splitlines()
    require("matplotlib", "matplotlib")
    from rcdiag.render.html import render_html

    page = render_html(rcdiag.analyze(path))
    assert '<span class="badge identical">IDENTICAL</span>' in page
    assert f"<th>exact match</th><td>bitwise identical at all {want['tokens_compared']:,} valid tokens</td>" in page
    code, out, err = run(capsys, "check", str(path), "--exact", "--format", "json")
    assert code == 0, err
    result = json.loads(out)
    assert result["passed"] and result["exact"]["passed"] and result["exact"]["tokens_different"] == 0
    state = tmp_path / "identical.state.json"
    assert exact_json(path, "--save-state", str(state), capsys=capsys)["exact"] == want
    code, out, err = run(capsys, "merge", str(state), "--format", "json")
    assert code == 0, err
    assert json.loads(out)["exact"] == want and json.loads(out)["verdict"]["status"] == "identical"


def test_a_dump_without_a_valid_token_is_not_identical(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rows = identical_rows(2, n=4)
    rows.mask = [np.zeros_like(m) for m in rows.mask]
    path = rows.write(tmp_path / "empty.parquet")
    code, out, err = run(capsys, "check", str(path), "--exact", "--format", "json")
    assert code == 1, err
    assert json.loads(out)["exact"]["message"] == "no valid token to compare: nothing is shown bitwise identical"


# -------------------------------------------------------------------------------------- one ulp apart


@pytest.mark.parametrize("seed", [3, 4])
def test_tokens_one_ulp_apart_are_counted_and_placed(tmp_path: Path, capsys: pytest.CaptureFixture, seed: int) -> None:
    rows, chosen = planted(seed)
    path = rows.write(tmp_path / "ulp.parquet")
    report = exact_json(path, capsys=capsys)
    want = brute(rows)
    assert want["tokens_different"] == len(chosen) and want["max_ulp"] == 1
    assert report["exact"] == want
    first_rows = sorted({r for r, _ in chosen})
    assert [f["row"] for f in report["exact"]["first_difference"]] == first_rows[:FIRST_RESPONSES]
    assert [f["position"] for f in report["exact"]["first_difference"]] == [
        min(i for r2, i in chosen if r2 == r) for r in first_rows[:FIRST_RESPONSES]
    ]
    assert report["verdict"]["status"] == "healthy"
    row, position = chosen[0]
    where = f"first at row {row} position {position}"
    line = (
        f"exact: {len(chosen)} of {want['tokens_compared']:,} valid tokens differ in {len(first_rows)} of "
        f"{len(rows.old)} responses, max 1 ulp; {where}"
    )
    code, out, _ = run(capsys, "analyze", str(path))
    assert line in out.splitlines()
    junit, markdown = tmp_path / "j.xml", tmp_path / "m.md"
    code, out, _ = run(capsys, "check", str(path), "--exact", "--junit", str(junit), "--markdown", str(markdown))
    assert code == 1
    assert f"FAILED: not bitwise identical: {line.removeprefix('exact: ')}" in out
    assert where in junit.read_text() and 'type="rcdiag.NotIdentical"' in junit.read_text()
    assert where in markdown.read_text() and "| ❌ | bitwise identical |" in markdown.read_text()
    code, out, _ = run(capsys, "check", str(path), "--exact", "--format", "json")
    result = json.loads(out)
    assert code == 1 and not result["passed"] and not result["exact"]["passed"] and where in result["exact"]["message"]
    code, _, _ = run(capsys, "check", str(path), "--max", "kl=1")  # without --exact the one ulp passes
    assert code == 0


def test_masked_differing_tokens_are_not_counted(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rows, chosen = planted(5)
    for r, i in chosen[:3]:
        rows.mask[r][i] = 0
    want = brute(rows)
    assert want["tokens_different"] == len(chosen) - 3
    assert exact_json(rows.write(tmp_path / "masked.parquet"), capsys=capsys)["exact"] == want


def test_a_rules_file_can_ask_for_exact(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text("exact = true\n")
    rows, _ = planted(6)
    code, out, _ = run(capsys, "check", str(rows.write(tmp_path / "d.parquet")), "--rules", str(rules))
    assert code == 1 and "not bitwise identical" in out
    rules.write_text("exact = 1\n")
    code, _, err = run(capsys, "check", str(tmp_path / "d.parquet"), "--rules", str(rules))
    assert code == 2 and "exact must be true or false" in err
    rules.write_text("exact = true\n")  # a watch reports the exact match but does not gate on it: refused, not dropped
    (tmp_path / "run").mkdir()
    code, _, err = run(capsys, "watch", str(tmp_path / "run"), "--rules", str(rules), "--once")
    assert code == 2 and "exact = true is check's gate (--exact)" in err


# ------------------------------------------------------------------------------- the same counts every way


def many_differences(seed: int, n: int = 90) -> Rows:
    """Rows with many differing tokens (bf16-like noise on a third of the rows, sign crossings at zero), steps
    interleaved row by row, so every response's place and the earliest ones are tested."""
    rows = identical_rows(seed, n=n, steps=4)
    rng = np.random.default_rng(seed)
    for r in range(n):
        if rng.random() < 0.35 and len(rows.old[r]):
            noisy = rng.random(len(rows.old[r])) < 0.5
            moved = np.minimum(rows.old[r][noisy] + rng.normal(0, 0.02, noisy.sum()), 0.0)
            rows.rollout[r][noisy] = moved.astype(np.float32)
        if rng.random() < 0.1 and len(rows.old[r]):
            rows.old[r][0], rows.rollout[r][0] = np.float32(-0.0), np.float32(1e-4)  # across zero
    return rows


def test_chunks_workers_devices_and_saved_states_give_the_same_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """First differences follow reading order: the steps interleave row by row (the engine groups each chunk's
    rows by step), and a dump read by two workers or merged from two saved states lists the same rows."""
    rows = many_differences(7)
    want = brute(rows)
    assert want["responses_different"] > FIRST_RESPONSES and want["max_ulp"] > 1
    path = rows.write(tmp_path / "many.parquet", row_group=16)
    for flags in ([], ["--chunk-tokens", "37"], ["--workers", "2"], ["--device", "torch-cpu"]):
        if flags == ["--device", "torch-cpu"]:
            require("torch", "torch")
        assert exact_json(path, *flags, capsys=capsys)["exact"] == want, flags
    monkeypatch.setenv("RCDIAG_SMALL_DUMP_BYTES", "0")  # the kernels instead of the small dump's numpy path
    assert exact_json(path, "--chunk-tokens", "50", capsys=capsys)["exact"] == want
    halves = [
        Rows(rows.old[a:b], rows.rollout[a:b], rows.mask[a:b], rows.step[a:b]).write(tmp_path / f"part{a}.parquet")
        for a, b in ((0, 40), (40, len(rows.old)))
    ]
    states = []
    for part in halves:
        state = tmp_path / f"{part.stem}.state.json"
        code, _, err = run(capsys, "analyze", str(part), "--save-state", str(state), "--format", "json")
        assert code == 0, err
        states.append(str(state))
    code, out, err = run(capsys, "merge", *states, "--format", "json")
    assert code == 0, err
    assert json.loads(out)["exact"] == want
    frame = rcdiag.analyze(path, sequences=tmp_path / "seq.parquet").sequences_frame().sort("row")
    got = list(zip(frame["tokens_different"], frame["max_ulp"], frame["first_difference"], strict=True))
    assert got == per_row(rows)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 25),
    cuts=st.lists(st.integers(1, 24), max_size=4),
    backend=st.sampled_from(["kernels", "numpy"]),
)
def test_any_split_into_chunks_gives_the_brute_force(seed: int, n: int, cuts: list[int], backend: str) -> None:
    rows = many_differences(seed, n=n)
    chunks = rows.chunks(sorted({c for c in cuts if c < n}))
    device = NumpyBackend(compiled=backend == "kernels")
    report = rcdiag.analyze_chunks(chunks, device=device)
    assert report.to_dict()["exact"] == brute(rows)


# ------------------------------------------------------------------------------------------- watch, real model


def test_a_watch_keeps_the_exact_match_across_files_and_restarts(tmp_path: Path) -> None:
    from rcdiag.io.dump_writer import DumpWriter
    from rcdiag.watch import Watch

    rows = identical_rows(8, n=30)
    directory, state = tmp_path / "run", tmp_path / "watch.state.json"
    writer = DumpWriter(directory)
    for step in (0, 1):
        picked = [r for r in range(30) if r % 2 == step]
        writer.write(step=step, old_log_prob=[rows.old[r] for r in picked],
                     rollout_log_prob=[rows.rollout[r] for r in picked],
                     response_mask=[rows.mask[r] for r in picked])  # fmt: skip
    session = Watch(str(directory), state_path=state, settle=0)
    session.poll_once()
    assert session.report is not None and session.report.verdict is not None
    assert session.report.verdict.status == "identical"
    session.close()
    later = rows.old[5].copy()
    valid = int(np.flatnonzero(rows.mask[5])[0])
    later[valid] = np.nextafter(later[valid], np.float32(0))
    writer.write(step=2, old_log_prob=[later], rollout_log_prob=[rows.rollout[5]], response_mask=[rows.mask[5]])
    resumed = Watch(str(directory), state_path=state, settle=0)
    resumed.poll_once()
    assert resumed.report is not None and resumed.report.verdict is not None
    exact = resumed.report.to_dict()["exact"]
    assert resumed.report.verdict.status == "healthy"
    assert exact["tokens_different"] == 1 and exact["max_ulp"] == 1
    assert exact["first_difference"] == [{"row": 30, "position": valid, "tokens_different": 1, "max_ulp": 1}]
    assert exact["tokens_compared"] == sum(int(m.sum()) for m in rows.mask) + int(rows.mask[5].sum())
    resumed.close()


def test_a_real_models_clean_fp32_dump_is_not_identical() -> None:
    """The tests' real model: the rollout samples token by token against a key-value cache, the trainer scores the
    response in one teacher-forced pass; both in float32, the same weights. The sums round in another order, so most
    tokens differ by a few ulps: kl is ~0, but the dump is not bitwise identical, and nothing says it is."""
    from shape_dumps import dump

    report = rcdiag.analyze(dump("clean_fp32", 0))
    exact = report.sections["exact"]
    assert report.verdict is not None and report.verdict.status != "identical"
    assert 0 < exact.tokens_different <= exact.tokens_compared == report.input.valid_tokens
    assert exact.max_ulp >= 1 and not math.isnan(exact.max_ulp)
    print(f"clean_fp32 seed 0: {exact.summary()}; verdict {report.verdict.status}")


def test_every_status_has_its_colours() -> None:
    from typing import get_args

    from rcdiag.records.report import VerdictStatus
    from rcdiag.render.panels import STATUS_COLOURS
    from rcdiag.render.verdict_text import STATUS_STYLE

    assert set(get_args(VerdictStatus)) == set(STATUS_STYLE) == set(STATUS_COLOURS)


def test_a_named_cause_outranks_identical(tmp_path: Path) -> None:
    """Bitwise identical, but the mask covers padding (0.0 on both sides for most valid tokens): the mask is the
    answer (``broken``), not ``identical``."""
    rows = identical_rows(9, n=40)
    for r in range(len(rows.old)):
        pad = np.zeros(2 * len(rows.old[r]) + 2, np.float32)
        rows.old[r] = np.concatenate([rows.old[r], pad])
        rows.rollout[r] = np.concatenate([rows.rollout[r], pad])
        rows.mask[r] = np.ones(len(rows.old[r]), np.int8)
    report = rcdiag.analyze(rows.write(tmp_path / "padded.parquet"))
    assert report.sections["exact"].identical
    assert report.verdict is not None and report.verdict.status == "broken"
    assert [cause.cls for cause in report.verdict.causes] == ["mask"]
