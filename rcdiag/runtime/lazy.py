"""Names a package offers but resolves only when first asked for (PEP 562): start-up time, and the library's entry
points offered where users import them (``from rcdiag.check import check``) by packages below the library layer,
which never import it (tests/lint/test_layering.py pins every such name)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def exports(package: str, table: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: each name of ``table`` read from the module it names."""

    def attribute(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module '{package}' has no attribute '{name}'")
        return getattr(importlib.import_module(module), name)

    return attribute
