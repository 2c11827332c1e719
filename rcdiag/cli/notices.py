"""The library's notices (``rcdiag.notices.Notice``) as one ``rcdiag: ...`` line each on stderr."""

from __future__ import annotations

import sys
import warnings
from typing import Any

from rcdiag.notices import Notice

_show = warnings.showwarning


def _print_notice(message: Any, category: type[Warning], *args: Any, **kwargs: Any) -> None:
    if issubclass(category, Notice):
        print(f"rcdiag: {message}", file=sys.stderr, flush=True)
    else:
        _show(message, category, *args, **kwargs)


def install() -> None:
    """Route notices to stderr as rcdiag lines (other warnings are shown as Python shows them)."""
    warnings.showwarning = _print_notice
