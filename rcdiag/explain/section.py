"""``--explain`` as a section (``rcdiag.sections``): its options, checks, state, record, findings and files."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from rcdiag.explain.state import ExplainState
from rcdiag.explain.worst import DEFAULT_WORST
from rcdiag.io.columns import ALIASES
from rcdiag.records.report import ExplainReport
from rcdiag.runtime.errors import ConfigError, InputError
from rcdiag.runtime.option_checks import keyword
from rcdiag.sections.base import PlainSection, RunFacts
from rcdiag.settings.section_options import WORST

if TYPE_CHECKING:
    from rcdiag.explain.vocabulary import Vocabulary
    from rcdiag.io.base import SourceInfo
    from rcdiag.records.report import Finding
    from rcdiag.settings.reading import ReadOptions

TOKEN_ALIASES = ALIASES["token"]


class ExplainSection(PlainSection):
    """Where the mismatch sits: breakdowns, worst responses, the bias detectors, the by-token table
    (docs/explain.md). Holds every option of ``--explain``: ``worst`` (the worst-list size), ``sequences`` (the
    per-response file, written while the dump is read: ``observe``), ``tokenizer`` (the token ids' text) and
    ``tokens`` (the by-token table's file)."""

    KEY: ClassVar[str] = ExplainState.KEY
    STATE = ExplainState
    wants_tokens = True

    def __init__(
        self,
        worst: int = DEFAULT_WORST,
        sequences: str | Path | None = None,
        tokenizer: str | Path | None = None,
        tokens: str | Path | None = None,
    ) -> None:
        self.worst = WORST(worst, keyword("worst"))
        self.sequences = sequences
        self.tokenizer = tokenizer
        self.tokens = tokens
        self._vocabulary: Vocabulary | None = None
        self._loaded = False

    def __getstate__(self) -> dict[str, Any]:  # a worker needs the options, never the tokenizer
        return {**self.__dict__, "_vocabulary": None, "_loaded": False}

    def vocabulary(self) -> Vocabulary | None:
        """The tokenizer's vocabulary, read once (the library reads it inside the run's output ledger)."""
        if not self._loaded:
            from rcdiag.explain.token_report import load_vocabulary

            self._vocabulary, self._loaded = load_vocabulary(self.tokenizer), True
        return self._vocabulary

    def outputs(self) -> list[tuple[str, str | Path]]:
        named = (("sequences", self.sequences), ("tokens", self.tokens))
        return [(name, path) for name, path in named if path is not None]

    def check_outputs(self) -> None:
        """The output paths' own rules (suffix, directory), before the ledger sees them."""
        if self.tokens is not None:
            from rcdiag.explain.token_report import check_tokens_target

            check_tokens_target(self.tokens)

    def read_inputs(self) -> None:
        self.vocabulary()

    def prepare(self, info: SourceInfo, read: ReadOptions) -> None:
        if self.sequences is not None:
            if read.ray:
                raise ConfigError(
                    "--sequences writes each part's rows on this machine, which Ray tasks elsewhere cannot reach; use "
                    "it without --ray (one process or --workers)."
                )
            from rcdiag.explain.sequences import check_target

            check_target(self.sequences)
        if self.tokens is not None and info.columns.get("token_ids") is None:
            raise InputError(
                f"has no column of token ids (looked for {', '.join(repr(n) for n in TOKEN_ALIASES[:4])}, ...); "
                "--tokens needs one: name it with --token-col NAME",
                path=str(info.path),
            )

    def new_state(self) -> ExplainState:
        return ExplainState(self.worst)

    def scratch(self) -> Path | None:
        """With ``--sequences``: the scratch directory beside its file, where each part writes its rows."""
        if self.sequences is None:
            return None
        from rcdiag.explain.sequences import temporary_directory

        return temporary_directory(self.sequences)

    def observe(self, state: Any, resolved: Any, scratch: Path | None, part: int) -> Callable[[], None] | None:
        """With ``--sequences`` (``scratch``: the local directory of the parts' files), attach the part's writer to
        ``state`` (its own directory under ``scratch``); returns what writes its last rows (``None``: no writer)."""
        if scratch is None:
            return None
        from rcdiag.explain.sequences import SequenceWriter

        writer = SequenceWriter(resolved, scratch / f"part-{part:04d}", self.sequences)
        state.observers.append(writer)
        return writer.flush

    def gather(self, state: ExplainState, scratch: Path) -> None:
        """The parts' ``--sequences`` files streamed into its file, each part's rows numbered after the rows read
        before it (parts in reading order)."""
        if self.sequences is None:
            return
        from rcdiag.explain.sequences import finish

        directories = sorted(p for p in scratch.iterdir() if p.is_dir())
        rows = state.part_rows or [0]
        finish([(directory, sum(rows[:i])) for i, directory in enumerate(directories)], self.sequences)

    def record(self, state: ExplainState | None, run: RunFacts) -> ExplainReport | None:
        if state is None:
            return None
        from rcdiag.explain.detectors import not_run
        from rcdiag.explain.token_report import decoded_texts, token_not_run_reason, token_section

        vocabulary = self.vocabulary()
        breakdowns = state.breakdowns.compute()
        if state.tokens.seen:
            breakdowns = dataclasses.replace(breakdowns, token=token_section(state.tokens, vocabulary))
        return ExplainReport(
            breakdowns=breakdowns,
            worst_sequences=tuple(entry.reported() for entry in state.worst.entries()),
            traces=tuple(state.worst.plotted()),
            sequences_path=None if self.sequences is None else str(self.sequences),
            not_run={**not_run(state, run.steps), **token_not_run_reason(state.tokens)},
            texts=decoded_texts(state.worst.token_texts(), vocabulary),
        )

    def findings(self, state: ExplainState | None, run: RunFacts) -> list[Finding]:
        if state is None:
            return []
        from rcdiag.explain.detectors import detect
        from rcdiag.explain.token_report import token_findings

        return [*detect(state, run.steps), *token_findings(state.tokens, self.vocabulary())]

    def write(self, state: ExplainState | None, record: Any) -> None:
        if state is not None and self.tokens is not None and state.tokens.seen:
            from rcdiag.explain.token_report import write_token_table

            write_token_table(state.tokens, self.tokens, self.vocabulary())

    @classmethod
    def merge_refusal(cls, mine: ExplainState | None, theirs: ExplainState | None, path: str, first: str) -> str | None:
        """States written with and without ``--explain``, or with two ``--worst``, do not merge."""
        if (mine is None) != (theirs is None):
            return (
                f"{path} was {'' if theirs is not None else 'not '}analysed with --explain but {first} "
                f"was{'' if mine is not None else ' not'}; merge states written with the same flags"
            )
        if mine is not None and theirs is not None and mine.worst.n != theirs.worst.n:
            return (
                f"{path} keeps {theirs.worst.n} worst responses but {first} keeps {mine.worst.n}; use the same --worst"
            )
        return None
