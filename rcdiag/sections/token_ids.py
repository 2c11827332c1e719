"""A section that only asks for the dump's token ids: the per-step signature statistics read them from each block
(the history test, ``rcdiag.metrics.signatures``' ``repeat_drop``), and it keeps nothing of its own."""

from __future__ import annotations

from typing import Any, ClassVar

from rcdiag.sections.base import PlainSection, RunFacts


class TokenIdsSection(PlainSection):
    """Read the token-id column when the dump has one (``Section.wants_tokens``); no state, no record."""

    KEY: ClassVar[str] = "token_ids"
    wants_tokens = True

    def new_state(self) -> None:
        return None

    def record(self, state: Any, run: RunFacts) -> None:
        return None
