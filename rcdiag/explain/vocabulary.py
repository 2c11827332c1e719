"""``--tokenizer PATH``: the text of token ids, read offline with the ``tokenizers`` library (``rcdiag[tokens]``).

``PATH`` is a ``tokenizer.json`` or a directory holding one (a Hugging Face model directory). Nothing is fetched:
the file is read as it is. ``text`` gives one id's text escaped for a table (whitespace, control and invisible
characters written out, special tokens marked), ``pieces`` a response's text split at its tokens (decoded as a
stream, so a character spread over several byte-level tokens comes out whole, on the token that completes it).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

from rcdiag.runtime.errors import ConfigError, InputError
from rcdiag.runtime.printable import printable

EXTRA = "tokens"
"""The optional extra that installs ``tokenizers``."""
FILE_NAME = "tokenizer.json"
TOKENIZER_INPUT = "the tokenizer {source}"
"""How a refused output names the tokenizer file (rcdiag.io.outputs.Ledger)."""
_INVISIBLE = re.compile(r"[\u00a0\u1680\u2000-\u200d\u202f\u205f\u2060\u3000\ufeff]")
SPACE = "\u2423"
"""How a space shows in a token's text (an open box)."""
SPECIAL = ("\u27e8", "\u27e9")
"""Brackets around a special token's text (end of sequence, chat-template markers)."""


def escape(text: str) -> str:
    """A token's text with whitespace, control and invisible characters visible: ``␣`` for a space, ``\\n`` for a
    newline, ``\\u200b`` for a zero-width space."""
    visible = printable(text).replace(" ", SPACE)
    return _INVISIBLE.sub(lambda m: f"\\u{ord(m.group()):04x}", visible)


def tokenizer_file(path: str | Path) -> Path:
    """The file a ``--tokenizer PATH`` reads: ``PATH``, or ``PATH/tokenizer.json`` for a directory."""
    file = Path(path)
    return file / FILE_NAME if file.is_dir() else file


class Vocabulary:
    """A tokenizer read from ``path``; ``ConfigError`` without the library, ``InputError`` for a bad file."""

    def __init__(self, path: str | Path) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise ConfigError(
                f'--tokenizer needs the tokenizers library, which is not installed: pip install "rcdiag[{EXTRA}]".'
            ) from None
        from rcdiag.io.paths import regular_file

        file = Path(path)
        give = f"a {FILE_NAME} or a directory holding one"
        if not os.path.lexists(file):
            raise InputError(f"has no {FILE_NAME} (give the file, or a directory holding one)", path=str(path))
        if stat.S_ISDIR(regular_file(file, give, directory=True).st_mode):
            file = file / FILE_NAME
            if not os.path.lexists(file):
                raise InputError(f"has no {FILE_NAME} (give the file, or a directory holding one)", path=str(path))
            regular_file(file, f"a {FILE_NAME}")
        try:
            self.tokenizer: Any = Tokenizer.from_file(str(file))
        except Exception as exc:  # the library raises a bare Exception for a malformed file
            first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
            raise InputError(f"cannot be read as a tokenizer ({first})", path=str(file)) from None
        self.path = str(file)
        self.size = int(self.tokenizer.get_vocab_size(with_added_tokens=True))
        self.special_ids = {
            int(i) for i, token in self.tokenizer.get_added_tokens_decoder().items() if getattr(token, "special", False)
        }

    def raw(self, token_id: int) -> str:
        """An id's text as decoded alone (special tokens kept), or its vocabulary entry when that decodes to
        nothing; ``""`` for an id outside the vocabulary."""
        if not 0 <= token_id < self.size:
            return ""
        text = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text or (self.tokenizer.id_to_token(token_id) or "")

    def text(self, token_id: int) -> str:
        """An id's text for a table: escaped, special tokens in ``⟨ ⟩``, ``∅`` outside the vocabulary."""
        if not 0 <= token_id < self.size:
            return "\u2205"
        shown = escape(self.raw(token_id))
        return f"{SPECIAL[0]}{shown}{SPECIAL[1]}" if token_id in self.special_ids else shown

    def texts(self, ids: list[int]) -> dict[int, str]:
        return {token_id: self.text(token_id) for token_id in ids}

    def pieces(self, ids: tuple[int, ...] | list[int]) -> tuple[str, ...]:
        """Each token's share of the response's text, in order (``"".join`` gives the decoded response); an id
        outside the vocabulary shows as ``∅``."""
        from tokenizers.decoders import DecodeStream

        stream = DecodeStream(skip_special_tokens=False)
        out = []
        for token_id in ids:
            if not 0 <= token_id < self.size:
                out.append("\u2205")
                continue
            try:
                piece = stream.step(self.tokenizer, int(token_id))
            except Exception:  # a decoder that cannot stream this id: its text alone
                piece = self.raw(int(token_id))
            out.append(piece or "")
        return tuple(out)

    def is_special(self, token_id: int) -> bool:
        return token_id in self.special_ids
