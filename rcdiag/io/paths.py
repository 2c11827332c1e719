"""Everything that touches the file system by name: globs, directories, first bytes, a file's identity.

Kept in one place so another location (object storage URLs) means another branch here, not in every reader.
Files are listed in natural order (``step_2`` before ``step_10``), so results and errors are reproducible;
names starting with ``.`` or ``_`` (temporary and marker files, e.g. a half-written DumpWriter part or
``_SUCCESS``) are never read.
"""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path

from rcdiag.errors import InputError
from rcdiag.io import registry

GLOB_CHARS = "*?["


def natural_key(path: Path) -> list:
    """Sort key that orders digit runs by value."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def is_hidden(path: Path, root: Path | None = None) -> bool:
    """Temporary or marker files: any path component below ``root`` starting with ``.`` or ``_``."""
    parts = path.relative_to(root).parts if root is not None else (path.name,)
    return any(part.startswith((".", "_")) for part in parts)


def expand(path: str | Path) -> list[Path]:
    """The files a dump path names: a file, a directory (read recursively) or a glob."""
    text = str(path)
    files = glob_files(text)
    if files is not None:
        return files
    p = Path(path)
    if not p.exists():
        raise InputError("file not found", path=text)
    if not p.is_dir():
        return [p]
    files = directory_files(p)
    if not files:
        raise InputError(f"is a directory without dump files ({', '.join(registry.suffixes())})", path=text)
    return files


def directory_files(root: Path) -> list[Path]:
    """A format's run directory holds its dumps in ``run_dir`` (prime-rl's ``token_exports``); any other directory
    is read whole, recursively."""
    for fmt in registry.FORMATS:
        if fmt.run_dir is not None:
            found = root if root.name == fmt.run_dir else root / fmt.run_dir
            if found.is_dir():
                return list_files(found, fmt.suffixes)
    return list_files(root, registry.suffixes())


def glob_files(pattern: str) -> list[Path] | None:
    """The files a glob matches (natural order), or ``None`` when ``pattern`` names an existing path or is no glob."""
    if Path(pattern).exists() or not any(ch in pattern for ch in GLOB_CHARS):
        return None
    found = (Path(f) for f in glob.glob(pattern, recursive=True))
    files = sorted((f for f in found if f.is_file() and not is_hidden(f)), key=natural_key)
    if not files:
        raise InputError("matches no file", path=pattern)
    return files


def list_files(root: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """Files under ``root`` (recursively) with one of ``suffixes``, hidden ones left out, in natural order."""
    found = [p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in suffixes and not is_hidden(p, root)]
    return sorted(found, key=natural_key)


def read_head(path: Path, size: int = 8) -> bytes:
    """The first bytes of a file."""
    try:
        with open(path, "rb") as handle:
            return handle.read(size)
    except OSError as exc:
        raise InputError(f"cannot be read ({exc.strerror})", path=str(path)) from None


def identity(path: str) -> dict[str, object]:
    """What makes a read file the same file: absolute path, size and modification time (``merge`` compares it)."""
    stat = os.stat(path)
    return {"path": str(Path(path).resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
