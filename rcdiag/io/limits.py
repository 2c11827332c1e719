"""Input limits: the sizes a file may declare before rcdiag allocates memory for it (docs/input.md, "Limits").

Each limit is defined here once, with the environment variable that overrides it (a whole number; ``0`` turns the
limit off). A file beyond a limit is an ``InputError`` (exit 2) naming the file, the size it declares and the
variable to raise, raised before the memory is allocated.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from rcdiag.errors import ConfigError, InputError


@dataclass(frozen=True)
class Limit:
    """A size limit with its default, unit and overriding environment variable."""

    variable: str
    default: int
    unit: str
    what: str

    @property
    def value(self) -> int:
        """The limit in force (read at each use, so a test or a wrapper can set the variable)."""
        text = os.environ.get(self.variable, "").strip().replace("_", "")
        if not text:
            return self.default
        if not text.isdigit():
            raise ConfigError(f"{self.variable}={os.environ[self.variable]!r} is not a whole number of {self.unit}.")
        return int(text)

    def check(
        self, size: int, path: str, what: str | None = None, *, row: int | None = None, sequence: object = None
    ) -> None:
        """``InputError`` when ``size`` exceeds the limit (``what`` names the thing measured; ``row`` or
        ``sequence``: where, as ``InputError`` says it)."""
        limit = self.value
        if limit and size > limit:
            raise InputError(
                f"{what or self.what} is {size:,} {self.unit}, beyond rcdiag's limit of {limit:,} {self.unit}; "
                f"if the file is genuine and memory allows, raise it: {self.variable}={size}",
                path=path,
                row=row,
                sequence=sequence,
            )


TENSOR_BYTES = Limit("RCDIAG_MAX_TENSOR_BYTES", 8 << 30, "bytes", "the decoded size of its arrays")
"""A ``.npz`` or ``.pt`` file is loaded whole: its arrays' decoded sizes together (8 GiB by default)."""

COMPRESSION_RATIO = Limit("RCDIAG_MAX_COMPRESSION_RATIO", 200, "times", "a member's compression ratio")
"""A compressed ``.npz``/``.pt`` member that inflates to more than ``COMPRESSED_MEMBER_MIN`` bytes may inflate at
most this many times its stored size (deflate reaches ~1,000x on zeros: a zip bomb)."""

COMPRESSED_MEMBER_MIN = 256 << 20
"""Members that inflate to less than this (256 MiB) are not held to ``COMPRESSION_RATIO``."""

JSON_LINE_CHARS = Limit("RCDIAG_MAX_JSON_LINE_CHARS", 256 << 20, "characters", "this line")
"""One JSON Lines record (one response) is read and parsed whole: at most 256 Mi characters."""

ROW_TOKENS = Limit("RCDIAG_MAX_ROW_TOKENS", 16 << 20, "tokens", "this response")
"""One response is computed whole, in memory: at most 16,777,216 tokens. Memory grows by about 75 bytes of address
space (45 resident) per token of the longest response: 16M tokens run within a 4 GB address-space cap."""

MAX_SPILL_BUCKETS = 256
"""The long layout groups tokens by sequence in at most this many temporary files, each open while reading."""
