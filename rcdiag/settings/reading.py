"""How to read a dump: one frozen record that every entry point takes (analyze, sweep, compare, check, merge).

The CLI declares one flag per field (``READ_FLAGS`` in ``rcdiag.cli.flags``) and passes the record through
unchanged, so a new input option is a field here, a flag there and a row in docs/options.md. Imports nothing
heavy: the CLI's ``--help`` loads this module.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rcdiag.runtime.errors import ConfigError
from rcdiag.runtime.option_checks import Check, choice, count, integer_text, keyword
from rcdiag.settings.constants import DEFAULT_CHUNK_TOKENS, DEVICES, MAX_CHUNK_TOKENS

if TYPE_CHECKING:
    from rcdiag.io.base import ColumnMap
    from rcdiag.metrics.backend import Backend

__all__ = ["BAD_ROW_POLICIES", "DEVICES", "ReadOptions"]  # DEVICES lives in settings.constants (backend reads it)

BAD_ROW_POLICIES = ("error", "skip")
"""``on_bad_row`` values: stop at the first bad row, or leave bad rows out and count them."""
ON_BAD_ROW = choice(BAD_ROW_POLICIES)
CHUNK_TOKENS = count(1, MAX_CHUNK_TOKENS, of="tokens")


def _workers_text(value: Any) -> Any:
    """``--workers``' text: ``auto`` (any case), else as an integer's (``option_checks.integer_text``)."""
    return "auto" if str(value).strip().lower() == "auto" else integer_text(value)


WORKERS = Check("an integer >= 1 or 'auto'", lambda v: v == "auto" or count(1).accepts(v), "0", _workers_text)
VOCAB_SIZE = count(1, of="token ids")
RAY_ADDRESS = Check(
    "a Ray address (host:port, ray://host:port or auto; empty: an unset variable?)", lambda v: bool(str(v).strip()), ""
)
"""What each field takes (``rcdiag.runtime.option_checks``); the CLI's flags check the same before building the
record."""


@dataclass(frozen=True)
class ReadOptions:
    """How a dump is read. None of these changes a metric except ``columns`` (which data) and ``on_bad_row``
    (which rows, all counted in the report)."""

    columns: ColumnMap | None = None
    """Column (or JSON/tensor key) names where the common names are not recognised; ``None``: recognise all."""
    on_bad_row: str = "error"
    """``"error"``: stop at the first row holding NaN, +inf, a positive log-prob or a mask value other than 0/1;
    ``"skip"``: leave such rows out, counted in ``report.input.skipped_by_reason``."""
    device: str | Backend = "cpu"
    """``cpu`` (numpy), ``cuda`` / ``cuda:N`` (torch), ``auto``, ``torch-cpu``; or a ``Backend``."""
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    """Read about this many list values at a time: bounds memory, never changes a metric."""
    workers: int | str = 1
    """Split the dump's parts (Parquet row groups, a directory's shards) among this many CPU processes; ``"auto"``:
    as many as can beat one process on this dump and machine (``rcdiag.engine.parallel.auto_workers``), often one."""
    quiet: bool = False
    """No progress display. The library draws none itself; the CLI's bar honours it."""
    ray: bool = False
    """Read each part (a Parquet row group, a shard file) as a Ray task and merge their states (needs
    ``rcdiag[ray]``); the cluster is ``ray_address``, else ``RAY_ADDRESS``, else a local Ray instance."""
    ray_address: str | None = None
    """The Ray cluster to run on (``ray://host:10001``, ``host:6379`` or ``auto``); giving one implies ``ray``."""
    vocab_size: int | None = None
    """Token ids (read with ``--explain`` when the dump has them) must be below this; ``None``: not checked."""

    def __post_init__(self) -> None:
        ON_BAD_ROW(str(self.on_bad_row), keyword("on_bad_row"))
        object.__setattr__(self, "on_bad_row", str(self.on_bad_row))
        CHUNK_TOKENS(self.chunk_tokens, keyword("chunk_tokens"))
        WORKERS(self.workers, keyword("workers"))
        if self.vocab_size is not None:
            VOCAB_SIZE(self.vocab_size, keyword("vocab_size"))
        if self.ray_address is not None:
            RAY_ADDRESS(self.ray_address, keyword("ray_address"))
            object.__setattr__(self, "ray", True)
        if self.ray and self.workers != 1:
            raise ConfigError("workers and ray both split the dump; use one (ray runs a task per part).")

    def replace(self, **changes: Any) -> ReadOptions:
        """A copy with some fields changed (an unknown field is a ``TypeError``, as for the constructor)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def of(cls, read: ReadOptions | None, options: dict[str, Any]) -> ReadOptions:
        """``read`` (or the defaults) with loose keyword arguments on top: the entry points accept both
        ``read=ReadOptions(...)`` and the older ``device=..., columns=...`` keywords."""
        base = read if read is not None else cls()
        unknown = set(options) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(unknown))}")
        return base.replace(**options) if options else base
