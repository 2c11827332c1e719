"""Ctrl-C (SIGINT) and SIGTERM end every command the same way: ``rcdiag: aborted`` on stderr, exit 130 (SIGINT)
or 143 (SIGTERM), worker processes stopped, and no temporary or partial output file left behind.

The CLI installs ``handle`` for both signals. It records the signal and raises ``Aborted``, a ``BaseException``
so that no ``except Exception`` on the way up swallows it; ``finally`` blocks and rcdiag.io.outputs remove what was
being written. A signal that lands while a compiled numba kernel runs can surface as another exception (numba's
dispatcher reports ``SystemError: ... returned a result with an exception set``), so the CLI asks ``received()``
rather than trusting the type of whatever exception arrives. The library installs nothing by itself.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterable, Iterator
from typing import Any, NoReturn, TypeVar

from rcdiag.runtime.errors import ExitCode

SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_CODES = {signal.SIGINT: ExitCode.ABORTED, signal.SIGTERM: ExitCode.TERMINATED}
MESSAGE = "rcdiag: aborted"

T = TypeVar("T")
_received: int | None = None
_installed = False


class Aborted(BaseException):
    """The run was interrupted by ``signum``; the CLI prints ``rcdiag: aborted`` and exits ``exit_code``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def handle(signum: int, frame: Any) -> None:
    """Record the first signal and raise ``Aborted``; later ones are ignored so that the cleanup can finish."""
    global _received
    if _received is not None:
        return
    _received = signum
    raise Aborted(signum)


def install() -> dict[int, Any]:
    """Handle SIGINT and SIGTERM with ``handle`` (from the main thread; the CLI calls it first thing) and forget
    any earlier signal; return the handlers replaced, for ``restore``."""
    global _installed, _received
    if threading.current_thread() is not threading.main_thread():
        return {}
    _received = None
    previous: dict[Any, Any] = {signum: signal.signal(signum, handle) for signum in SIGNALS}
    previous["unraisablehook"] = sys.unraisablehook
    sys.unraisablehook = _unraisable
    _installed = True
    return previous


def restore(previous: dict[Any, Any]) -> None:
    """Put back the handlers ``install`` replaced (``main`` called in a process that goes on: a test)."""
    global _installed
    for key, handler in previous.items():
        if key == "unraisablehook":
            sys.unraisablehook = handler
        else:
            signal.signal(key, handler)
    _installed = False


def check() -> None:
    """Raise ``Aborted`` again when a signal came but its exception was swallowed on the way: raised inside a
    callback from C (llvmlite's, while numba compiles), Python prints it as "Exception ignored" and carries on.
    Called before every output file is written and between chunks, so a swallowed abort still stops the run."""
    if _installed and _received is not None:
        raise Aborted(_received)


def checked(items: Iterable[T]) -> Iterator[T]:
    """``items``, with ``check`` before each."""
    for item in items:
        check()
        yield item


def _unraisable(info: Any) -> None:
    """An ``Aborted`` swallowed in a C callback is not worth a traceback (``check`` raises it again); anything else
    goes to Python's own hook."""
    if not isinstance(info.exc_value, Aborted):
        sys.__unraisablehook__(info)


def reinstall() -> None:
    """Take the signals back after a library that sets its own handlers (``ray.init``), if the CLI installed ours."""
    if _installed and threading.current_thread() is threading.main_thread():
        for signum in SIGNALS:
            signal.signal(signum, handle)


def record(signum: int) -> None:
    """Note a signal another handler caught (``ray.init``'s SIGTERM handler exits instead of raising ours)."""
    global _received
    _received = _received or signum


def received() -> int | None:
    """The signal that interrupted the run, if one did."""
    return _received


def exit_code(signum: int) -> ExitCode:
    return EXIT_CODES.get(signal.Signals(signum), ExitCode.ABORTED)


def end_process(code: int) -> NoReturn:
    """End an aborted program now, with ``code``: the exit handlers run (Ray's shutdown, multiprocessing's, the
    CLI's) and stdout and stderr are flushed, but the process waits neither for a thread still blocked in a read
    nor for the interpreter to tear its modules down (most of a second with numba and pyarrow loaded, more on a
    busy machine), so a signal ends any command within a second. The CLI calls it for the program itself (``python
    -m rcdiag``, the ``rcdiag`` script), never in a process that goes on."""
    import atexit
    import contextlib
    import os

    atexit._run_exitfuncs()
    with contextlib.suppress(OSError, ValueError):  # a closed or full stream: nothing more can be said
        sys.stdout.flush()
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
    os._exit(code)


def ignore_in_worker() -> None:
    """A worker process's initializer: a Ctrl-C reaches the whole process group, and the parent decides (it stops
    the workers itself), so a worker neither prints a traceback nor dies half-way through sending its result."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
