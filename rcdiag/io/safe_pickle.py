"""A pickle read through a fixed table of admitted globals: a pickle that names anything else is refused before
anything it names is called.

A pickle is a program: each global it names (``os.system``, ``builtins.eval``, ``subprocess.Popen``) is imported
and may be called with arguments from the file. ``load`` resolves every global through ``admitted`` (the
unpickler's ``find_class``, which both of Python's unpicklers call for every global, extension code and
``NEWOBJ`` class), so a global outside the table ends the read with an ``InputError`` naming the file and the
global, before it is imported or called; persistent ids (how ``torch.save`` refers to storages) are refused the
same way. The table's entries are rcdiag's own stand-ins, never the modules the names come from. The file is read
into memory first, within ``TENSOR_BYTES``, so no length an opcode declares is allocated beyond the file's bytes.
"""

from __future__ import annotations

import io
import pickle
import struct
from collections.abc import Mapping
from typing import Any

from rcdiag.io.limits import TENSOR_BYTES
from rcdiag.io.paths import open_input
from rcdiag.runtime.errors import InputError


def load(path: str, admitted: Mapping[tuple[str, str], Any], holds: str) -> Any:
    """The object the pickle at ``path`` builds, every global it names taken from ``admitted`` (``(module, name)``
    -> rcdiag's stand-in); ``holds`` says what such a file holds, for the refusal."""
    with open_input(path) as handle:
        handle.seek(0, io.SEEK_END)
        size = handle.tell()
        TENSOR_BYTES.check(size, path, "the file (read whole: a pickle holds its tensors' bytes)")
        handle.seek(0)
        data = handle.read()
    return loads(data, admitted, holds, path)


def loads(data: bytes, admitted: Mapping[tuple[str, str], Any], holds: str, path: str) -> Any:
    """``load`` of bytes already read."""

    class Restricted(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            found = admitted.get((module, name))
            if found is None:
                raise InputError(
                    f"is a pickle naming the global '{module}.{name}', which {holds} never holds; refused before "
                    "anything it names was imported or run (a pickle is code: docs/threat-model.md)",
                    path=path,
                )
            return found

        def persistent_load(self, pid: Any) -> Any:
            raise InputError(
                f"is a pickle with a persistent id ({str(pid)[:40]!r}), which {holds} never holds; rcdiag refused it",
                path=path,
            )

    try:
        return Restricted(io.BytesIO(data)).load()
    except InputError:
        raise
    except (
        pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError, struct.error,
        RecursionError, OverflowError, UnicodeDecodeError, RuntimeError,
    ) as exc:  # fmt: skip
        text = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise InputError(f"cannot be read as a pickle ({text}); is the file complete?", path=path) from None
