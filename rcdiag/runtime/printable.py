"""Text from a file made safe for a terminal: a column name, a metadata value or a path can hold newlines or escape
sequences (``ESC[2J`` clears the screen), which must show as what they are, never act.

``printable`` is the one place that does it: the CLI's error line and the terminal report's input lines call it.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""C0 and C1 control characters (ESC, CR, LF, BEL, CSI, ...), and the line separators and bidirectional overrides
that reorder or split what a terminal shows."""


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}")


def printable(text: object) -> str:
    """``str(text)`` with every control character written out visibly (``\\n``, ``\\x1b``); other text as it is."""
    return _CONTROL.sub(_escaped, str(text))
