"""The layers of docs/architecture.md, enforced on the import graph: no module imports from ``rcdiag``'s top
level, the version lives in a module that imports nothing, no import circle, and no layer imports one above it.

The graph counts every import statement anywhere in a module: at the top, inside functions (a lazy import is still
a dependency: it only moves the failure to run time) and under ``if TYPE_CHECKING:`` (a name used in a signature
is part of the module's meaning; ``report.py`` naming a feature's record was such a circle). The few edges still
pointing the wrong way are listed here and in docs/architecture.md ("Known debts"); the lists must match the
code exactly, so a fixed debt is taken off both.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from conftest import ROOT

PACKAGE = ROOT / "rcdiag"

LEAVES = ("rcdiag._version", "rcdiag.core", "rcdiag.runtime")
"""Folders that import nothing of rcdiag but each other: ``rcdiag.core`` (the formulas every engine path shares,
the Student-t tests, the one crossing forecast) and ``rcdiag.runtime`` (errors and exit codes, the option template,
notices, signals, the ``RCDIAG_*`` variables, lazy names, terminal-safe text)."""
CONFIGURATION = ("rcdiag.settings",)
FEATURES = (
    "rcdiag.explain",
    "rcdiag.sweep",
    "rcdiag.microbatch",
    "rcdiag.compare",
    "rcdiag.check",
    "rcdiag.diagnosis",
    "rcdiag.sections",
    "rcdiag.frameworks",
)
LIBRARY_API = ("rcdiag.api",)
BELOW_FEATURES = (
    *LEAVES,
    *CONFIGURATION,
    "rcdiag.records",
    "rcdiag.catalogue",
    "rcdiag.kernels",
    "rcdiag.io",
    "rcdiag.metrics",
    "rcdiag.engine",
)
"""The layers below the features: leaves, configuration, records, catalogue, kernels, input, maths, engine."""
TOP_LEVEL = {"rcdiag", "rcdiag.__main__", "rcdiag._version"}
"""The only modules outside a folder: the package's lazy exports, ``python -m rcdiag`` and the version."""

KNOWN_CYCLES: list[set[str]] = []
"""No import circle is left: the last one (``Block`` and the token passes of ``metrics/tokens.py``) went when the
passes moved behind one interface chosen by the backend and the formulas into ``rcdiag.core``."""
KNOWN_UPWARD: set[tuple[str, str]] = set()
"""None left: the engine and the state files know no feature's state by name; the kinds are one table above them
(``rcdiag.sections.registry``), which the library gives them (``rcdiag.engine.state_files.StateKinds``)."""
KNOWN_UPWARD_ELSEWHERE = {
    ("rcdiag.settings.reading", "rcdiag.metrics.backend"),
    ("rcdiag.settings.reading", "rcdiag.io.base"),
}
"""Debt (issue 20): ``ReadOptions`` names ``ColumnMap`` and ``Backend`` in its fields' types (under
``TYPE_CHECKING``)."""
PUBLIC_ALIASES = {
    "rcdiag.check": {"check": "rcdiag.api", "analyze": "rcdiag.api"},
    "rcdiag.compare": {"compare": "rcdiag.api", "compare_many": "rcdiag.api", "analyze": "rcdiag.api"},
    "rcdiag.sweep": {"sweep": "rcdiag.api", "sweep_chunks": "rcdiag.api", "merge_sweep_states": "rcdiag.api"},
}
"""The library's entry points offered by name where users import them (``from rcdiag.check import check``): each
feature package's ``_API`` table, resolved when first asked for (``rcdiag.runtime.lazy``), no import of the layer above.
Pinned here, so no other name of a higher layer is reached that way."""

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("leaves", LEAVES),
    ("configuration", CONFIGURATION),
    ("records", ("rcdiag.records",)),
    ("catalogue", ("rcdiag.catalogue",)),
    ("kernels", ("rcdiag.kernels",)),
    ("input", ("rcdiag.io",)),
    ("maths", ("rcdiag.metrics",)),
    ("engine", ("rcdiag.engine",)),
    ("features", FEATURES),
    ("library API", (*LIBRARY_API, "rcdiag")),
    ("exports", ("rcdiag.export",)),
    ("integrations", ("rcdiag.integrations",)),
    ("watch", ("rcdiag.watch",)),
    ("renderers", ("rcdiag.render",)),
    ("CLI", ("rcdiag.cli", "rcdiag.__main__")),
)
"""docs/architecture.md's layers, bottom to top, in the order their "may import" column allows: a module may
import its own layer and those listed before it. Each layer is whole folders: the folders show the layers.
``rcdiag`` itself is the package's ``__init__`` (lazy exports)."""


def _imports(path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.module or ""
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _owner(name: str) -> str | None:
    """The rcdiag module an imported name lives in (``rcdiag.a.b.func`` -> ``rcdiag.a.b``)."""
    modules = _modules()
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


@cache
def _graph() -> dict[str, frozenset[str]]:
    """Each rcdiag module -> the rcdiag modules it imports, at any level (relative imports resolved)."""
    graph = {}
    for name, path in _modules().items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                found.update(_owner(alias.name) for alias in node.names if alias.name.startswith("rcdiag"))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                if base.startswith("rcdiag"):
                    found.update(_owner(f"{base}.{alias.name}") for alias in node.names)
        graph[name] = frozenset(m for m in found if m is not None and m != name)
    return graph


def _third_party(path: Path) -> set[str]:
    """Top-level names of the non-rcdiag, non-standard-library modules a file imports."""
    names = {name.split(".")[0] for name in _imports(path)}
    return {n for n in names if n and n != "rcdiag" and n not in sys.stdlib_module_names and n != "__future__"}


def _in(module: str, prefixes: tuple[str, ...] | frozenset[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _cycles(graph: dict[str, frozenset[str]]) -> list[set[str]]:
    """The strongly connected components with more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


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


def test_the_graph_sees_lazy_relative_and_type_checking_imports() -> None:
    """The graph builder itself: imports inside functions and under TYPE_CHECKING are edges."""
    graph = _graph()
    assert "rcdiag.io.storage" in graph["rcdiag.engine.state_files"]  # inside a function
    assert "rcdiag.metrics.block" in graph["rcdiag.metrics.base"]  # under TYPE_CHECKING
    assert "rcdiag.catalogue.findings" in graph["rcdiag.catalogue"]  # the package's __init__


def test_no_import_circle() -> None:
    assert sorted(map(sorted, _cycles(_graph()))) == sorted(map(sorted, KNOWN_CYCLES))


def test_the_cycle_finder_finds_a_planted_circle() -> None:
    graph = {**_graph(), "rcdiag.records.report": _graph()["rcdiag.records.report"] | {"rcdiag.explain.worst"}}
    assert any({"rcdiag.records.report", "rcdiag.explain.worst"} <= cycle for cycle in _cycles(graph))


def test_leaves_import_only_leaves() -> None:
    graph = _graph()
    offenders = {(m, d) for m in graph if _in(m, LEAVES) for d in graph[m] if not _in(d, LEAVES)}
    assert offenders == set()


def test_every_module_sits_in_a_folder_that_is_one_layer() -> None:
    """No module sits flat in ``rcdiag/`` but the three of ``TOP_LEVEL``, and every layer names whole folders."""
    assert {m for m in _modules() if m.count(".") == 1 and not (PACKAGE / m.split(".")[1]).is_dir()} | {
        "rcdiag"
    } == TOP_LEVEL
    for _, prefixes in LAYERS:
        for prefix in prefixes:
            assert prefix in TOP_LEVEL or (PACKAGE / prefix.split(".", 1)[1].replace(".", "/")).is_dir(), prefix


def test_the_records_import_only_leaves_and_configuration() -> None:
    """A report carries its resolved configuration (``Report.config``: ``rcdiag.settings.correction.ResolvedConfig``)."""
    graph = _graph()
    above = {d for m in graph if _in(m, ("rcdiag.records",)) for d in graph[m] if not _in(d, (*LEAVES, *CONFIGURATION))}
    assert above == set()


def test_configuration_imports_only_leaves_but_the_known_debts() -> None:
    graph = _graph()
    above = {(m, d) for m in graph if _in(m, CONFIGURATION) for d in graph[m] if not _in(d, (*LEAVES, *CONFIGURATION))}
    assert above == KNOWN_UPWARD_ELSEWHERE


def test_the_catalogue_imports_only_configuration_and_records() -> None:
    allowed = (*LEAVES, *CONFIGURATION, "rcdiag.records", "rcdiag.catalogue")
    offenders = {(m, d) for m in _graph() if _in(m, ("rcdiag.catalogue",)) for d in _graph()[m]}
    assert {(m, d) for m, d in offenders if not _in(d, allowed)} == set()


def test_kernels_import_only_numpy_numba_and_configuration() -> None:
    """A kernel owns its encoding constants; it never reaches into the feature that uses it."""
    graph = _graph()
    for module, path in _modules().items():
        if not _in(module, ("rcdiag.kernels",)):
            continue
        above = {d for d in graph[module] if not _in(d, (*LEAVES, *CONFIGURATION, "rcdiag.kernels"))}
        assert above == set(), module
        assert _third_party(path) <= {"numpy", "numba", "llvmlite"}, module


def test_input_imports_only_leaves_kernels_and_input() -> None:
    allowed = ("rcdiag.io", "rcdiag.kernels", *LEAVES, *CONFIGURATION)
    graph = _graph()
    offenders = {(m, d) for m in graph if _in(m, ("rcdiag.io",)) for d in graph[m]}
    assert {(m, d) for m, d in offenders if not _in(d, allowed)} == set()


def test_nothing_below_the_features_imports_a_feature_or_the_library_api_but_the_known_debts() -> None:
    graph = _graph()
    upward = {(m, d) for m in graph if _in(m, BELOW_FEATURES) for d in graph[m] if _in(d, (*FEATURES, *LIBRARY_API))}
    assert upward == KNOWN_UPWARD


def _layer(module: str) -> int:
    """The index in ``LAYERS`` of the layer ``module`` belongs to (its longest matching prefix)."""
    found = [
        (len(prefix), index)
        for index, (_, prefixes) in enumerate(LAYERS)
        for prefix in prefixes
        if module == prefix or (prefix != "rcdiag" and module.startswith(prefix + "."))
    ]
    assert found, f"{module} is in no layer of docs/architecture.md: add it to LAYERS and the page's table"
    return max(found)[1]


def _upward(graph: dict[str, frozenset[str]]) -> set[tuple[str, str]]:
    return {(m, d) for m in graph for d in graph[m] if _layer(d) > _layer(m)}


def test_every_module_has_a_layer() -> None:
    assert all(isinstance(_layer(module), int) for module in _graph())


def test_no_layer_imports_one_above_it_but_the_known_debts() -> None:
    """The whole order of docs/architecture.md: records and kernels import no feature, features no renderer, nothing
    the CLI. The debts are listed exactly, so a fixed one comes off the list."""
    assert _upward(_graph()) == KNOWN_UPWARD | KNOWN_UPWARD_ELSEWHERE


@pytest.mark.parametrize(
    ("module", "imported"),
    [
        ("rcdiag.records.report", "rcdiag.microbatch.section"),  # records -> a feature
        ("rcdiag.kernels.sweep", "rcdiag.sweep.state"),  # a kernel -> its feature
        ("rcdiag.metrics.block", "rcdiag.engine.stream"),  # maths -> engine
        ("rcdiag.diagnosis.health", "rcdiag.render.text"),  # a feature -> a renderer
        ("rcdiag.render.html", "rcdiag.cli.output"),  # a renderer -> the CLI
    ],
)
def test_the_layer_check_finds_a_planted_upward_import(module: str, imported: str) -> None:
    graph = {**_graph(), module: _graph()[module] | {imported}}
    assert (module, imported) in _upward(graph)


def test_only_the_cli_imports_the_cli_and_only_the_cli_and_renderers_import_render() -> None:
    graph = _graph()
    into_cli = {(m, d) for m in graph for d in graph[m] if _in(d, ("rcdiag.cli",)) and not _in(m, ("rcdiag.cli",))}
    assert into_cli == {("rcdiag.__main__", "rcdiag.cli")}
    into_render = {
        (m, d)
        for m in graph
        for d in graph[m]
        if _in(d, ("rcdiag.render",)) and not _in(m, ("rcdiag.cli", "rcdiag.render"))
    }
    assert into_render == set()


def test_typer_lives_only_in_the_cli_and_rich_only_there_and_in_console_renderers() -> None:
    """Console renderers are ``render/table.py`` and ``render/*_table.py``; ``import rcdiag`` needs neither."""
    for module, path in _modules().items():
        used = _third_party(path)
        console_renderer = _in(module, ("rcdiag.render",)) and module.rpartition(".")[2].endswith("table")
        if "typer" in used:
            assert _in(module, ("rcdiag.cli",)), module
        if "rich" in used:
            assert _in(module, ("rcdiag.cli",)) or console_renderer, module


def _string_constants(path: Path) -> set[str]:
    return {
        node.value
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


def test_a_higher_layer_is_named_by_string_only_in_the_pinned_public_aliases() -> None:
    """A module name in a string (``importlib``, a lazy table) is an import the graph cannot see: below the library
    layer, only the feature packages' ``_API`` tables name it, and exactly as ``PUBLIC_ALIASES`` says."""
    import importlib

    named = {
        (module, text)
        for module, path in _modules().items()
        for text in _string_constants(path)
        if text.startswith("rcdiag.") and text in _modules() and _layer(text) > _layer(module)
    }
    assert named == {(module, target) for module, table in PUBLIC_ALIASES.items() for target in table.values()}
    for module, table in PUBLIC_ALIASES.items():
        package = importlib.import_module(module)
        assert table == package._API, module
        for name, target in table.items():
            assert getattr(package, name) is getattr(importlib.import_module(target), name)
