"""Notices: what a run should tell its user without failing (files left out of a directory, kernels compiling).

The library never prints; it warns with ``Notice`` (a ``UserWarning``), which Python shows on stderr and callers
may filter. The CLI prints each notice as one ``rcdiag: ...`` line on stderr (``rcdiag.cli.notices``): a ``Busy``
notice at once (the run is silent for seconds otherwise), any other once the command has succeeded, so that a
command that fails leaves exactly one line, its error.
"""

from __future__ import annotations

import warnings

from rcdiag.runtime.environment import Variable, switch

COMPILE_NOTICE = Variable("RCDIAG_COMPILE_NOTICE", "0 (leave the notice out) or 1", switch)
"""Whether the first compile of rcdiag's kernels says so (``rcdiag.kernels.compiling``); on by default."""


class Notice(UserWarning):
    """Something the user should know about this run that does not stop it."""


class Busy(Notice):
    """A notice about what the run is doing right now (kernels compiling): shown at once."""


def notify(message: str, category: type[Notice] = Notice) -> None:
    """Emit ``message`` as a ``category`` notice (shown every time, not once per place in the code)."""
    with warnings.catch_warnings():
        warnings.simplefilter("always", category)
        warnings.warn(message, category, stacklevel=3)
