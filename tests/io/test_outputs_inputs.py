"""No output is written over any file a run reads (rcdiag/io/outputs.py ``Ledger``), through real subprocesses: rules
files, pyproject.toml found in the current directory, a rules file's baseline, tokenizer files (named, or found in a
directory), a watch's rules, merge's tokenizer; reached by a hard link or a symlink too. Each is refused before the
dump or the protected file is read (both are built so that reading them first would say so), exit 2, one line
naming the flag and the input, and the protected file's bytes are unchanged. Also: an argument that looks like a
file but was read as an option (``-q.parquet``) is one line suggesting ``./-q.parquet``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from conftest import SAMPLES
from hostile import run_capped

import rcdiag
from rcdiag.io import outputs
from rcdiag.runtime.errors import ConfigError, OutputError

HEALTHY = SAMPLES / "healthy.parquet"
NOT_A_DUMP = b"PAR1 this is not a dump: a command that read it first would say so\n"
NOT_TOML = b"this is [not TOML: a command that read it first would say so\n"
NOT_A_TOKENIZER = b"not a tokenizer: a command that read it first would say so\n"
NOT_A_STATE = b"not a state: a command that read it first would say so\n"
BASELINE_RULES = b'baseline = "base.parquet"\n[max_increase]\nkl = "50%"\n'
NEVER = "rcdiag never writes over an input: give another file name."
PROJECT = "the project file pyproject.toml (read for its [tool.rcdiag.check]; --no-pyproject skips it)"

# (arguments, the protected file, the refusal after "rcdiag: error: ")
CASES = {
    "check -o over --rules": (
        ("check", "in.parquet", "--rules", "r.toml", "-o", "r.toml"),
        "r.toml",
        "--output r.toml is the rules file r.toml",
    ),
    "check --junit over --rules": (
        ("check", "in.parquet", "--rules", "r.toml", "--junit", "r.toml"),
        "r.toml",
        "--junit r.toml is the rules file r.toml",
    ),
    "check --markdown over --rules": (
        ("check", "in.parquet", "--rules", "r.toml", "--markdown", "r.toml"),
        "r.toml",
        "--markdown r.toml is the rules file r.toml",
    ),
    "check -o over a hard link to --rules": (
        ("check", "in.parquet", "--rules", "hard.toml", "-o", "r.toml"),
        "r.toml",
        "--output r.toml is a hard link to the rules file hard.toml",
    ),
    "check -o through a symlink to --rules": (
        ("check", "in.parquet", "--rules", "r.toml", "-o", "link.toml"),
        "r.toml",
        "--output link.toml is (through a symlink) the rules file r.toml",
    ),
    "check -o over --rules given as a symlink": (
        ("check", "in.parquet", "--rules", "link.toml", "--junit", "r.toml"),
        "r.toml",
        "--junit r.toml is (through a symlink) the rules file link.toml",
    ),
    "check -o over ./pyproject.toml": (
        ("check", "in.parquet", "--max", "kl=1", "-o", "pyproject.toml"),
        "pyproject.toml",
        f"--output pyproject.toml is {PROJECT}",
    ),
    "check --junit over ./pyproject.toml, as ../": (
        ("check", "in.parquet", "--junit", "../{dir}/pyproject.toml"),
        "pyproject.toml",
        f"--junit ../{{dir}}/pyproject.toml is {PROJECT}",
    ),
    "check -o over the rules file's baseline": (
        ("check", "in.parquet", "--rules", "b.toml", "-o", "base.parquet"),
        "base.parquet",
        "--output base.parquet is the baseline base.parquet",
    ),
    "analyze -o over --tokenizer FILE": (
        ("analyze", "in.parquet", "--tokenizer", "tok.json", "-o", "tok.json"),
        "tok.json",
        "--output tok.json is the tokenizer tok.json",
    ),
    "analyze --html over --tokenizer DIR's tokenizer.json": (
        ("analyze", "in.parquet", "--tokenizer", "tokdir", "--html", "tokdir/tokenizer.json"),
        "tokdir/tokenizer.json",
        "--html tokdir/tokenizer.json is the tokenizer tokdir/tokenizer.json",
    ),
    "analyze --tokens over --tokenizer": (
        ("analyze", "in.parquet", "--tokenizer", "tok.parquet", "--tokens", "tok.parquet"),
        "tok.parquet",
        "--tokens tok.parquet is the tokenizer tok.parquet",
    ),
    "analyze --save-state over a hard link to --tokenizer": (
        ("analyze", "in.parquet", "--tokenizer", "tok.json", "--save-state", "hard.json"),
        "tok.json",
        "--save-state hard.json is a hard link to the tokenizer tok.json",
    ),
    "merge -o over --tokenizer": (
        ("merge", "s.json", "--tokenizer", "tok.json", "-o", "tok.json"),
        "tok.json",
        "--output tok.json is the tokenizer tok.json",
    ),
    "merge -o over a state": (
        ("merge", "s.json", "-o", "s.json"),
        "s.json",
        "--output s.json is the state file s.json",
    ),
    "watch --state over --rules": (
        ("watch", "w", "--rules", "r.toml", "--state", "r.toml", "--once"),
        "r.toml",
        "--state r.toml is the rules file r.toml",
    ),
}


def _inputs(directory: Path) -> None:
    """Every input of ``CASES``, each made so that reading it before the refusal would fail differently."""
    (directory / "in.parquet").write_bytes(NOT_A_DUMP)
    (directory / "base.parquet").write_bytes(NOT_A_DUMP)
    (directory / "r.toml").write_bytes(NOT_TOML)
    os.link(directory / "r.toml", directory / "hard.toml")
    (directory / "link.toml").symlink_to("r.toml")
    (directory / "pyproject.toml").write_bytes(NOT_TOML)
    (directory / "b.toml").write_bytes(BASELINE_RULES)
    (directory / "tok.json").write_bytes(NOT_A_TOKENIZER)
    os.link(directory / "tok.json", directory / "hard.json")
    (directory / "tok.parquet").write_bytes(NOT_A_TOKENIZER)
    (directory / "tokdir").mkdir()
    (directory / "tokdir" / "tokenizer.json").write_bytes(NOT_A_TOKENIZER)
    (directory / "s.json").write_bytes(NOT_A_STATE)
    (directory / "w").mkdir()


def _snapshot(directory: Path) -> dict[str, bytes | str]:
    """Every path under ``directory``: a file's bytes, a symlink's target, a directory as such."""
    found: dict[str, bytes | str] = {}
    for path in sorted(directory.rglob("*")):
        name = str(path.relative_to(directory))
        found[name] = f"-> {os.readlink(path)}" if path.is_symlink() else "dir" if path.is_dir() else path.read_bytes()
    return found


@pytest.mark.parametrize("case", list(CASES))
def test_an_output_over_a_file_the_run_reads_is_refused_first(tmp_path: Path, case: str) -> None:
    _inputs(tmp_path)
    before = _snapshot(tmp_path)
    args, protected, refusal = CASES[case]
    done = run_capped(*(arg.replace("{dir}", tmp_path.name) for arg in args), cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr == f"rcdiag: error: {refusal.replace('{dir}', tmp_path.name)}; {NEVER}\n"
    assert _snapshot(tmp_path) == before  # nothing written, nothing created, the links still links
    assert (tmp_path / protected).read_bytes() in (NOT_TOML, NOT_A_TOKENIZER, NOT_A_DUMP, NOT_A_STATE)
    assert os.stat(tmp_path / "hard.toml").st_ino == os.stat(tmp_path / "r.toml").st_ino


def test_without_a_clash_the_same_inputs_are_read_and_the_outputs_written(tmp_path: Path) -> None:
    """The ledger refuses clashes only: pyproject.toml read, a rules file beside the outputs, all written."""
    shutil.copy(HEALTHY, tmp_path / "in.parquet")
    (tmp_path / "pyproject.toml").write_text("[tool.rcdiag.check.max]\nkl = 1\n")
    (tmp_path / "r.toml").write_text("[max]\nk3_kl = 1\n")
    done = run_capped("check", "in.parquet", "-o", "out.txt", "--junit", "j.xml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "rcdiag: using [tool.rcdiag.check] from pyproject.toml" in done.stderr
    done = run_capped("check", "in.parquet", "--rules", "r.toml", "--markdown", "m.md", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "pyproject.toml").read_text() == "[tool.rcdiag.check.max]\nkl = 1\n"
    assert (tmp_path / "r.toml").read_text() == "[max]\nk3_kl = 1\n"
    assert all((tmp_path / name).stat().st_size > 0 for name in ("out.txt", "j.xml", "m.md"))


def test_no_pyproject_leaves_it_unread_and_writable(tmp_path: Path) -> None:
    """``--no-pyproject``: the file is not an input, so ``-o pyproject.toml`` is the user's to ask for."""
    shutil.copy(HEALTHY, tmp_path / "in.parquet")
    (tmp_path / "pyproject.toml").write_bytes(NOT_TOML)
    done = run_capped(
        "check", "in.parquet", "--no-pyproject", "--max", "kl=1", "--format", "json", "-o", "pyproject.toml",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "pyproject.toml").read_text().startswith("{")


def test_the_library_refuses_its_outputs_over_the_tokenizer(tmp_path: Path) -> None:
    (tmp_path / "tok.parquet").write_bytes(NOT_A_TOKENIZER)
    with pytest.raises(ConfigError, match=r"^tokens .*tok.parquet is the tokenizer .*tok.parquet; rcdiag never"):
        rcdiag.analyze(HEALTHY, tokenizer=tmp_path / "tok.parquet", tokens=tmp_path / "tok.parquet")
    assert (tmp_path / "tok.parquet").read_bytes() == NOT_A_TOKENIZER


def test_a_write_no_flag_named_is_checked_against_the_inputs(tmp_path: Path) -> None:
    """The last guard: a write to a file the ledger holds as an input fails, whatever asked for it."""
    rules = tmp_path / "r.toml"
    rules.write_bytes(NOT_TOML)
    with outputs.ledger():
        outputs.reads(rules, what="the rules file {source}")
        with pytest.raises(OutputError, match=r"cannot write .*r.toml: it is the rules file .*r.toml, which this run"):
            outputs.write_file(tmp_path / "." / "r.toml", "replaced")
        outputs.write_file(tmp_path / "other.txt", "fine")
    assert rules.read_bytes() == NOT_TOML and (tmp_path / "other.txt").read_text() == "fine"


@pytest.mark.parametrize("exists", [False, True], ids=["missing", "exists"])
def test_a_file_read_as_an_option_suggests_dot_slash(tmp_path: Path, exists: bool) -> None:
    if exists:
        shutil.copy(HEALTHY, tmp_path / "-q.parquet")
    done = run_capped("analyze", "-q.parquet", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "rcdiag: error: -q.parquet was read as an option (No such option: -.); to name a file, give it as "
        "./-q.parquet (see 'rcdiag analyze --help')\n"
    )
    if exists:
        done = run_capped("analyze", "./-q.parquet", "-q", "--format", "json", cwd=tmp_path)
        assert done.returncode == 0 and '"rollout_corr/kl"' in done.stdout, done.stderr


def test_an_option_only_a_file_on_disk_explains_is_hinted_and_others_are_not(tmp_path: Path) -> None:
    (tmp_path / "-weird").write_bytes(NOT_A_DUMP)
    done = run_capped("merge", "-weird", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "rcdiag: error: -weird was read as an option (No such option: -w); to name a file, give it as ./-weird "
        "(see 'rcdiag merge --help')\n"
    )
    done = run_capped("analyze", "-x", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (2, "rcdiag: error: No such option: -x (see 'rcdiag analyze --help')\n")
