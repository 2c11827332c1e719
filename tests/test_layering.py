"""The package never reaches up: no module imports from ``rcdiag``'s top level, and the version lives in a module
that imports nothing."""

from __future__ import annotations

import ast

from conftest import ROOT

PACKAGE = ROOT / "rcdiag"


def _imports(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.module or ""
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def test_no_module_imports_from_the_package_top_level() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}: from {module} import ..."
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "__init__.py" or path.parent != PACKAGE
        for module in _imports(path)
        if module == "rcdiag"
    ]
    assert offenders == []


def test_the_version_module_imports_nothing() -> None:
    assert list(_imports(PACKAGE / "_version.py")) == []
    namespace: dict = {}
    exec((PACKAGE / "_version.py").read_text(), namespace)
    import rcdiag

    assert rcdiag.__version__ == namespace["__version__"]
