"""The tests' own layout (tests/README.md): a test module never imports another test module, anywhere in it (at the
top or inside a function); what two modules share lives in a support module at ``tests/`` (a fixture in
``conftest.py``), the one test folder on the import path. An area folder holds test modules only.

A test module imported by another is run twice over, ties the two areas' folders to the import path, and works or not
depending on which folder pytest happened to put on ``sys.path`` first."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import TESTS

TEST_MODULES = frozenset(path.stem for path in TESTS.rglob("test_*.py"))
PACKAGES = ("harness", "realmodel")
"""Folders of ``tests/`` that are support packages, not areas."""


def imported_modules(path: Path) -> set[str]:
    """Every absolute module name ``path`` imports, wherever the statement sits."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_no_test_module_imports_another() -> None:
    offenders = {
        f"{path.relative_to(TESTS)}: {name}"
        for path in TESTS.rglob("*.py")
        for name in imported_modules(path)
        if name.split(".")[0] in TEST_MODULES
    }
    assert not offenders, (
        f"move the shared helper into a support module at tests/ (a fixture into conftest.py): {offenders}"
    )


def test_the_guard_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    module = tmp_path / "test_x.py"
    module.write_text("def test_a():\n    from test_storage import same_report\n    import test_process as p\n")
    assert {"test_storage", "test_process"} <= imported_modules(module)
    assert {"test_storage", "test_process"} <= TEST_MODULES


def test_area_folders_hold_test_modules_only() -> None:
    areas = [folder for folder in TESTS.iterdir() if folder.is_dir() and folder.name not in PACKAGES]
    assert len(areas) >= 15, areas
    strays = [
        str(path.relative_to(TESTS))
        for folder in areas
        for path in folder.rglob("*.py")
        if not (path.name.startswith("test_") or path.name == "conftest.py")
    ]
    assert not strays, f"a helper goes at tests/ (the import path), not in an area folder: {strays}"
