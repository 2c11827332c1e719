"""rcdiag's own environment variables (``RCDIAG_*``), each read through one parser.

A variable holds text the user typed into a shell or a job's spec, far from the command: a value rcdiag does not
accept is one error line naming the variable and the form it takes (exit 2), the same for every variable and
whatever the command's input, never the default taken silently and never a reader's complaint about a file
(``SettingError`` is no ``ValueError``, which readers catch as a damaged file). Each variable is declared once, as a
``Variable``, beside what it configures; ``rcdiag.io.limits.check_environment`` checks them all up front.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from rcdiag.runtime.errors import SettingError
from rcdiag.runtime.option_checks import refuse, variable

T = TypeVar("T")


def whole_number(text: str) -> int:
    """Digits (``_`` allowed between them, as in Python): ``0`` and up."""
    digits = text.replace("_", "")
    if not digits.isdigit() or not digits.isascii():
        raise ValueError(text)
    return int(digits)


def positive_seconds(text: str) -> float:
    """A finite number above 0."""
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(text)
    return value


def switch(text: str) -> bool:
    """``1`` (on) or ``0`` (off)."""
    if text not in ("0", "1"):
        raise ValueError(text)
    return text == "1"


@dataclass(frozen=True)
class Variable(Generic[T]):
    """An environment variable: its ``name``, the ``form`` it takes as the error says it (``a whole number of
    bytes``) and the ``parse`` that reads it (raising ``ValueError`` on text it does not accept)."""

    name: str
    form: str
    parse: Callable[[str], T]

    def value(self, default: T) -> T:
        """The variable's value, or ``default`` when it is unset or empty (read at each use, so a test or a wrapper
        can set it)."""
        raw = os.environ.get(self.name, "")
        if not raw.strip():
            return default
        try:
            return self.parse(raw.strip())
        except ValueError:
            raise refuse(variable(self.name), self.form, raw.strip(), SettingError) from None
