"""The section protocol: what a feature riding on a run declares, and what it is given when the run ends."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

if TYPE_CHECKING:
    from rcdiag.engine.stream import WholeDump
    from rcdiag.io.base import SourceInfo
    from rcdiag.records.report import Finding, InputFacts
    from rcdiag.settings.correction import ResolvedConfig
    from rcdiag.settings.reading import ReadOptions


@dataclass(frozen=True)
class RunFacts:
    """What a section's record may read besides its own state: the finished run's configuration, metrics and
    counts (computed once by the library, never again by a section)."""

    resolved: ResolvedConfig
    metrics: dict[str, float | None]
    extras: dict[str, float | None]
    steps: Sequence[tuple[int, dict[str, float | None]]]
    """Each step's metrics, in step order (empty for a dump without steps)."""
    input: InputFacts


class SectionRecord(Protocol):
    """A section's typed, frozen result (``rcdiag.records.report``): what its renderers read and its JSON holds."""

    def to_dict(self) -> Any: ...


class Values(Protocol):
    """Values keyed as a report keys them: ``metrics`` beside verl's, ``extras`` beside rcdiag's."""

    metrics: dict[str, float | None]
    extras: dict[str, float | None]


@runtime_checkable
class ValuesRecord(Protocol):
    """A record whose values join the report's ``metrics`` and ``extras``, pooled and per step (``--as NAME``: a
    framework's own keys, ``rcdiag.frameworks.section``); ``rcdiag.api.build_report`` merges them."""

    @property
    def pooled(self) -> Values: ...

    def step_metrics(self, step: int) -> Values: ...

    def to_dict(self) -> Any: ...


class Section(Protocol):
    """A feature that rides on a run. Picklable: worker processes and Ray tasks build their states with it."""

    KEY: ClassVar[str]
    """Its name: the saved state's ``whole_dump`` key, ``Report.sections``' key and its JSON key."""
    STATE: ClassVar[Any]
    """The class of its whole-dump accumulator (``from_state_dict``, ``layout``: how a saved one is read back);
    ``None`` for a section that keeps none."""
    SAVED: ClassVar[bool]
    """``--save-state`` saves its state (not the micro-batches': every valid token, in one process)."""
    ONE_PROCESS: ClassVar[str]
    """What needs every row in reading order in one process (``"micro-batch options"``), named in the refusal of
    ``--workers`` and ``--ray``; empty: any number of processes."""
    wants_tokens: bool
    """It reads the dump's token ids (the readers then decode them)."""
    wants_loss_inputs: bool
    """It reads the dump's optional loss inputs (advantages, the current policy's log-probs): only then do the
    readers decode them, so a plain run neither pays for them nor stops at a bad one."""

    def outputs(self) -> list[tuple[str, str | Path]]:
        """The files it writes, each named like its keyword (``("sequences", path)``): the run refuses any over an
        input before reading (``rcdiag.io.outputs``)."""
        ...

    def check_outputs(self) -> None:
        """Its output paths' own rules (a suffix, a directory), checked before the ledger sees them."""
        ...

    def read_inputs(self) -> None:
        """Read the files it needs besides the dump (a tokenizer), after the dump is named an input, before any
        value is read."""
        ...

    def prepare(self, info: SourceInfo, read: ReadOptions) -> None:
        """Refuse, before any value is read, what the section cannot do with this dump and these options (a
        missing column, ``--ray`` for a feature that writes local files): ``ConfigError`` or ``InputError``."""
        ...

    def new_state(self) -> WholeDump | None:
        """The empty accumulator one read (a process, a worker part, a Ray task) feeds; ``None`` for a section
        computed from the run's facts alone."""
        ...

    def scratch(self) -> Path | None:
        """A scratch directory for the files ``observe`` writes while the dump is read (removed after the run);
        ``None``: it writes none."""
        ...

    def observe(self, state: Any, resolved: Any, scratch: Path | None, part: int) -> Callable[[], None] | None:
        """Attach per-row consumers writing under ``scratch`` (``--sequences``); returns what flushes them."""
        ...

    def gather(self, state: Any, scratch: Path) -> None:
        """Once every part is read: join what ``observe`` wrote under ``scratch`` into its file."""
        ...

    def record(self, state: Any, run: RunFacts) -> SectionRecord | None:
        """The typed record of the finished (merged) state; ``None``: nothing to report."""
        ...

    def findings(self, state: Any, run: RunFacts) -> list[Finding]:
        """The findings the finished state shows (each through ``rcdiag.catalogue.finding``)."""
        ...

    def write(self, state: Any, record: Any) -> None:
        """Write the section's files (through ``rcdiag.io.outputs``); called after the report is built."""
        ...

    @classmethod
    def merge_refusal(cls, mine: Any, theirs: Any, path: str, first: str) -> str | None:
        """Why its states in two state files (``first``'s, ``mine``, and ``path``'s, ``theirs``; ``None``: the file
        holds none) cannot merge; ``None``: they can."""
        ...


class PlainSection:
    """Defaults for a section that needs no check, no token ids, no observers and no files."""

    KEY: ClassVar[str] = ""
    STATE: ClassVar[Any] = None
    SAVED: ClassVar[bool] = True
    ONE_PROCESS: ClassVar[str] = ""
    wants_tokens = False
    wants_loss_inputs = False

    def outputs(self) -> list[tuple[str, str | Path]]:
        return []

    def check_outputs(self) -> None:
        return None

    def read_inputs(self) -> None:
        return None

    def prepare(self, info: SourceInfo, read: ReadOptions) -> None:
        return None

    def scratch(self) -> Path | None:
        return None

    def observe(self, state: Any, resolved: Any, scratch: Path | None, part: int) -> Callable[[], None] | None:
        return None

    def gather(self, state: Any, scratch: Path) -> None:
        return None

    def findings(self, state: Any, run: RunFacts) -> list[Finding]:
        return []

    def write(self, state: Any, record: Any) -> None:
        return None

    @classmethod
    def merge_refusal(cls, mine: Any, theirs: Any, path: str, first: str) -> str | None:
        return None
