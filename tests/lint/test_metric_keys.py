"""Metric keys are spelled once, in ``rcdiag.catalogue`` (``Key``, ``rs_key``, ``framework_key``): a module that
spells ``"rcdiag/kl_std_error"`` itself reads ``None`` the day the key is renamed, and the verdict reads healthy.

The guard reads each module's syntax tree outside ``rcdiag/catalogue``: a string (or the text of an f-string) that
starts with ``rollout_corr/`` or ``rcdiag/``, a key built on the catalogue's prefix (``PREFIX + "kl"``,
``f"{PREFIX}kl"``; ``PREFIX + "*"``, a glob, names no key) or
a literal given to ``full_key`` / ``known_key`` (``full_key("kl")`` reads ``None`` for a typo) is an offender.
Docstrings (doctest lines included) and comments are prose, not keys.
"""

from __future__ import annotations

import ast
import re

from conftest import ROOT

PACKAGE = ROOT / "rcdiag"
CATALOGUE = PACKAGE / "catalogue"
KEY_LITERAL = re.compile(r"(rollout_corr|rcdiag)/")
PREFIX_NAMES = {"PREFIX", "EXTRA_PREFIX"}
"""The catalogue's prefixes: a key built on one names a metric outside the catalogue (a framework's own prefix of
the same name, slime's ``train/``, is its vocabulary, not rcdiag's)."""
GLOB = "*"
"""``PREFIX + "*"``: every key of the prefix, as a framework's key list names verl's; a glob names no key."""
KEY_BUILDERS = {"full_key", "known_key"}
"""Functions that turn a spelled name into a key."""


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the string constants that stand alone as statements: docstrings, attribute docstrings."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }


def _catalogue_prefixes(tree: ast.Module) -> set[str]:
    """The names this module gives the catalogue's prefixes (``from rcdiag.catalogue import PREFIX as P``)."""
    return {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rcdiag.catalogue")
        for alias in node.names
        if alias.name in PREFIX_NAMES
    }


def _literal(node: ast.AST) -> bool:
    if isinstance(node, ast.JoinedStr):
        return True
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value != GLOB


def offenders(source: str) -> list[tuple[int, str]]:
    """(line, what) of every metric key ``source`` spells itself."""
    tree = ast.parse(source)
    prose, prefixes = _docstrings(tree), _catalogue_prefixes(tree)

    def is_prefix(node: ast.AST) -> bool:
        return isinstance(node, ast.Name) and node.id in prefixes

    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            if KEY_LITERAL.match(node.value):
                found.append((node.lineno, f"key literal {node.value!r}"))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and is_prefix(node.left):
            if _literal(node.right):
                found.append((node.lineno, "a key built on a prefix"))
        elif isinstance(node, ast.JoinedStr) and node.values:
            first = node.values[0]
            if isinstance(first, ast.FormattedValue) and is_prefix(first.value):
                found.append((node.lineno, "a key built on a prefix in an f-string"))
        elif isinstance(node, ast.Call) and node.args and _literal(node.args[0]):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if name in KEY_BUILDERS:
                found.append((node.lineno, f"{name} of a literal"))
    return found


def test_no_module_outside_the_catalogue_spells_a_metric_key() -> None:
    found = {
        f"{path.relative_to(ROOT).as_posix()}:{line}: {what}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if CATALOGUE not in path.parents
        for line, what in offenders(path.read_text())
    }
    assert not found, "spell these through rcdiag.catalogue (Key, rs_key, framework_key):\n" + "\n".join(sorted(found))


def test_the_guard_sees_a_planted_offender() -> None:
    planted = '''
"""A module that reads ``report.metrics["rcdiag/kl_std_error"]``.

    >>> report.metrics["rollout_corr/kl"]  # a doctest line is prose
"""
from rcdiag.catalogue import PREFIX, Key, full_key

# "rcdiag/kl_std_error" in a comment is prose too
ALIAS = Key.KL_STD_ERROR
"""The standard error (``rcdiag/kl_std_error``)."""


def read(values, name, option):
    values["rcdiag/kl_std_error"] = 1.0  # offender
    values[f"rcdiag/{name}_share"] = 2.0  # offender
    values.get("rollout_corr/kl")  # offender
    values.get(PREFIX + "k3_kl")  # offender
    values.get(f"{PREFIX}rollout_rs_{option}_masked_fraction")  # offender
    return full_key("chi2_token"), values.get(ALIAS), full_key(name)  # offender
'''
    marked = [number for number, line in enumerate(planted.splitlines(), 1) if line.endswith("# offender")]
    assert sorted(line for line, _ in offenders(planted)) == marked and len(marked) == 6
