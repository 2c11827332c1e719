"""Notices: what a run should tell its user without failing (files left out of a directory, kernels compiling).

The library never prints; it warns with ``Notice`` (a ``UserWarning``), which Python shows on stderr and callers
may filter. The CLI prints each notice as one ``rcdiag: ...`` line on stderr (``rcdiag.cli.notices``).
"""

from __future__ import annotations

import warnings


class Notice(UserWarning):
    """Something the user should know about this run that does not stop it."""


def notify(message: str) -> None:
    """Emit ``message`` as a ``Notice`` (shown every time, not once per place in the code)."""
    with warnings.catch_warnings():
        warnings.simplefilter("always", Notice)
        warnings.warn(message, Notice, stacklevel=3)
