"""Zip archives (``.npz``, ``.pt``): the sizes their members declare, checked before anything is inflated.

A zip entry records its stored and inflated sizes, and ``zipfile`` never inflates past the recorded size, so those
sizes bound what reading can allocate: a zip bomb is refused by its ratio, a file too large for memory by its
inflated size (``rcdiag.io.limits``). An ``.npy`` member's header (a few hundred bytes) declares its shape and
type; a shape that needs more bytes than the member holds is a corrupt file, refused before numpy allocates it.
"""

from __future__ import annotations

import math
import zipfile
from typing import IO, Any

import numpy as np

from rcdiag.io.limits import COMPRESSED_MEMBER_MIN, COMPRESSION_RATIO, TENSOR_BYTES
from rcdiag.runtime.errors import InputError


def check_members(archive: zipfile.ZipFile, path: str) -> None:
    """Refuse a member that inflates too far (a zip bomb) or an archive whose members inflate beyond the limit."""
    ratio = COMPRESSION_RATIO.value
    for info in archive.infolist():
        stored = max(info.compress_size, 1)
        compressed = info.compress_type != zipfile.ZIP_STORED and info.file_size > COMPRESSED_MEMBER_MIN
        if ratio and compressed and info.file_size > ratio * stored:
            COMPRESSION_RATIO.check(
                info.file_size // stored,
                path,
                f"member '{info.filename}' inflates from {info.compress_size:,} to {info.file_size:,} bytes: its "
                "compression ratio",
            )
    TENSOR_BYTES.check(sum(info.file_size for info in archive.infolist()), path, "the inflated size of its members")


def npy_declared_bytes(archive: zipfile.ZipFile, info: zipfile.ZipInfo, path: str) -> int:
    """The bytes an ``.npy`` member's header declares (shape times item size), checked against the member."""
    with archive.open(info) as member:
        try:
            shape, dtype = _header(member)
        except (ValueError, EOFError, TypeError) as exc:
            raise InputError(
                f"member '{info.filename}' is not a NumPy array ({str(exc).splitlines()[0][:120]})", path=path
            ) from None
        header = member.tell()
    declared = math.prod(shape) * dtype.itemsize
    if declared > info.file_size - header:
        raise InputError(
            f"member '{info.filename}' declares shape {tuple(shape)} of {dtype}: {declared:,} bytes, but holds "
            f"{max(info.file_size - header, 0):,}; the file is corrupt",
            path=path,
        )
    return declared


def _header(member: IO[bytes] | Any) -> tuple[tuple[int, ...], np.dtype]:
    version = np.lib.format.read_magic(member)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dtype = read(member)
    if any(not isinstance(n, int) or n < 0 for n in shape):
        raise ValueError(f"shape {shape!r}")
    return tuple(shape), dtype
