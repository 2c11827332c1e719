"""The input format registry is the one list of formats: help, errors and the dispatcher read it; readers are
separate modules without import cycles, and listing the formats imports no pyarrow."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, run, write_dump

import rcdiag
from rcdiag.io import format_names
from rcdiag.io.registry import FORMATS, InputFormat, suffixes

IO = ROOT / "rcdiag" / "io"


def io_imports() -> dict[str, set[str]]:
    """``rcdiag.io`` module name -> the ``rcdiag.io`` modules it imports (anywhere in the file)."""
    graph = {}
    for path in IO.glob("*.py"):
        name = "rcdiag.io" if path.stem == "__init__" else f"rcdiag.io.{path.stem}"
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rcdiag.io."):
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("rcdiag.io."))
        graph[name] = found
    return graph


def test_help_and_errors_list_the_registry(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    assert format_names() == tuple(f.title for f in FORMATS)
    code, out, _ = run(capsys, "analyze", "--help")
    assert code == 0
    flat = " ".join(out.replace("│", " ").split())
    assert all(title in flat for title in format_names()), flat
    unknown = tmp_path / "x.bin"
    unknown.write_bytes(b"\x01\x02garbage!")
    code, _, err = run(capsys, "analyze", str(unknown))
    assert code == 2 and f"({', '.join(format_names())})" in err and ", ".join(suffixes()) in err


def test_every_registry_entry_opens_its_reader() -> None:
    from rcdiag.io.registry import _load
    from rcdiag.io.tables import TableFile

    for fmt in FORMATS:
        assert issubclass(_load(fmt.opener), TableFile), fmt.name
        assert fmt.claims is None or callable(_load(fmt.claims)), fmt.name
    assert len({f.name for f in FORMATS}) == len(FORMATS)


def test_no_import_cycle_and_formats_do_not_import_each_other() -> None:
    graph = io_imports()
    readers = {f.opener.partition(":")[0] for f in FORMATS}
    for reader in readers:
        assert not (graph[reader] & readers), (reader, graph[reader] & readers)

    def visit(node: str, path: tuple[str, ...]) -> None:
        assert node not in path, " -> ".join((*path, node))
        for child in graph.get(node, ()):
            visit(child, (*path, node))

    for module in graph:
        visit(module, ())


def test_listing_formats_imports_neither_pyarrow_nor_numpy() -> None:
    code = "import sys, rcdiag.io; rcdiag.io.format_names(); print(sorted({'pyarrow', 'numpy'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_new_format_is_one_registry_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A Parquet file under another suffix, registered with one line, is read by the dispatcher."""
    entry = InputFormat("renamed", "Renamed Parquet", (".rpq",), (), "rcdiag.io.parquet:ParquetFile")
    monkeypatch.setattr("rcdiag.io.registry.FORMATS", (*FORMATS, entry))
    path = write_dump(tmp_path / "d.parquet", {"old_log_prob": [[-1.0, -2.0]], "rollout_log_prob": [[-1.5, -2.0]]})
    path = path.rename(tmp_path / "d.rpq")
    report = rcdiag.analyze(path)
    assert report.metrics["rollout_corr/kl"] == pytest.approx(-0.25)
    assert rcdiag.analyze(tmp_path).input.files == 1  # a directory lists the new suffix too
