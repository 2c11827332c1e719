"""The input formats rcdiag reads: one line each, and what the dispatcher, error texts and ``--help`` list.

An entry names its reader as ``"module:attribute"`` and is imported only when a file of that format is opened:
listing the formats (``format_names``, the CLI help) costs no pyarrow or numpy import. Adding a format means its
module (a ``TableFile`` subclass, and optionally a ``claims(path)`` function) and one line in ``FORMATS``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rcdiag.io.base import ColumnMap
    from rcdiag.io.storage import FilePath
    from rcdiag.io.tables import TableFile


@dataclass(frozen=True)
class InputFormat:
    """How a format is recognised and opened.

    ``name`` is the kind named in messages; ``suffixes`` and ``magic`` (prefixes of the first bytes, leading
    whitespace ignored) recognise a file; among formats that share a suffix or magic the first whose ``claims``
    accepts the file wins (no ``claims``: always). ``run_dir`` names the sub-directory holding the dumps in this
    tool's run directory; ``companions`` are file names this tool writes beside its dumps that are not dumps.
    ``prompts``: its rows hold the prompt and padding too, so a dump of it without a mask counts them as response
    tokens (the ``mask_missing`` finding). ``keeps_open``: each local file stays open from opening the dump to the
    end of reading (a Parquet reader), so a dump of many shards needs as many open files. ``units`` maps the
    format's files of a dump to the files to open when one unit spans several files (a rollout's rank files, read
    through one of them): a function of the file list, in order.
    """

    name: str
    title: str
    suffixes: tuple[str, ...]
    magic: tuple[bytes, ...]
    opener: str
    claims: str | None = None
    run_dir: str | None = None
    companions: str | None = None
    prompts: bool = False
    keeps_open: bool = False
    units: str | None = None

    def open(self, path: str | FilePath, columns: ColumnMap | None) -> TableFile:
        """The format's ``TableFile`` for ``path`` (text in a worker's ``Part``); memory it cannot have is an
        error naming the file."""
        from rcdiag.io.limits import memory_named

        with memory_named(str(path)):
            return _load(self.opener)(path, columns)

    def opened(self, files: list[FilePath]) -> list[FilePath]:
        """The files of this format to open (each reads what its unit spans)."""
        return files if self.units is None else list(_load(self.units)(files))

    def accepts(self, path: FilePath) -> bool:
        """Whether this format reads ``path`` (once its suffix or magic matched)."""
        return self.claims is None or bool(_load(self.claims)(path))


FORMATS: tuple[InputFormat, ...] = (
    InputFormat("parquet", "Parquet", (".parquet", ".pq"), (b"PAR1",), "rcdiag.io.parquet:ParquetFile",
                keeps_open=True),
    InputFormat("arrow", "Arrow IPC", (".arrow", ".feather", ".ipc", ".arrows"), (b"ARROW1", b"\xff\xff\xff\xff"),
                "rcdiag.io.arrow_ipc:ArrowIpcFile"),
    InputFormat("nemo-rl", "NeMo-RL JSONL", (".jsonl",), (b"{",), "rcdiag.io.nemo_rl:NemoRlFile",
                claims="rcdiag.io.nemo_rl:claims", companions=r"^val_data_step\d+\.jsonl$", prompts=True),
    InputFormat("prime-rl", "prime-rl JSONL", (".jsonl",), (b"{",), "rcdiag.io.prime_rl:PrimeRlFile",
                claims="rcdiag.io.prime_rl:claims", run_dir="token_exports", prompts=True),
    InputFormat("jsonl", "JSONL", (".jsonl",), (b"{",), "rcdiag.io.jsonl:JsonlFile"),
    InputFormat("torch", "PyTorch .pt", (".pt", ".pth"), (), "rcdiag.io.torch_pt:TorchFile",
                units="rcdiag.io.rank_files:leaders"),
    InputFormat("skyrl", "SkyRL .pkl", (".pkl",), (), "rcdiag.io.skyrl:SkyrlFile", run_dir="dumped_data",
                prompts=True),
    InputFormat("npz", "NumPy .npz", (".npz",), (b"PK\x03\x04",), "rcdiag.io.npz:NpzFile"),
)  # fmt: skip

NOT_DUMPS = {
    ".csv": "is CSV, which is not a dump format (it cannot hold a list of log-probs per response); with one row "
    'per token and a sequence id it is the long layout: convert it with python -c "import pyarrow.csv as c, '
    "pyarrow.parquet as p; p.write_table(c.read_csv('{path}'), '{stem}.parquet')\" and analyze the .parquet",
}
"""Suffixes of files that are not dumps, with what to do instead (``{path}``, ``{stem}`` filled in)."""


def format_names() -> tuple[str, ...]:
    """The readable formats, in registry order (for help and error texts)."""
    return tuple(f.title for f in FORMATS)


def suffixes() -> tuple[str, ...]:
    """Every suffix of a readable format."""
    return tuple(dict.fromkeys(s for f in FORMATS for s in f.suffixes))


def candidates(path: FilePath, head: Callable[[], bytes]) -> list[InputFormat]:
    """Formats that may hold ``path``: by suffix, else by the first bytes (``head`` reads them)."""
    found = [f for f in FORMATS if path.suffix.lower() in f.suffixes]
    if found:
        return found
    start = head().lstrip()
    return [f for f in FORMATS if any(start.startswith(m) for m in f.magic)]


def _load(reference: str) -> Any:
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)
