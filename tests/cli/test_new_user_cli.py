"""What a new user runs into, round three (issue 36): paths, help and messages, each through the real CLI.

An empty PATH (an unset variable) and a missing one are usage errors in every command; ``-h`` is help everywhere;
help shows flags as flags and the usage line as click writes it; threshold messages show the accepted forms and
name flags, not verl's fields; a dump whose every row is bad is not told to skip them; and the verdict's "not
examined" step says what is really missing for the token-id detector."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import ROOT, write_dump
from hostile import run_capped

import rcdiag
from rcdiag.runtime.errors import InputError

EMPTY = "the path is empty (an unset shell variable?); give a file, directory, glob or URL"
K1_FORMS = "An RS threshold for token_k1: U (the ratio band [1/U, U], e.g. 2.0) or L_U (e.g. 0.5_2.0)."
IS_FORMS = (
    "An IS threshold is U (TIS: weights truncated at U, e.g. 2.0) or L_U (IcePop: weights outside [L, U] zeroed, "
    "e.g. 0.5_5.0)."
)
COMMANDS = ("analyze", "compare", "check", "merge", "sweep", "presets", "watch")
USAGE = {
    "analyze": "[OPTIONS] PATH",
    "compare": "[OPTIONS] A B [C...]",
    "check": "[OPTIONS] PATH",
    "merge": "[OPTIONS] STATE...",
    "sweep": "[OPTIONS] PATH",
    "presets": "[OPTIONS]",
    "watch": "[OPTIONS] DIR",
}
TOKEN_SPECIFIC_NEEDS_EXPLAIN = (
    "token_specific not run: it reads the token-id column and --explain's by-token table, which analyze leaves out by "
    "default (the ids' decode alone costs about 1.3x a plain analyze: docs/performance.md); --explain runs it"
)


def _dump(path: Path, *, rows: int = 6, probabilities: bool = False, token_ids: bool = False) -> Path:
    """``rows`` responses of 4 tokens, the rollout 0.01 nat below the trainer; ``probabilities``: the trainer's
    column holds exp(log-prob), every value in (0, 1], so every row is bad; ``token_ids``: verl's ``responses``."""
    old = [[-0.5 - 0.1 * (i + j) for j in range(4)] for i in range(rows)]
    columns: dict[str, list] = {
        "old_log_prob": [[2.718281828**v for v in row] for row in old] if probabilities else old,
        "rollout_log_prob": [[v - 0.01 for v in row] for row in old],
        "response_mask": [[1] * 4 for _ in range(rows)],
    }
    if token_ids:
        columns["responses"] = [[(7 * i + j) % 50 for j in range(4)] for i in range(rows)]
    return write_dump(path, columns, types={"responses": pa.list_(pa.int32())})


def _one_line(args: tuple[str, ...], line: str, cwd: Path | None = None) -> None:
    """``rcdiag ARGS`` exits 2 with exactly ``line`` on stderr and nothing on stdout."""
    done = run_capped(*args, cwd=cwd)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", line + "\n"), done


# ------------------------------------------------------------------------------------- 1. an empty PATH


@pytest.mark.parametrize(
    ("args", "name", "command"),
    [
        (("analyze", ""), "PATH", "analyze"),
        (("check", "", "--max", "k3_kl=1e-3"), "PATH", "check"),
        (("compare", "", "good.parquet"), "A", "compare"),
        (("compare", "good.parquet", " "), "B", "compare"),
        (("sweep", ""), "PATH", "sweep"),
        (("watch", "", "--once"), "DIR", "watch"),
        (("merge", "s.json", ""), "STATE", "merge"),
        (("check", "good.parquet", "--baseline", "", "--max-increase", "kl=50%"), "--baseline", "check"),
    ],
    ids=["analyze", "check", "compare-a", "compare-b-blank", "sweep", "watch", "merge", "check-baseline"],
)
def test_an_empty_path_is_a_usage_error_not_the_current_directory(
    tmp_path: Path, args: tuple[str, ...], name: str, command: str
) -> None:
    """In a directory holding a good dump, ``""`` used to analyse that directory (``check`` passed)."""
    _dump(tmp_path / "good.parquet")
    line = f"rcdiag: error: Invalid value for '{name}': {EMPTY} (see 'rcdiag {command} --help')"
    _one_line(args, line, cwd=tmp_path)


def test_the_library_refuses_an_empty_path_too(tmp_path: Path) -> None:
    with pytest.raises(InputError) as info:
        rcdiag.analyze("")
    assert str(info.value) == EMPTY
    with pytest.raises(InputError) as info:
        rcdiag.merge_states([""])
    assert str(info.value) == EMPTY


# ----------------------------------------------------------------------------------- 2. a missing PATH, -h


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (("analyze",), "PATH"),
        (("check",), "PATH"),
        (("check", "--max", "kl=1"), "PATH"),
        (("compare",), "A"),
        (("compare", "a.parquet"), "B"),
        (("sweep",), "PATH"),
        (("watch",), "DIR"),
        (("merge",), "STATE"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, tuple) else value,
)
def test_a_missing_path_is_a_usage_error_in_every_command(args: tuple[str, ...], name: str) -> None:
    _one_line(args, f"rcdiag: error: Missing argument '{name}'. (see 'rcdiag {args[0]} --help')")


def _help(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TERMINAL_WIDTH")}
    env |= {"COLUMNS": "200", "NO_COLOR": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "rcdiag", *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_h_is_help_everywhere_and_flags_take_no_placeholder(command: str) -> None:
    """``-h`` prints what ``--help`` prints (exit 0); no flag shows a value (``--explain <bool>``), and the usage
    line is click's (``PATH``, not ``{PATH}``)."""
    words = [command] if command else []
    short, long = _help(*words, "-h"), _help(*words, "--help")
    assert (short.returncode, short.stderr) == (0, "") and short.stdout == long.stdout
    lines = short.stdout.splitlines()
    usage = next(line.strip() for line in lines if "Usage:" in line)
    assert usage == (
        f"Usage: rcdiag {command} {USAGE[command]}" if command else "Usage: rcdiag [OPTIONS] COMMAND [ARGS]..."
    )
    assert "<bool>" not in short.stdout and "{" not in usage
    help_row = next(line for line in lines if "--help" in line and "Show this message" in line)
    assert help_row.split() == ["│", "--help", "-h", "Show", "this", "message", "and", "exit.", "│"]
    if command == "analyze":
        explain = next(line for line in lines if line.startswith("│ --explain "))
        assert explain.split()[:3] == ["│", "--explain", "Also"]


# ------------------------------------------------------------------------------------ 4. threshold messages


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (
            ("--rs", "token_k1", "--rs-threshold", "0.5-2.0"),
            "Invalid numeric threshold '0.5-2.0' for option 'token_k1'. (verl v0.9.0 crashes here with a bare "
            f"ValueError: could not convert string to float: '0.5-2.0') {K1_FORMS}",
        ),
        (
            ("--rs", "token_k1"),
            "--rs-threshold must be explicitly provided when --rs is enabled. Set --rs-threshold to the desired "
            f"threshold value. {K1_FORMS}",
        ),
        (
            ("--rs", "token_k1,seq_mean_k3"),
            "--rs-threshold must be explicitly provided when --rs is enabled. Set --rs-threshold to the desired "
            "threshold value. An RS threshold for token_k1: U (the ratio band [1/U, U], e.g. 2.0) or L_U (e.g. "
            "0.5_2.0); for seq_mean_k3: an upper bound U (e.g. 0.01; no '_'); one threshold for every option, or one "
            "per option separated by commas.",
        ),
        (
            ("--rs", "token_k2", "--rs-threshold", "0.1_0.2"),
            "--rs-threshold for option 'token_k2' must provide a single upper bound without '_'. Received '0.1_0.2'. "
            "An RS threshold for token_k2: an upper bound U (e.g. 0.01; no '_').",
        ),
        (("--is", "token", "--is-threshold", "0.5-2.0"), f"Invalid --is-threshold '0.5-2.0'. {IS_FORMS}"),
        (("--is", "token", "--is-threshold", "5_2"), f"--is-threshold lower bound must be <= upper bound. {IS_FORMS}"),
        (
            ("--rs", "seq_max_k1", "--rs-threshold", "2"),
            "Invalid --rs option: seq_max_k1. Must be one of ['seq_max_k2', 'seq_max_k3', 'seq_mean_k1', "
            "'seq_mean_k2', 'seq_mean_k3', 'seq_sum_k1', 'seq_sum_k2', 'seq_sum_k3', 'token_k1', 'token_k2', "
            "'token_k3'].",
        ),
    ],
    ids=["k1-dash", "rs-without-threshold", "two-options", "k2-band", "is-dash", "is-order", "rs-option"],
)
def test_threshold_messages_show_the_forms_and_name_flags(tmp_path: Path, flags: tuple[str, ...], line: str) -> None:
    path = _dump(tmp_path / "d.parquet")
    _one_line(("analyze", str(path), *flags), f"rcdiag: error: {line}")


def test_sweep_names_its_own_flags(tmp_path: Path) -> None:
    path = str(_dump(tmp_path / "d.parquet"))
    _one_line(
        ("sweep", path, "--is", "token", "--thresholds", "3_2"),
        f"rcdiag: error: --thresholds lower bound must be <= upper bound. {IS_FORMS}",
    )
    _one_line(("sweep", path, "--is", "tok"), "rcdiag: error: --is must be one of token, sequence, got 'tok'")


def test_a_rules_files_field_keeps_its_name(tmp_path: Path) -> None:
    """A value written in a rules file is named as written there; the missing threshold, which a flag can set, by
    its flag."""
    path = str(_dump(tmp_path / "d.parquet"))
    rules = tmp_path / "rules.toml"
    rules.write_text('[engine]\nrollout_rs = "token_k1"\n\n[[rule]]\nmetric = "kl"\nmax = 1.0\n')
    _one_line(
        ("check", path, "--rules", str(rules)),
        "rcdiag: error: --rs-threshold must be explicitly provided when rollout_rs is enabled. Set --rs-threshold to "
        f"the desired threshold value. {K1_FORMS}",
    )


# ------------------------------------------------------------------------------------- 5. every row bad


def test_a_dump_of_probabilities_is_not_told_to_skip_every_row(tmp_path: Path) -> None:
    path = _dump(tmp_path / "p.parquet", probabilities=True)
    first = (
        f"rcdiag: error: {path}, row 0, column 'old_log_prob': holds a positive log-prob (0.606531); log-probs are "
        "<= 0 (is this column probabilities or logits?) at valid position 0 of the response; "
    )
    for command in (("analyze",), ("check", "--max", "kl=1")):
        _one_line(
            (*command[:1], str(path), *command[1:]),
            first + "every row of the dump is bad (6 rows: positive_logprob 6), so skipping bad rows would leave "
            "nothing to analyze; fix the dump",
        )
    # skipping them is refused as before: the advice above never leads there
    _one_line(
        ("analyze", str(path), "--on-bad-row", "skip"),
        "rcdiag: error: every row was skipped (6 rows: positive_logprob 6); there is nothing to analyze",
    )


def test_a_dump_with_some_bad_rows_is_still_told_it_can_skip_them(tmp_path: Path) -> None:
    good = _dump(tmp_path / "g.parquet", rows=3)
    bad = _dump(tmp_path / "b.parquet", rows=1, probabilities=True)
    _one_line(
        ("analyze", str(tmp_path)),
        f"rcdiag: error: {bad}, row 0, column 'old_log_prob': holds a positive log-prob (0.606531); log-probs are "
        "<= 0 (is this column probabilities or logits?) at valid position 0 of the response; 1 row(s) of the dump "
        "are bad (positive_logprob 1); fix the dump, or pass --on-bad-row skip to leave those rows out",
    )
    assert good.exists()


# ------------------------------------------------------------------------------ 6. the token-id detector


def _next_steps(path: Path, *flags: str) -> tuple[dict, list[str]]:
    done = run_capped("analyze", path, "--format", "json", *flags)
    assert done.returncode == 0 and done.stderr == "", done
    data = json.loads(done.stdout)
    return data["input"]["columns"], data["verdict"]["next_steps"]


def test_not_run_says_what_is_really_missing(tmp_path: Path) -> None:
    """Every analyze runs the bias detectors; token_specific alone needs ``--explain`` (its by-token table), and on a
    dump without token ids also a column of them. Nothing reads "not examined"."""
    with_ids = _dump(tmp_path / "ids.parquet", token_ids=True)
    columns, steps = _next_steps(with_ids)
    assert "token_ids" not in columns  # there, but read with --explain only
    assert steps[-1] == TOKEN_SPECIFIC_NEEDS_EXPLAIN
    assert not any("not examined" in step for step in steps)
    columns, steps = _next_steps(with_ids, "--explain")
    assert columns["token_ids"] == "responses"
    assert "token_specific not run: 24 valid tokens with ids, needs 2,000" in steps

    without = _dump(tmp_path / "plain.parquet")
    columns, steps = _next_steps(without)
    assert columns["token_ids"] is None
    assert steps[-1] == "token_specific not run: the dump has no token ids (--token-col NAME)"
    assert not any("not examined" in step for step in steps)
    text = run_capped("analyze", without)
    assert text.returncode == 0 and "needs token ids in the dump" not in text.stdout
