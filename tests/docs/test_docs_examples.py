"""Every command example in README.md and docs/ runs, and prints what the page shows (issue 33 item 7).

Each ``rcdiag ...`` line of a bash block is run from a workspace where the pages' placeholder names
(``run.parquet``, ``dumps/run-42``, ``Qwen3-8B/``, ...) are real dumps made from sample_data/ (``SAMPLE_FOR``);
it must exit 0 or 1 (a gate that fails is an answer), never 2 or 3. Where the page shows the command's output (a
plain block marked ``<!-- output -->``, after a bash block of one command), every line shown (``...`` skipped) is
printed, on stdout in that order, or on stderr. A synopsis line
(``[--flag]``, ``PATH``) is not a command; an example that needs what no test machine has here (object storage, a
Ray cluster, a Slurm array) is listed in ``NOT_HERE`` with the tests that run its kind, and a test fails when the
page no longer holds it, so the list cannot go stale either.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import ROOT, SAMPLES

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_HERE = {
    "s3://": "object storage: tests/io/test_storage.py runs analyze, merge and --save-state against a local S3 server",
    "gs://": "object storage: tests/io/test_storage.py (the same reader as s3://)",
    "hdfs://": "object storage: tests/io/test_storage.py (the same reader as s3://)",
    "file:///data/": "a file URL of the reader's machine: tests/io/test_storage.py reads file:// URLs",
    "bf16_s1": "the real-model study: tests/compare/test_compare_significance.py reruns it and checks its table",
}
"""A substring of the examples that cannot run here -> where their kind is tested."""
OUTPUT = "<!-- output -->"
"""Put on the line right before a plain block: the block is what the bash block before it (one command) prints."""
SYNOPSIS = re.compile(r" \[|\bPATH\b|\bFILE\b| \.\.\.")
"""A command's usage line (``rcdiag check PATH [--max NAME=V]``), not an example."""
SAMPLE_FOR = {
    "run.parquet": "healthy.parquet",
    "big.parquet": "healthy.parquet",
    "new.parquet": "healthy_t06.parquet",
    "last_good.parquet": "healthy.parquet",
    "run_a.parquet": "healthy.parquet",
    "run_b.parquet": "quantized_4bit.parquet",
    "run_t06.parquet": "healthy_t06.parquet",
    "run_t10.parquet": "healthy.parquet",
    "old_engine.parquet": "healthy.parquet",
    "new_engine.parquet": "quantized_4bit.parquet",
    "a.parquet": "healthy.parquet",
    "b.parquet": "quantized_4bit.parquet",
    "A.parquet": "healthy.parquet",
    "B.parquet": "quantized_4bit.parquet",
    "shard-07.parquet": "healthy.parquet",
    "shard-3.parquet": "healthy.parquet",
}
"""Each placeholder dump name of the pages -> the sample it stands for."""


@dataclass(frozen=True)
class Example:
    page: str
    command: str
    shown: tuple[str, ...] | None
    """The output the page shows right after it (its block's only command), or ``None``."""

    def __str__(self) -> str:
        return f"{self.page}: {self.command}"


def examples() -> list[Example]:
    """Every ``rcdiag`` command line of every page's bash blocks, in page order."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for block in re.finditer(r"```bash\n(.*?)```\n", text, re.S):
            lines = [_command(line) for line in block.group(1).replace("\\\n", " ").splitlines()]
            commands = [line for line in lines if line.startswith("rcdiag ")]
            after = text[block.end() :]
            marked = after.find(OUTPUT)
            shown = None
            if len(commands) == 1 and marked >= 0 and marked == after.find("```") - len(OUTPUT) - 1:
                start = marked + len(OUTPUT) + 5
                shown = tuple(after[start : after.index("```", start)].splitlines())
            found += [Example(str(page.relative_to(ROOT)), command, shown) for command in commands]
    return found


def _command(line: str) -> str:
    """The command of a line: no prompt, no trailing comment."""
    line = line.strip().removeprefix("$ ")
    return re.split(r"\s{2,}#\s", line)[0].strip() if "#" in line else line


def runnable(example: Example) -> bool:
    command = example.command.split(" | ")[0]
    return not SYNOPSIS.search(command) and not any(key in command for key in NOT_HERE)


EXAMPLES = examples()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pages' placeholder names, made real: sample dumps under their names, a DumpWriter directory, a
    tokenizer directory, the demo dump of docs/index.md and shard states for merge."""
    root = tmp_path_factory.mktemp("docs-examples")
    for name, sample in SAMPLE_FOR.items():
        shutil.copyfile(SAMPLES / sample, root / name)
    with_ids = pq.read_table(SAMPLES / "stop_token.parquet")
    ids = pa.array([f"req-{i}" for i in range(with_ids.num_rows)])
    pq.write_table(with_ids.append_column("request_id", ids), root / "run.parquet")  # --explain --id-col, --tokenizer
    _nearly_same(root / "nearly_same.parquet")
    (root / "sample_data").symlink_to(SAMPLES)
    (root / "Qwen3-8B").mkdir()
    shutil.copyfile(SAMPLES / "tokenizer.json", root / "Qwen3-8B" / "tokenizer.json")
    run = root / "dumps" / "run-42"
    run.mkdir(parents=True)
    table = pq.read_table(SAMPLES / "healthy.parquet")
    for step in sorted(set(table.column("step").to_pylist())):
        part = table.filter(pa.compute.equal(table.column("step"), step))
        pq.write_table(part, run / f"part-{step:06d}.parquet")
    for i, sample in enumerate(("healthy.parquet", "quantized_4bit.parquet")):
        done = rcdiag_run("analyze", SAMPLES / sample, "--save-state", root / f"shard-{i}.json", "-q", cwd=root)
        assert done.returncode == 0, done.stderr
    return root


def rcdiag_run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m rcdiag ARGS`` from ``cwd``, as a user runs it (a hang fails the test after 300 s)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "rcdiag", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=300, check=False)


NEARLY_SAME = ((5, 17), (5, 40), (9, 3))
"""docs/check.md's ``check --exact`` dump: healthy.parquet's trainer log-probs on both sides, but for these
(row, position) tokens, one float32 ulp apart."""


def _nearly_same(path: Path) -> None:
    import numpy as np

    table = pq.read_table(SAMPLES / "healthy.parquet")
    old = [np.asarray(row, dtype=np.float32) for row in table.column("old_log_prob").to_pylist()]
    rollout = [row.copy() for row in old]
    for row, position in NEARLY_SAME:
        assert table.column("response_mask")[row].as_py()[position] == 1
        rollout[row][position] = np.nextafter(old[row][position], np.float32(0))
    column = pa.array(rollout, pa.list_(pa.float32()))
    pq.write_table(table.set_column(table.schema.get_field_index("rollout_log_prob"), "rollout_log_prob", column), path)


def _argv(example: Example, root: Path) -> list[str]:
    """The command's arguments, run from the workspace (a watch reads once: it follows forever otherwise; what a
    pipe feeds, such as jq, is not run: the command's own output and exit code are what is tested)."""
    command = example.command.split(" | ")[0].replace("/tmp/demo.parquet", str(root / "demo.parquet"))
    args = shlex.split(command)[1:]
    if args[0] == "watch" and "--once" not in args:
        args.append("--once")
    return [str(p) for a in args for p in (sorted(root.glob(a)) if "*" in a and "://" not in a else [a])]


def test_the_pages_hold_examples_and_every_not_here_entry_is_still_on_a_page() -> None:
    assert len(EXAMPLES) >= 40
    assert sum(example.shown is not None for example in EXAMPLES) >= 4  # the README's and the pages' marked outputs
    for key in NOT_HERE:
        assert any(key in example.command for example in EXAMPLES), key


@pytest.mark.parametrize("example", [e for e in EXAMPLES if runnable(e)], ids=str)
def test_every_example_runs_and_prints_what_its_page_shows(example: Example, workspace: Path) -> None:
    if "demo.parquet" in example.command and not (workspace / "demo.parquet").exists():
        from rcdiag.io import synthetic  # docs/index.md's own line that writes its demo dump

        synthetic.write(synthetic.generate("healthy"), str(workspace / "demo.parquet"))
    done = rcdiag_run(*_argv(example, workspace), cwd=workspace)
    assert done.returncode in (0, 1), f"{example}\n{done.stderr[-2000:]}"
    assert "Traceback" not in done.stderr
    if example.shown is None:
        return
    printed = [line.rstrip() for line in done.stdout.splitlines()]
    said = {line.rstrip() for line in done.stderr.splitlines()}
    at = 0
    for line in (line.rstrip() for line in example.shown if line.strip() not in ("...", "")):
        if line in said:
            continue
        assert line in printed[at:], f"{example}: not printed (in order): {line!r}"
        at = printed.index(line, at) + 1
