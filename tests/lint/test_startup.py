"""What the command line costs before it reads a dump: ``rcdiag --help`` imports none of the heavy libraries
(docs/performance.md#start-up), and ``--workers auto`` starts a second process only where it can win
(``rcdiag.engine.parallel.auto_workers``)."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ROOT, SAMPLES

import rcdiag.engine.parallel as parallel
from rcdiag.cli.commands import COMMANDS
from rcdiag.engine.parallel import CPUS_PER_PROCESS, MIN_BYTES_PER_WORKER, auto_workers, choose_workers
from rcdiag.io import open_dump

HEAVY = ("numpy", "numba", "llvmlite", "pyarrow", "polars", "torch", "matplotlib", "pandas", "scipy")
"""Libraries ``--help`` must not import: each costs tens of milliseconds (numba and torch far more)."""


def _imported(*args: str) -> set[str]:
    """The top-level modules ``python -X importtime -m rcdiag *args`` imported (from its own import log)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "rcdiag", *args], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Usage" in done.stdout
    names = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert "rcdiag.cli" in names  # the log is the one we think it is
    return {name.split(".")[0] for name in names}


@pytest.mark.parametrize("args", [["--help"], ["analyze", "--help"], ["sweep", "--help"], ["--version"]])
def test_help_imports_no_heavy_library(args: list[str]) -> None:
    imported = _imported(*args) if args != ["--version"] else None
    if imported is None:  # --version prints no usage; check its modules directly
        done = subprocess.run(
            [sys.executable, "-c", "import sys, runpy; sys.argv = ['rcdiag', '--version']\n"
             "try:\n    runpy.run_module('rcdiag', run_name='__main__')\nexcept SystemExit:\n    pass\n"
             "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})), file=sys.stderr)"],
            capture_output=True, text=True, cwd=ROOT,
        )  # fmt: skip
        assert done.stdout.startswith("rcdiag ")
        imported = set(done.stderr.split())
    assert imported.isdisjoint(HEAVY), sorted(imported & set(HEAVY))


def test_help_lists_the_commands_without_importing_them() -> None:
    """``rcdiag --help`` lists each command by its docstring, read from its module's source: it imports no
    command's module, nor the flags and catalogue their help texts read; no help imports the report records (the
    catalogue's package imports its tables on first use; a command's help reads the detectors from the finding
    catalogue, which imports no records)."""
    names = _modules_after("--help")
    assert not names & {f"rcdiag.cli.{name}" for name in COMMANDS}, sorted(names)
    assert not names & {"rcdiag.cli.flags", "rcdiag.catalogue.metrics", "rcdiag.records.report", "rcdiag.api"}
    for name in COMMANDS:
        assert not _modules_after(name, "--help") & {"rcdiag.records.report", "rcdiag.api"}


def test_a_command_listed_without_a_literal_docstring_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """The listing's stand-in has the built command's name, help and settings; a command whose help is not a
    literal docstring in its module's source is built instead."""
    from rcdiag.cli import commands

    for name in COMMANDS:
        built, stand_in = commands.build(name, "markdown"), commands.listed(name, "markdown")
        assert stand_in is not None and not stand_in.params
        assert (stand_in.name, stand_in.help, stand_in.no_args_is_help) == (
            built.name,
            built.help,
            built.no_args_is_help,
        )
        assert (stand_in.hidden, stand_in.deprecated, stand_in.short_help) == (built.hidden, built.deprecated, None)
    monkeypatch.setattr(commands, "listed", lambda name, markup: None)
    lazy = commands.LazyCommands("markdown")
    with lazy.listing():
        assert lazy["presets"].params  # built: it has its --verl-version option


AFTER = """
import runpy, sys
sys.argv = ["rcdiag", *sys.argv[1:]]
try:
    runpy.run_module("rcdiag", run_name="__main__")
except SystemExit as exc:
    assert not exc.code, exc.code
print(" ".join(sorted(sys.modules)), file=sys.stderr)
"""


def _modules_after(*args: str) -> set[str]:
    """Every module ``rcdiag *args`` loaded (``-X importtime`` leaves out those loaded by ``importlib``)."""
    done = subprocess.run([sys.executable, "-c", AFTER, *args], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    return set(done.stderr.split())


@pytest.mark.parametrize("args", [["analyze", "--help"], ["sweep", "--help"], ["presets"]])
def test_a_command_builds_itself_alone(args: list[str]) -> None:
    """A command, or its help, imports that command's module alone; a command's help imports no pydantic (typer
    0.29 validates every option's value through it, and the root's --help now defaults to False, not unset, so
    help needs none; a run still does)."""
    names = _modules_after(*args)
    commands = {f"rcdiag.cli.{name}" for name in COMMANDS}
    assert names & commands == {f"rcdiag.cli.{args[0]}"}
    assert ("pydantic" in names) == (args[-1] != "--help")


def test_a_small_run_imports_no_help_renderer_and_no_compute_kernels() -> None:
    """A plain analyze loads no other command, none of typer's help (markdown, syntax highlighting, tracebacks) and
    neither ``pyarrow.compute`` nor polars (only the long layout's grouping and the --explain files use them)."""
    names = _modules_after("analyze", str(SAMPLES / "healthy.parquet"), "-q")
    assert names & {f"rcdiag.cli.{name}" for name in COMMANDS} == {"rcdiag.cli.analyze"}
    unused = {"pyarrow.compute", "polars", "typer.rich_utils", "rich.markdown", "rich.syntax", "rich.traceback"}
    assert not names & unused, sorted(names & unused)


def test_catalogue_names_still_import() -> None:
    from rcdiag.catalogue import FINDINGS, METRICS, codes_for, short_key

    assert FINDINGS and METRICS and callable(codes_for) and short_key("rollout_corr/kl") == "kl"
    import rcdiag.catalogue as catalogue

    with pytest.raises(AttributeError):
        catalogue.not_a_table  # noqa: B018


# --workers auto: the choice rule, not timing -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dump_bytes", "parts", "cpus", "expected"),
    [
        (100 * MIN_BYTES_PER_WORKER, 64, 2, 1),  # two cores: one process already keeps both busy
        (100 * MIN_BYTES_PER_WORKER, 64, 3, 1),
        (100 * MIN_BYTES_PER_WORKER, 64, 1, 1),
        (100 * MIN_BYTES_PER_WORKER, 64, 4, 2),
        (100 * MIN_BYTES_PER_WORKER, 64, 16, 8),
        (100 * MIN_BYTES_PER_WORKER, 3, 16, 3),  # no more processes than parts
        (100 * MIN_BYTES_PER_WORKER, 1, 16, 1),  # a dump that does not split
        (MIN_BYTES_PER_WORKER - 1, 64, 16, 1),  # too small to pay for a second interpreter and its kernels
        (2 * MIN_BYTES_PER_WORKER, 64, 16, 2),
        (5 * MIN_BYTES_PER_WORKER + 7, 64, 16, 5),
        (0, 64, 16, 1),
    ],
)
def test_auto_workers_rule(dump_bytes: int, parts: int, cpus: int, expected: int) -> None:
    assert CPUS_PER_PROCESS == 2
    assert auto_workers(dump_bytes, parts, cpus) == expected


def _row_groups(path, groups: int) -> None:
    table = pa.table({"old_log_prob": [[-0.5, -0.25]] * 8, "rollout_log_prob": [[-0.5, -0.3]] * 8})
    pq.write_table(pa.concat_tables([table] * groups), path, row_group_size=8)


def test_choose_workers_reads_the_dump(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "d.parquet"
    _row_groups(path, 6)
    size = path.stat().st_size
    assert choose_workers(open_dump(path), cpus=16) == 1  # a few kB: one process
    monkeypatch.setattr(parallel, "MIN_BYTES_PER_WORKER", size // 4)  # as if each quarter paid for a worker
    assert choose_workers(open_dump(path), cpus=16) == 4
    assert choose_workers(open_dump(path), cpus=6) == 3
    assert choose_workers(open_dump(path), cpus=2) == 1
    monkeypatch.setattr(parallel, "MIN_BYTES_PER_WORKER", 1)
    assert choose_workers(open_dump(path), cpus=64) == 6  # one per row group at most


def _analyze_json(*args: str) -> tuple[int, dict, str]:
    done = subprocess.run(
        [sys.executable, "-m", "rcdiag", "analyze", str(SAMPLES / "healthy.parquet"), "-q", "--format", "json", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    return done.returncode, json.loads(done.stdout) if done.stdout else {}, done.stderr


def test_workers_auto_on_the_command_line() -> None:
    code, auto, _ = _analyze_json("--workers", "auto")
    code_one, one, _ = _analyze_json()
    assert code == code_one == 0
    assert auto["metrics"] == one["metrics"]
    assert auto["input"]["tokens"] == one["input"]["tokens"] > 0


@pytest.mark.parametrize("value", ["0", "-1", "many", "1.5"])
def test_workers_bad_value_is_one_line(value: str) -> None:
    code, _, stderr = _analyze_json("--workers", value)
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "--workers" in lines[0] and "'auto'" in lines[0], stderr
    assert "Traceback" not in stderr


def test_workers_auto_in_the_library() -> None:
    import rcdiag

    report = rcdiag.analyze(SAMPLES / "healthy.parquet", workers="auto")
    assert report.metrics == rcdiag.analyze(SAMPLES / "healthy.parquet").metrics
    with pytest.raises(rcdiag.ConfigError, match="'auto'"):
        rcdiag.analyze(SAMPLES / "healthy.parquet", workers="two")


def test_workers_auto_stays_in_one_process_where_processes_cannot_run(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Even where the rule would start workers, ``auto`` reads in one process for micro-batches (rows in order)
    and off the CPU (``--device``), where ``--workers 2`` is refused."""
    import rcdiag
    import rcdiag.api.reading as reading

    monkeypatch.setattr(reading, "choose_workers", lambda source: 2)
    sample = tmp_path / "d.parquet"
    _row_groups(sample, 4)  # four parts: --workers 2 would split it
    micro = rcdiag.MicroBatchSettings(micro_batch_size=2)
    report = rcdiag.analyze(sample, workers="auto", microbatch=micro)
    assert report.metrics == rcdiag.analyze(sample, microbatch=micro).metrics
    with pytest.raises(rcdiag.ConfigError):
        rcdiag.analyze(sample, workers=2, microbatch=micro)
    on_torch = rcdiag.analyze(sample, workers="auto", device="torch-cpu")
    assert on_torch.input.tokens == report.input.tokens
    with pytest.raises(rcdiag.ConfigError, match="CPU"):
        rcdiag.analyze(sample, workers=2, device="torch-cpu")
