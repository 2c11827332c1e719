"""Say when the kernels compile: the first run on a machine spends seconds in numba's compiler (3-4 s for a tiny
dump) before any row is counted, which looks like a hang. A numba event listener emits one ``Notice`` per process
when an rcdiag kernel actually compiles (numba fires ``numba:compile`` only on a cache miss, never when it loads
a kernel from its on-disk cache). ``RCDIAG_COMPILE_NOTICE=0`` turns the line off (for scripts that read stderr, and
the test suite, whose one-error-line assertions must not depend on which test compiles first). Imported by every
kernel module."""

from __future__ import annotations

from typing import Any

from numba.core import event

from rcdiag.runtime.errors import SettingError
from rcdiag.runtime.notices import COMPILE_NOTICE

COMPILING = "compiling kernels (first run on this machine only)..."
"""The notice's text (the CLI prints it as ``rcdiag: compiling kernels ...`` on stderr)."""
SWITCH = COMPILE_NOTICE.name
"""Set to ``0`` to leave the notice out (``rcdiag.runtime.notices.COMPILE_NOTICE``)."""


def _wanted() -> bool:
    """Whether to say so: a value the variable does not take is refused when the dump is opened
    (``rcdiag.io.limits.check_environment``); inside numba's compile event it only leaves the notice on."""
    try:
        return COMPILE_NOTICE.value(True)
    except SettingError:
        return True


class _FirstCompile(event.Listener):
    """Notifies once, at the start of the first compile of a function defined in rcdiag."""

    said = False

    def on_start(self, ev: Any) -> None:
        if _FirstCompile.said or not _wanted():
            return
        dispatcher = (ev.data or {}).get("dispatcher")
        module = getattr(getattr(dispatcher, "py_func", None), "__module__", "") or ""
        if module.startswith("rcdiag."):
            _FirstCompile.said = True
            from rcdiag.runtime.notices import Busy, notify

            notify(COMPILING, Busy)

    def on_end(self, ev: Any) -> None:
        pass


event.register("numba:compile", _FirstCompile())  # once: a module is imported once per process
