"""One template for a user option holding a value it does not take: ``<where> must be <what>, got <value>``.

An option reaches rcdiag from a flag (``--workers``), a library keyword (``ReadOptions(workers=...)``), an
environment variable, or a key of a rules file or pyproject.toml; wherever it was written, a bad value is the same
one line naming that place, what the option takes and what it was given (exit 2, no traceback). ``where`` says the
place (``flag``, ``keyword``, ``variable``, ``key``); a ``Check`` says what a value must be and tests it. The CLI
attaches a ``Check`` to a flag (``rcdiag.cli.params.checked_option``), which hands the check the flag's text as its
``read`` makes it: a number's text becomes the number, other text stays as typed for the check to refuse, so a flag
given ``abc`` is refused with the same line as one given ``0``; the other readers call it with their ``where``.
(Saved states and records read back are ``rcdiag.runtime.fields``' job: a damaged file, not a user's option.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from rcdiag.runtime.errors import ConfigError, RcdiagError
from rcdiag.runtime.printable import printable


def flag(name: str) -> str:
    """A command-line flag, as the user typed it: ``--workers``."""
    return name


def keyword(name: str) -> str:
    """A library keyword (``ReadOptions(workers=...)``): its name."""
    return name


def variable(name: str) -> str:
    """An environment variable: ``the environment variable RCDIAG_STORAGE_RETRY_LIMIT``."""
    return f"the environment variable {name}"


def key(name: str, file: object, table: str = "") -> str:
    """A key of a TOML file: ``[tool.rcdiag.check] tolerate in pyproject.toml``; ``tolerate in rules.toml`` at a
    file's top level."""
    return f"{table} {name} in {file}" if table else f"{name} in {file}"


def given(value: Any) -> str:
    """A value as the message shows it: text quoted, anything else as Python prints it (control characters
    escaped: the text may come from a file)."""
    return printable(repr(value) if isinstance(value, str) else str(value))


def problem(where: str, what: str, value: Any) -> str:
    """The template: ``--workers must be an integer >= 1 or 'auto', got 0``."""
    return f"{where} must be {what}, got {given(value)}"


def refuse(where: str, what: str, value: Any, error: type[RcdiagError] = ConfigError) -> RcdiagError:
    """The template's error (``ConfigError`` unless the caller names another kind), to raise."""
    return error(problem(where, what, value))


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def _integer(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int)


def as_typed(value: Any) -> Any:
    """A flag's text, kept as typed (a name, an address)."""
    return value


def integer_text(value: Any) -> Any:
    """An integer's text as the integer (as ``int`` reads it, ``1_000`` too; ``2.0``, zeros after the point, as
    2), any other text kept as typed, for the check to refuse."""
    if not isinstance(value, str):
        return value
    whole, point, zeros = value.strip().partition(".")
    try:
        return int(whole if point and not zeros.strip("0") else value)
    except ValueError:
        return value


def number_text(value: Any) -> Any:
    """A number's text as a float (as ``float`` reads it: ``1e-3``, ``inf``, ``nan``, left to the check), any
    other text kept as typed, for the check to refuse."""
    try:
        return float(value) if isinstance(value, str) or _integer(value) else value
    except ValueError:
        return value


@dataclass(frozen=True)
class Check:
    """What an option takes: ``what`` as the message says it, ``accepts`` the test, ``example`` a bad value as it
    would be typed on a command line (the tests give it to every checked flag), ``read`` how a flag's text becomes
    the value tested (``integer_text``, ``number_text``; text as typed by default)."""

    what: str
    accepts: Callable[[Any], bool]
    example: str
    read: Callable[[Any], Any] = as_typed

    def __call__(self, value: Any, where: str, error: type[RcdiagError] = ConfigError) -> Any:
        """``value`` if the option takes it, else the template's error naming ``where``."""
        if not self.accepts(value):
            raise refuse(where, self.what, value, error)
        return value


def choice(names: Iterable[str]) -> Check:
    """One of a few names: ``one of every, last, mean``."""
    known = tuple(names)
    return Check(f"one of {', '.join(known)}", lambda v: isinstance(v, str) and v in known, "nonsense")


def count(low: int = 1, high: int | None = None, *, of: str = "") -> Check:
    """An integer in ``[low, high]`` (``high=None``: no upper end); ``of`` names what is counted (``of="tokens"``:
    ``a number of tokens from 1 to 268,435,456``)."""
    noun = f"a number of {of}" if of else "an integer"
    what = f"{noun} >= {low}" if high is None else f"{noun} from {low:,} to {high:,}"
    return Check(what, lambda v: _integer(v) and low <= v and (high is None or v <= high), str(low - 1), integer_text)


def positive(of: str = "") -> Check:
    """A finite number above 0 (``of="seconds"``: ``a positive number of seconds``)."""
    return Check(f"a positive number{f' of {of}' if of else ''}", lambda v: _number(v) and v > 0, "0", number_text)


def duration(minimum: float = 0.0) -> Check:
    """A number of seconds, finite and at least ``minimum``."""
    what = f"a number of seconds >= {minimum:g}"
    return Check(what, lambda v: _number(v) and v >= minimum, str(minimum - 1), number_text)


def probability(*, below_one: bool = False) -> Check:
    """A number in [0, 1] (``below_one``: in [0, 1), a share of steps that may fail, where 1 would pass all)."""
    what, top = ("a fraction in [0, 1)", "1") if below_one else ("a probability in [0, 1]", "1.5")
    return Check(what, lambda v: _number(v) and v >= 0 and (v < 1 if below_one else v <= 1), top, number_text)
