"""Input limits: the sizes a file may declare before rcdiag allocates memory for it (docs/input.md, "Limits").

Each limit is defined here once, with the environment variable that overrides it (a whole number; ``0`` turns the
limit off). A file beyond a limit is an ``InputError`` (exit 2) naming the file, the size it declares and the
variable to raise, raised before the memory is allocated.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from rcdiag.runtime.environment import Variable, whole_number
from rcdiag.runtime.errors import InputError


@dataclass(frozen=True)
class Limit:
    """A size limit with its default, unit and overriding environment variable."""

    variable: str
    default: int
    unit: str
    what: str

    @property
    def setting(self) -> Variable[int]:
        """The overriding variable: a whole number of the limit's unit."""
        return Variable(self.variable, f"a whole number of {self.unit}", whole_number)

    @property
    def value(self) -> int:
        """The limit in force (read at each use, so a test or a wrapper can set the variable)."""
        return self.setting.value(self.default)

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

MAX_JSON_DEPTH = 64
"""Arrays and objects of one JSON Lines record nest at most this deep (a dump's values: a list of numbers, NeMo-RL's
batch of one: 2 or 3 levels); measured before parsing, since Python's parser recurses once per level."""

ROW_TOKENS = Limit("RCDIAG_MAX_ROW_TOKENS", 16 << 20, "tokens", "this response")
"""One response is computed whole, in memory: at most 16,777,216 tokens. Memory grows by about 75 bytes of address
space (45 resident) per token of the longest response: 16M tokens run within a 4 GB address-space cap."""

LIMITS = (TENSOR_BYTES, COMPRESSION_RATIO, JSON_LINE_CHARS, ROW_TOKENS)
"""Every limit (docs/input.md lists them)."""

MAX_SPILL_BUCKETS = 256
"""The long layout groups tokens by sequence in at most this many temporary files, each open while reading."""


@contextmanager
def memory_named(path: str) -> Iterator[None]:
    """A ``MemoryError`` while a reader opens or reads ``path`` is an ``InputError`` naming the file (exit 2): a
    size no limit above bounds (one Arrow record batch, a limit turned off or raised) that this machine cannot
    hold is a fact about the input, not a bug in rcdiag."""
    try:
        yield
    except MemoryError as exc:
        reason = str(exc).splitlines()[0][:160] if str(exc).strip() else "no detail"
        raise InputError(
            f"needs more memory than this process could allocate to be read ({reason}); is the file corrupt, or "
            "does it need a machine with more memory?",
            path=path,
        ) from None


def check_environment() -> None:
    """Every ``RCDIAG_*`` variable that is set holds a value it takes, else one ``SettingError`` naming it: checked
    when a dump is opened, so a bad value is refused whatever the input (one the input does not use too), in the
    message every variable gives (``rcdiag.runtime.environment``)."""
    from rcdiag.io.storage import TIMEOUTS
    from rcdiag.kernels.small import SMALL_DUMP
    from rcdiag.runtime.notices import COMPILE_NOTICE

    for limit in LIMITS:
        limit.value  # noqa: B018 - read to be checked
    for timeout in TIMEOUTS:
        timeout.seconds()
    SMALL_DUMP.value(0)
    COMPILE_NOTICE.value(True)
