"""Hostile state files, rules files and text (issue 25, items 3, 11, 12, 13, 14): every one is refused with one line
naming the file (and the field), exit 2; text from a file never acts on a terminal.

Every hostile file is built here, in ``tmp_path``; the process-level promises (exit code, exactly one line on stderr,
no raw escape sequence) are checked through real subprocesses.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rcdiag
from rcdiag.check.rules_file import load_rules
from rcdiag.cli import main
from rcdiag.engine import state_files as state_module
from rcdiag.runtime.errors import ConfigError, InputError
from rcdiag.runtime.printable import printable
from rcdiag.sections.registry import KINDS
from tests.conftest import ROOT, SAMPLES, ragged_lists, random_batch, write_dump

ESC = "\x1b"


MEMORY_CAP = 3 << 30
"""Every hostile file is refused within this address space (``RLIMIT_AS``) in the subprocess that reads it."""


def _capped() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def run_cli(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "rcdiag", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
        preexec_fn=_capped if sys.platform == "linux" else None,
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The process (under ``MEMORY_CAP``) failed with exit 2 and wrote exactly one line, the error, to stderr (no
    escape sequence)."""
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and result.stderr.endswith("\n"), result.stderr
    assert lines[0].startswith("rcdiag: error: ") and ESC not in lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A genuine state (two steps, --explain) of a small dump."""
    root = tmp_path_factory.mktemp("saved")
    old, rollout, mask = random_batch(np.random.default_rng(7), rows=24, width=12, noise=0.3)
    columns = {**ragged_lists(old, rollout, mask), "step": [i % 2 for i in range(24)]}
    dump = write_dump(root / "dump.parquet", columns)
    rcdiag.analyze(dump, save_state=root / "state.json", explain=True)
    return root / "state.json"


@pytest.fixture(scope="module")
def payload(saved: Path) -> dict[str, Any]:
    return json.loads(saved.read_text())


def tampered(tmp_path: Path, payload: dict[str, Any], change: Callable[[dict[str, Any]], Any]) -> Path:
    data = copy.deepcopy(payload)
    change(data)
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(data))
    return path


def refused(path: Path) -> str:
    with pytest.raises(InputError) as caught:
        rcdiag.merge_states([path])
    message = str(caught.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    return message


def groups(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The first batch's accumulator states by kind."""
    return {group["kind"]: group["state"] for group in data["state"]["batches"][0][1]["groups"]}


# ---------------------------------------------------------------------------------- 11: parse within limits


def test_a_genuine_state_still_merges(saved: Path) -> None:
    report = rcdiag.merge_states([saved])
    assert report.input.rows == 24 and report.explain is not None


def test_deeply_nested_json_is_refused_before_parsing(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text('{"format": "rcdiag-state", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert refused(path).endswith(
        f"is not an rcdiag state file (JSON nested 100001 deep; at most {state_module.MAX_STATE_DEPTH})"
    )
    brackets_in_strings = tmp_path / "strings.json"  # brackets inside strings do not nest
    brackets_in_strings.write_text(json.dumps({"format": "other", "x": "[" * 1000, "y": '\\"[{'}))
    assert state_module.json_depth(brackets_in_strings.read_bytes()) == 1


def test_an_integer_of_5000_digits_is_refused(tmp_path: Path, payload: dict[str, Any]) -> None:
    path = tampered(tmp_path, payload, lambda p: p["state"].__setitem__("rows", 7))
    path.write_text(path.read_text().replace('"rows": 7', '"rows": ' + "9" * 5000))
    assert refused(path).endswith(
        f"is not an rcdiag state file (an integer of 5000 digits; at most {state_module.MAX_INT_DIGITS})"
    )


@pytest.mark.parametrize(
    ("literal", "says"),
    [("1e400", "the number 1e400 is beyond float64's range"), ("NaN", "the literal NaN"), ("-Infinity", "-Infinity")],
)
def test_numbers_beyond_float64_and_nan_literals_are_refused(tmp_path: Path, literal: str, says: str) -> None:
    path = tmp_path / "n.json"
    path.write_text('{"format": "rcdiag-state", "version": ' + literal + "}")
    assert says in refused(path)


def test_a_state_over_the_size_limit_is_refused_before_reading(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(state_module, "MAX_STATE_BYTES", 1 << 20)
    path = tmp_path / "huge.json"
    path.write_text("[" + "0," * (1 << 20) + "0]")  # a 2 MiB array
    assert refused(path) == f"{path}: is 2,097,155 bytes; the limit for a state file is 1 MiB"


def test_invalid_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "latin.json"
    path.write_bytes(b'{"format": "rcdiag-state", "x": "caf\xe9"}')
    assert refused(path).endswith("is not an rcdiag state file (not UTF-8 text: byte 36)")


def test_hostile_state_files_end_in_one_line_through_the_cli(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 50_000 + "]" * 50_000)
    digits = tmp_path / "digits.json"
    digits.write_text('{"version": ' + "1" * 5000 + "}")
    latin = tmp_path / "latin.json"
    latin.write_bytes(b'{"x": "\xff"}')
    for path, says in ((deep, "nested 50000 deep"), (digits, "5000 digits"), (latin, "not UTF-8")):
        line = one_error_line(run_cli("merge", path))
        assert line.startswith(f"rcdiag: error: {path}: is not an rcdiag state file (") and says in line


# ------------------------------------------------------------------- 11: rules files and pyproject.toml


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("a = " + "[" * 5000 + "]" * 5000, "not valid TOML (arrays or tables nested too deep)"),
        ("[max]\nkl = " + "9" * 5000, "not valid TOML (Exceeds the limit (4300 digits)"),
        (b"[max]\nkl = '\xff'\n", "not valid TOML (not UTF-8 text: byte 12)"),
    ],
)
def test_hostile_rules_files_are_one_line_naming_the_file(tmp_path: Path, text: str | bytes, says: str) -> None:
    path = tmp_path / "rules.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(InputError, match=r"^.*rules\.toml: " + r"\S") as caught:
        load_rules(path)
    assert str(caught.value).startswith(f"{path}: {says}")


def test_a_rules_file_over_the_limit_is_refused(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr("rcdiag.check.rules_file.MAX_RULES_BYTES", 1024)
    path = tmp_path / "big.toml"
    path.write_text("# " + "x" * 2000 + "\n")
    with pytest.raises(InputError, match="is more than 0 MiB, the limit for a rules file"):
        load_rules(path)


# ----------------------------------------------------------------------- 12: every field of its type


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda p: p["state"].__setitem__("rows", -5), "state.rows must be a count (an integer >= 0), got -5 (int)"),
        (lambda p: p["state"].__setitem__("tokens", "12"), "state.tokens must be a count (an integer >= 0), got '12'"),
        (
            lambda p: groups(p)["OffPolicyMetrics"].__setitem__("tokens", -100.0),
            "OffPolicyMetrics.tokens must be a finite number >= 0, got -100.0 (float)",
        ),
        (
            lambda p: groups(p)["OffPolicyMetrics"].__setitem__("rows", "24"),
            "OffPolicyMetrics.rows must be a number, got '24' (str)",
        ),
        (
            lambda p: groups(p)["LogRatioHistogram"]["counts"].__setitem__(3, -1),
            "LogRatioHistogram.counts must hold counts (integers >= 0 in int64)",
        ),
        (
            lambda p: groups(p)["ExtraMetrics"].__setitem__("row_mean", [-1, 0.0, 0.0]),
            "ExtraMetrics.row_mean n must be a finite number >= 0, got -1 (int)",
        ),
        (
            lambda p: p["state"]["batches"][0].__setitem__(0, 0.5),
            "state.batches step must be a step (an integer in int64's or uint64's range, or null), got 0.5 (float)",
        ),
        (
            lambda p: p["state"]["batches"][0].__setitem__(0, 2**64),
            "state.batches step must be a step (an integer in int64's or uint64's range, or null), got "
            "18446744073709551616 (int)",
        ),
        (
            lambda p: p["state"]["batches"][0].__setitem__(0, -(2**63) - 1),
            "state.batches step must be a step (an integer in int64's or uint64's range, or null), got "
            "-9223372036854775809 (int)",
        ),
        (lambda p: p["state"]["batches"][1].__setitem__(0, p["state"]["batches"][0][0]), "holds step 0 twice"),
        (lambda p: p.__setitem__("kind", "bogus"), "kind must be one of analyze, sweep, got 'bogus' (str)"),
        (lambda p: p["config"].__setitem__("bypass_mode", "yes"), "config.bypass_mode must be true or false"),
        (lambda p: p["config"].__setitem__("loss_type", 5), "loss_type must be a string, got 5 (int)"),
        (lambda p: p["sources"][0].__setitem__("total_rows", "24"), "sources[0].total_rows must be a count"),
        (lambda p: p["screen"].__setitem__("rows_read", -1), "screen.rows_read must be a count"),
        (
            lambda p: p["state"]["whole_dump"]["explain"].__setitem__("rows_read", 1.5),
            "explain.rows_read must be a count",
        ),
        (
            lambda p: p["state"]["whole_dump"]["explain"]["breakdowns"].__setitem__("prob", [1, 2]),
            "Breakdowns.prob must hold 40 values, holds 2",
        ),
        (
            lambda p: p["state"]["whole_dump"]["explain"]["worst"]["entries"]["items"][0]["entry"].__setitem__(
                "length", "9"
            ),
            "WorstResponses.entries.items[0].entry.length must be a count",
        ),
        (
            lambda p: p["state"]["whole_dump"]["explain"]["worst"]["entries"].__setitem__("n", 3),
            "WorstResponses.entries must hold at most 3 items, holds 10",
        ),
        (
            lambda p: p["state"]["whole_dump"]["explain"]["tokens"]["table"].__setitem__("ids", [-1]),
            "TokenSums.table.ids must hold counts",
        ),
        (
            lambda p: p["state"]["whole_dump"].__setitem__("bogus", {}),
            f"state.whole_dump.bogus is a state no section declares (known: {', '.join(sorted(KINDS))};",
        ),
        (
            lambda p: p["state"]["whole_dump"]["slices"].__setitem__("rows_read", -1),
            "slices.rows_read must be a count",
        ),
        (
            lambda p: p["state"]["whole_dump"]["slices"]["steps"][0][1][0].append(1.0),
            "slices.steps tables must have 3 columns",
        ),
        (
            lambda p: p["state"]["whole_dump"]["slices"]["steps"][0][1][0].__setitem__(0, 1e6),
            "slices.steps row numbers must be rows read (0 to 23)",
        ),
        (
            lambda p: p["state"]["whole_dump"]["slices"].__setitem__("values", "[1"),
            "slices.values must be a JSON list of each column's values",
        ),
        (
            lambda p: p["state"].__setitem__("whole_dump", [1]),
            "state.whole_dump must be a table of whole-dump states, got [1]",
        ),
    ],
)
def test_a_tampered_field_is_refused_naming_file_and_field(
    tmp_path: Path, payload: dict[str, Any], change: Callable[[dict[str, Any]], Any], says: str
) -> None:
    message = refused(tampered(tmp_path, payload, change))
    assert "holds a field that does not fit: " in message and says in message


def test_a_tampered_state_through_the_cli_is_one_line(tmp_path: Path, payload: dict[str, Any]) -> None:
    path = tampered(tmp_path, payload, lambda p: p["state"].__setitem__("rows", -5))
    line = one_error_line(run_cli("merge", path))
    assert line == (
        f"rcdiag: error: {path}: holds a field that does not fit: state.rows must be a count (an integer >= 0), "
        "got -5 (int)"
    )


def test_a_string_state_version_shows_its_type(tmp_path: Path, payload: dict[str, Any]) -> None:
    message = refused(tampered(tmp_path, payload, lambda p: p.__setitem__("version", "1")))
    assert "has state version '1' (str) (written by rcdiag " in message and "reads version 1 (int)" in message


def test_a_sweep_state_with_a_tampered_cell_count_is_refused(tmp_path: Path) -> None:
    old, rollout, mask = random_batch(np.random.default_rng(2), rows=6, width=5, noise=0.3)
    dump = write_dump(tmp_path / "d.parquet", ragged_lists(old, rollout, mask))
    from rcdiag.sweep import sweep
    from rcdiag.sweep.grid import SweepGrid

    sweep(dump, SweepGrid.from_specs({"token_k1": ["1.5", "2.0"]}), save_state=tmp_path / "s.json")
    data = json.loads((tmp_path / "s.json").read_text())
    groups = data["state"]["batches"][0][1]["groups"]  # analyze's accumulators (the verdict's), then the options'
    group = next(group for group in groups if group["kind"] == "TokenRSSweep")
    group["state"]["cells"]["n"][0] = -3.0
    path = tampered(tmp_path, data, lambda p: None)
    message = refused(path)
    assert "cells.n must hold finite numbers >= 0 (counts), holds -3.0" in message


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('rollout_is_batch_normalize = "no"', "rollout_is_batch_normalize must be true or false, got 'no' (str)"),
        ('bypass_mode = "yes"', "bypass_mode must be true or false, got 'yes' (str)"),
        ("loss_type = 5", "loss_type must be a string, got 5 (int)"),
    ],
)
def test_a_mistyped_engine_field_in_toml_is_refused(tmp_path: Path, line: str, says: str) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(f'[engine]\npreset = "decoupled_seq_is"\n{line}\n[max]\nkl = 1\n')
    with pytest.raises(ConfigError) as caught:
        load_rules(path).config()  # type: ignore[union-attr]
    assert str(caught.value) == f"{path}: [engine]: {says}"


def test_a_mistyped_pyproject_engine_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.rcdiag.check]\n[tool.rcdiag.check.engine]\nbypass_mode = "yes"\n[tool.rcdiag.check.max]\nkl = 1\n'
    )
    dump = ROOT / "sample_data" / "healthy.parquet"
    line = one_error_line(run_cli("check", dump, cwd=tmp_path))
    assert line == "rcdiag: error: pyproject.toml: [engine]: bypass_mode must be true or false, got 'yes' (str)"


def test_correction_config_refuses_mistyped_fields() -> None:
    with pytest.raises(ConfigError, match="rollout_is_batch_normalize must be true or false, got 'no'"):
        rcdiag.CorrectionConfig(rollout_is="token", rollout_is_batch_normalize="no")  # type: ignore[arg-type]
    assert rcdiag.CorrectionConfig(rollout_is="token", rollout_is_batch_normalize=True).resolve().is_spec


# ------------------------------------------------------------------ 3 and 14: duplicates, FIFOs


def test_a_hard_link_of_a_state_is_refused(tmp_path: Path, saved: Path) -> None:
    link = tmp_path / "link.json"
    os.link(saved, link)
    with pytest.raises(InputError) as caught:
        rcdiag.merge_states([saved, link])
    assert str(caught.value).startswith(f"{link}: read {saved.parent / 'dump.parquet'}, which {saved} also read (")


def test_a_state_without_reads_given_twice_is_refused_by_its_digest(tmp_path: Path, payload: dict[str, Any]) -> None:
    first = tampered(tmp_path, payload, lambda p: p["sources"][0].__setitem__("reads", []))
    copied = tmp_path / "copy.json"
    copied.write_bytes(first.read_bytes())
    os.utime(copied, (1, 1))  # another modification time: the content says it is the same state
    with pytest.raises(InputError) as caught:
        rcdiag.merge_states([first, copied])
    assert str(caught.value) == (
        f"{copied}: holds the same state as {first}; merging it twice would count its rows twice: give each "
        "shard's state once"
    )
    link = tmp_path / "link.json"
    os.link(first, link)
    with pytest.raises(InputError, match=f"^{link}: is the same file as {first}; merging it twice"):
        rcdiag.merge_states([first, link])


def test_a_dump_read_through_a_hard_link_or_touched_is_not_merged_twice(tmp_path: Path) -> None:
    old, rollout, mask = random_batch(np.random.default_rng(5), rows=8, width=4)
    dump = write_dump(tmp_path / "a.parquet", ragged_lists(old, rollout, mask))
    os.link(dump, tmp_path / "b.parquet")
    rcdiag.analyze(dump, save_state=tmp_path / "a.json")
    rcdiag.analyze(tmp_path / "b.parquet", save_state=tmp_path / "b.json")
    os.utime(dump, (1, 1))  # touched: another modification time, the same file
    rcdiag.analyze(dump, save_state=tmp_path / "touched.json")
    with pytest.raises(InputError) as caught:
        rcdiag.merge_states([tmp_path / "a.json", tmp_path / "b.json"])
    assert str(caught.value).startswith(
        f"{tmp_path / 'b.json'}: read {tmp_path / 'b.parquet'}; {tmp_path / 'a.json'} read {dump} (the same "
        "file: device, inode and content); merging it twice would count its rows twice"
    )
    line = one_error_line(run_cli("merge", tmp_path / "a.json", tmp_path / "touched.json"))
    assert line.startswith(
        f"rcdiag: error: {tmp_path / 'touched.json'}: read {dump}, which {tmp_path / 'a.json'} also read (the same "
        "file: device, inode and content)"
    )


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_merging_a_fifo_is_refused_without_blocking(tmp_path: Path, saved: Path) -> None:
    fifo = tmp_path / "state.json"
    os.mkfifo(fifo)
    line = one_error_line(run_cli("merge", fifo, saved))
    assert line == f"rcdiag: error: {fifo}: is a FIFO, not a regular file; give a state file"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_a_fifo_as_rules_file_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "rules.toml"
    os.mkfifo(fifo)
    line = one_error_line(run_cli("check", SAMPLES / "healthy.parquet", "--rules", fifo))
    assert line == f"rcdiag: error: {fifo}: is a FIFO, not a regular file; give a rules file"


# --------------------------------------------------------------------- 13: text from a file, warnings


def test_printable_writes_control_characters_out() -> None:
    assert printable("a\nb\x1b[2Jc\td\r\x07\u202e") == "a\\nb\\x1b[2Jc\\td\\r\\x07\\u202e"
    assert printable("plain · text 'é'") == "plain · text 'é'"


def test_a_column_name_with_escapes_reaches_stderr_escaped(tmp_path: Path) -> None:
    old, rollout, mask = random_batch(np.random.default_rng(1), rows=4, width=3)
    lists = ragged_lists(old, rollout, mask)
    dump = write_dump(
        tmp_path / "d.parquet",
        {"old\x1b[2J\nboom": lists["old_log_prob"], "rollout_log_prob": lists["rollout_log_prob"]},
        types={"old\x1b[2J\nboom": rcdiag_list_type()},
    )
    line = one_error_line(run_cli("analyze", dump))
    assert "columns present: 'old\\x1b[2J\\nboom', 'rollout_log_prob'" in line


def rcdiag_list_type() -> Any:
    import pyarrow as pa

    return pa.list_(pa.float32())


def test_metadata_with_escapes_reaches_the_terminal_report_escaped(tmp_path: Path) -> None:
    old, rollout, mask = random_batch(np.random.default_rng(1), rows=4, width=3)
    dump = write_dump(
        tmp_path / "d.parquet", ragged_lists(old, rollout, mask), metadata={"model": "evil\x1b[2J\nsecond line"}
    )
    result = run_cli("analyze", dump, "--format", "table")
    assert result.returncode == 0, result.stderr
    assert "model=evil\\x1b[2J\\nsecond line" in result.stdout and "\x1b[2J" not in result.stdout


def test_a_log_prob_column_of_numbers_says_what_it_holds(tmp_path: Path) -> None:
    import pyarrow as pa

    flat = write_dump(
        tmp_path / "flat.parquet",
        {"old_log_prob": [0.1, 0.2], "rollout_log_prob": [0.1, 0.2]},
        types={"old_log_prob": pa.float64(), "rollout_log_prob": pa.float64()},
    )
    line = one_error_line(run_cli("analyze", flat))
    assert line.startswith(
        f"rcdiag: error: {flat}: column 'old_log_prob' holds double, not lists of log-probs, so the dump is read as "
        "one row per token, which needs a column for the sequence id; it has none (looked for 'seq_id'"
    )
    strings = write_dump(
        tmp_path / "strings.parquet",
        {"old_log_prob": ["a"], "rollout_log_prob": ["b"]},
        types={"old_log_prob": pa.string(), "rollout_log_prob": pa.string()},
    )
    assert one_error_line(run_cli("analyze", strings)) == (
        f"rcdiag: error: {strings}: column 'old_log_prob' holds string values; expected lists of log-probs (one "
        "response per row) or numbers with a sequence-id column (one row per token)"
    )


def test_a_warning_never_precedes_the_error_line(monkeypatch: Any, capsys: pytest.CaptureFixture) -> None:
    def warn_then_fail(*args: Any, **kwargs: Any) -> None:
        warnings.warn("overflow encountered in cast", RuntimeWarning, stacklevel=1)
        raise InputError("holds a bad value", path="x.json")

    monkeypatch.setattr("rcdiag.api.merge", warn_then_fail)
    with pytest.raises(SystemExit) as caught:
        main(["merge", "x.json"])
    assert caught.value.code == 2
    assert capsys.readouterr().err == "rcdiag: error: x.json: holds a bad value\n"


def test_the_docs_give_the_limits_the_code_enforces() -> None:
    from rcdiag.check.rules_file import MAX_RULES_BYTES

    page = (ROOT / "docs" / "scale-out.md").read_text()
    assert f"of at most {state_module.MAX_STATE_BYTES >> 20} MiB" in page
    assert f"nested at most {state_module.MAX_STATE_DEPTH} deep" in page
    assert f"integers of at most {state_module.MAX_INT_DIGITS} digits" in page
    block, blocks = state_module.FINGERPRINT_BLOCK, state_module.FINGERPRINT_BLOCKS
    assert f"up to {block * blocks >> 20} MiB, else {blocks} blocks of {block >> 10} KiB" in page
    assert f"rules file (more than {MAX_RULES_BYTES >> 20} MiB" in (ROOT / "docs" / "exit-codes.md").read_text()
