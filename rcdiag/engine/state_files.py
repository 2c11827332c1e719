"""Saved engine states: run shards anywhere, merge the states, get the report of one run over all of them.

A state file is JSON: the configuration, what was read (paths, formats, columns, metadata) and every step's
accumulator state (float64 sums, extremes, moments). Floats are written with ``repr`` precision, so a round trip
is exact; non-finite values are written as the strings ``"inf"``, ``"-inf"`` and ``"nan"``. Merging refuses
states computed with a configuration that computes something else. The file records the signature of the
accumulators' declared states (``state_layout``) and the rcdiag version that wrote it: a file written under
another layout is refused, naming that version.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from rcdiag._version import __version__
from rcdiag.engine.stream import StepStates, WholeDumpKinds, saved_whole_dump
from rcdiag.io.base import SourceInfo
from rcdiag.io.screen import ScreenStats
from rcdiag.metrics.batch import declared_states
from rcdiag.runtime.errors import ConfigError, InputError
from rcdiag.runtime.fields import FieldError, dataclass_from, shown
from rcdiag.settings.correction import CorrectionConfig

STATE_FORMAT = "rcdiag-state"
STATE_VERSION = 1

MAX_STATE_BYTES = 256 << 20
"""The largest state file read (a sweep state with recommendations keeps two numbers per response: ~5M responses)."""
MAX_STATE_DEPTH = 32
"""The deepest nesting of arrays and objects in a state file (rcdiag writes 10)."""
MAX_INT_DIGITS = 20
"""The longest integer in a state file (every count and step is an int64)."""

_THRESHOLDS = ("rollout_is_threshold", "rollout_rs_threshold")


STATE_INPUT = "the state file {source}"
"""How a refused output names a state file it would write over (rcdiag.io.outputs.Ledger)."""


class StateKinds(WholeDumpKinds, Protocol):
    """The kinds a state file may hold, given by the library (``rcdiag.sections.registry.KNOWN``, their one table):
    the state kinds (``analyze``, ``sweep``) and each whole-dump accumulator's, and what refuses two states' merge."""

    @property
    def names(self) -> tuple[str, ...]:
        """Every state kind, in order (``analyze`` first)."""
        ...

    def state(self, kind: str) -> type[StepStates[Any]]:
        """The state class of ``kind`` (one of ``names``)."""
        ...

    def merge_refusal(self, key: str, mine: Any, theirs: Any, path: str, first: str) -> str | None:
        """Why the whole-dump states under ``key`` of the first state file (``mine``, read from ``first``) and
        another (``theirs``, from ``path``; either may be ``None``: not held) cannot merge; ``None``: they can."""
        ...


def state_layout(kinds: StateKinds, whole_dump: Iterable[str] = ()) -> str:
    """The one version of every state file kind: a short hash of every accumulator's declared states and of the
    constants each state kind (the sweep's: ``StepStates.layout``) and the state's whole-dump accumulators
    (``whole_dump``: their keys, such as ``explain``) depend on (bucket edges, groups and their hash, series
    cut-off, the sweep kernel's buckets). A file written under another layout is refused, never merged into numbers
    that mean something else. Read when called, so a changed declaration or constant shows at once."""
    own = {name: kinds.state(name).layout() for name in kinds.names}  # first: their modules declare accumulators
    declared: dict[str, Any] = {"accumulators": declared_states()}
    declared.update({name: layout for name, layout in own.items() if layout is not None})
    declared.update({key: kinds.whole_dump(key).layout() for key in sorted(whole_dump)})
    text = json.dumps(declared, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class StateIdentity:
    """What makes two state files the same state: the digest of their bytes, and device and inode where local."""

    digest: str
    inode: tuple[int, int] | None


def save_state(
    path: str | Path,
    state: StepStates[Any],
    sources: list[SourceInfo],
    screen: ScreenStats,
    kinds: StateKinds,
    *,
    extra: dict[str, Any] | None = None,
    encoded: dict[str, Any] | None = None,
) -> None:
    """Write a state file atomically (a reader never sees a half-written file), locally or to object storage.
    ``extra``: more top-level keys written in the same file, at once (``rcdiag watch``'s files consumed);
    ``encoded``: ``encode_state(state.state_dict())`` when the caller keeps it (``rcdiag watch``, per step);
    ``kinds``: the kinds a state may hold (their layout is written with it)."""
    payload = {
        **(extra or {}),
        "format": STATE_FORMAT,
        "version": STATE_VERSION,
        "kind": state.KIND,
        "rcdiag_version": __version__,
        "layout": state_layout(kinds, state.whole_dump),
        "config": state.resolved.config.to_dict(),
        "sources": [_with_identity(info) for info in sources],
        "screen": screen.to_dict(),
        "state": encoded if encoded is not None else encode_state(state.state_dict()),
    }
    from rcdiag.io import storage

    text = storage.local_path(str(path))
    if storage.is_remote(text):  # one upload: the object appears whole or not at all
        storage.write_bytes(storage.parse(text), json.dumps(payload).encode())
        return
    from rcdiag.io.outputs import STATE_MODE, write_file

    write_file(text, json.dumps(payload).encode(), mode=STATE_MODE)  # whole or not at all, owner-only


def load_state(
    path: str | Path, kinds: StateKinds, kind: str | None = None
) -> tuple[StepStates[Any], list[SourceInfo], ScreenStats]:
    """Read a state file; any problem is an ``InputError`` naming the file (and the field at fault). ``kinds``: the
    kinds it may hold (``rcdiag.sections.registry.KNOWN``); ``kind`` (``"analyze"``, ``"sweep"``): the kind the
    caller reads; a state of another kind is refused naming both."""
    state, sources, screen, _ = _load(str(path), kinds, kind)
    return state, sources, screen


def _load(
    name: str, kinds: StateKinds, expected: str | None = None
) -> tuple[StepStates[Any], list[SourceInfo], ScreenStats, StateIdentity]:
    data, identity = read_state_bytes(name)
    payload = parse_state_json(data, name)
    if not isinstance(payload, dict) or payload.get("format") != STATE_FORMAT:
        raise InputError("is not an rcdiag state file (write one with 'rcdiag analyze ... --save-state')", path=name)
    writer = f"rcdiag {payload.get('rcdiag_version', '(unknown version)')}"
    version = payload.get("version")
    if type(version) is not int or version != STATE_VERSION:
        raise InputError(
            f"has state version {shown(version)} (written by {writer}); rcdiag {__version__} reads "
            f"version {STATE_VERSION} (int): re-run 'rcdiag analyze ... --save-state' with this rcdiag",
            path=name,
        )
    try:
        layout = state_layout(kinds, saved_whole_dump(payload.get("state")))
    except FieldError as exc:
        raise InputError(f"holds a field that does not fit: {exc}", path=name) from None
    if payload.get("layout") != layout:
        command = "sweep" if payload.get("kind") == "sweep" else "analyze"
        raise InputError(
            f"was written by {writer}, whose states have another layout (declared states or the constants they "
            f"depend on: layout {payload.get('layout') or 'not recorded'}; rcdiag {__version__} has "
            f"{layout}), so it cannot be loaded or merged: re-run 'rcdiag {command} ... --save-state' with "
            "this rcdiag",
            path=name,
        )
    try:
        kind = payload.get("kind", "analyze")
        if kind not in kinds.names:
            raise FieldError(f"kind must be one of {', '.join(kinds.names)}, got {shown(kind)}")
        table = _table(payload, "state")
        _check_kind(name, kind, table)
        config = dataclass_from(CorrectionConfig, payload.get("config"), "config.", signed=_THRESHOLDS)
        resolved = config.resolve()
        state = kinds.state(kind).from_state_dict(resolved, _decode(table), kinds)
        infos = payload.get("sources")
        if not isinstance(infos, list):
            raise FieldError(f"sources must be a list, got {shown(infos)}")
        sources = [dataclass_from(SourceInfo, info, f"sources[{i}].") for i, info in enumerate(infos)]
        screen = dataclass_from(ScreenStats, payload.get("screen"), "screen.")
    except (FieldError, ConfigError) as exc:
        raise InputError(f"holds a field that does not fit: {exc}", path=name) from None
    except (KeyError, IndexError, AttributeError, TypeError, ValueError) as exc:  # a shape the layout lacks
        raise InputError(f"holds a damaged state ({type(exc).__name__}: {exc})", path=name) from None
    if expected is not None and kind != expected:  # after the fields: a damaged state says what is damaged
        raise InputError(
            f"is {_a(kind)} state (written by 'rcdiag {kind} --save-state') where {_a(expected)} state is expected: "
            f"give states of 'rcdiag {expected} --save-state'",
            path=name,
        )
    contradiction = state.counts_contradiction()
    if contradiction is not None:
        raise InputError(
            f"holds counts that contradict each other: {contradiction} (a damaged or edited state; write it again "
            f"with 'rcdiag {kind} ... --save-state')",
            path=name,
        )
    return state, sources, screen, identity


def _check_kind(name: str, kind: str, table: dict[str, Any]) -> None:
    """The state's declared ``kind`` must be the one its contents are (a sweep's state holds its ``grid``, an
    analyze state none): else it is refused naming both kinds, before its contents are read as the other's."""
    held = "sweep" if "grid" in table else "analyze"
    if held != kind:
        raise InputError(
            f"says it is {_a(kind)} state (kind {kind!r}) but holds {_a(held)} state (written by 'rcdiag {held} "
            "--save-state'); it was edited or damaged: write it again",
            path=name,
        )


def _table(payload: dict[str, Any], key: str) -> dict[str, Any]:
    value = payload.get(key)
    if not isinstance(value, dict):
        raise FieldError(f"{key} must be a table (a JSON object), got {shown(value)}")
    return value


def read_state_bytes(name: str) -> tuple[bytes, StateIdentity]:
    """A state file's bytes and what identifies it (device and inode where local, and a digest of the bytes); only
    a regular file of at most ``MAX_STATE_BYTES`` is read (a FIFO would block, a device never end)."""
    from rcdiag.io import storage
    from rcdiag.io.paths import read_bytes, regular_file

    text = storage.local_path(name)
    limit = f"the limit for a state file is {MAX_STATE_BYTES >> 20} MiB"
    inode: tuple[int, int] | None = None
    try:
        if storage.is_remote(text):
            data = read_bytes(text)
        else:
            info = regular_file(text, "a state file")
            if info.st_size > MAX_STATE_BYTES:
                raise InputError(f"is {info.st_size:,} bytes; {limit}", path=name)
            inode = (info.st_dev, info.st_ino)
            with open(text, "rb") as handle:
                data = handle.read(MAX_STATE_BYTES + 1)
    except FileNotFoundError:
        raise InputError("file not found", path=name) from None
    except OSError as exc:
        raise InputError(f"cannot be read ({exc.strerror or exc})", path=name) from None
    if len(data) > MAX_STATE_BYTES:
        raise InputError(f"is more than {MAX_STATE_BYTES:,} bytes; {limit}", path=name)
    return data, StateIdentity(hashlib.sha256(data).hexdigest(), inode)


def parse_state_json(data: bytes, name: str) -> Any:
    """JSON within the state limits, checked before any object is built: UTF-8, nested at most
    ``MAX_STATE_DEPTH`` deep, integers of at most ``MAX_INT_DIGITS`` digits, finite numbers, no ``NaN`` literal."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"is not an rcdiag state file (not UTF-8 text: byte {exc.start})", path=name) from None
    depth = json_depth(data)
    if depth > MAX_STATE_DEPTH:
        raise InputError(
            f"is not an rcdiag state file (JSON nested {depth} deep; at most {MAX_STATE_DEPTH})", path=name
        )
    try:
        return json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant)
    except FieldError as exc:
        raise InputError(f"is not an rcdiag state file ({exc})", path=name) from None
    except (json.JSONDecodeError, RecursionError) as exc:
        raise InputError(f"is not an rcdiag state file ({exc})", path=name) from None


_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_DEPTH_STEP = np.zeros(256, dtype=np.int8)
_DEPTH_STEP[[ord("["), ord("{")]] = 1
_DEPTH_STEP[[ord("]"), ord("}")]] = -1


def json_depth(data: bytes) -> int:
    """How deep a JSON text nests its arrays and objects (brackets inside strings do not count), found without
    parsing it: a deeply nested file is refused before the parser recurses into it."""
    steps = _DEPTH_STEP[np.frombuffer(_STRINGS.sub(b'""', data), dtype=np.uint8)]
    moves = steps[steps != 0].astype(np.int64)
    return int(np.cumsum(moves).max()) if moves.size else 0


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise FieldError(f"an integer of {len(text.lstrip('-'))} digits; at most {MAX_INT_DIGITS}")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise FieldError(f"the number {text[:40]} is beyond float64's range")
    return value


def _parse_constant(text: str) -> float:
    raise FieldError(f'the literal {text} (a state writes non-finite values as the strings "nan", "inf")')


def state_kind(path: str | Path) -> str:
    """The kind of a state file (a path or URL), without loading its state (``"analyze"`` for files without one;
    a directory, prefix or glob: its first state file's)."""
    import warnings

    from rcdiag.io.paths import state_files

    try:
        with warnings.catch_warnings(record=True):  # what the listing leaves out is said once, by the merge
            first = state_files(str(path))[0]
        payload = parse_state_json(read_state_bytes(first)[0], first)
    except InputError:
        return "analyze"  # load_state gives the precise error
    return payload.get("kind", "analyze") if isinstance(payload, dict) else "analyze"


def _a(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def merge_state_files(
    paths: list[str | Path], kinds: StateKinds, kind: str | None = None
) -> tuple[StepStates[Any], list[SourceInfo], ScreenStats]:
    """Load and merge state files; they must compute the same metrics. ``kinds``: the kinds they may hold
    (``rcdiag.sections.registry.KNOWN``); ``kind``: the kind of state the caller merges (each file of another kind
    is refused naming both); ``None``: the first file's (the merged state's ``KIND`` says which)."""
    from rcdiag.io.outputs import reads
    from rcdiag.io.paths import state_files

    reads(*paths, what=STATE_INPUT)  # the run's inputs before one is read (rcdiag.io.outputs.Ledger)

    paths = [file for path in paths for file in state_files(str(path))]
    if not paths:
        raise ConfigError("no state files to merge")
    merged, sources, screen, identity = _load(str(paths[0]), kinds, kind)
    kind = merged.KIND
    seen: dict[tuple, tuple[int, str | Path, Any]] = {}
    _check_not_merged(0, paths[0], sources, seen)
    states: dict[Any, str | Path] = {}
    _check_not_twice(paths[0], identity, states)
    for index, path in enumerate(paths[1:], 1):
        state, more, more_screen, identity = _load(str(path), kinds, kind)
        _check_not_merged(index, path, more, seen)  # first: it names the dump read twice
        _check_not_twice(path, identity, states)
        if not merged.resolved.same_computation(state.resolved):
            raise ConfigError(
                f"{path} was computed with a different configuration ({_describe(state.resolved.config)}) than "
                f"{paths[0]} ({_describe(merged.resolved.config)}); states merge only under the same configuration"
            )
        _check_sections(kinds, merged, state, str(path), str(paths[0]))
        if merged.batches and state.batches and (None in merged.batches) != (None in state.batches):
            raise ConfigError(f"{path}: cannot merge a dump that has a step column with one that has none")
        merged.merge(state)
        sources.extend(more)
        screen = screen.merge(more_screen)
    return merged, sources, screen


def _check_sections(kinds: StateKinds, merged: StepStates[Any], state: StepStates[Any], path: str, first: str) -> None:
    """Refuse two states whose sections cannot merge (one written with ``--explain``, the other without; two
    ``--worst``), as their kinds say (``StateKinds.merge_refusal``)."""
    for key in dict.fromkeys([*merged.whole_dump, *state.whole_dump]):
        refusal = kinds.merge_refusal(key, merged.whole_dump.get(key), state.whole_dump.get(key), path, first)
        if refusal is not None:
            raise ConfigError(refusal)


def _check_not_twice(path: str | Path, identity: StateIdentity, states: dict[Any, str | Path]) -> None:
    """One state given twice (the same file, a hard link, a copy, a file touched since) would count its rows twice."""
    for key, how in ((identity.inode, "is the same file as"), (identity.digest, "holds the same state as")):
        if key is not None and key in states:
            raise InputError(
                f"{how} {states[key]}; merging it twice would count its rows twice: give each shard's state once",
                path=str(path),
            )
    states[identity.digest] = path
    if identity.inode is not None:
        states[identity.inode] = path


def _read_keys(read: dict[str, Any]) -> list[tuple[tuple, str]]:
    """What identifies a file a state read, and how that is said: its path, size and modification time, and (where
    the state recorded them) its device, inode and content fingerprint, the same for a hard link or a file touched
    since (a file rewritten in place with other rows has another fingerprint; a copy, another inode)."""
    keys: list[tuple[tuple, str]] = [
        (("path", read.get("path"), read.get("size"), read.get("mtime_ns")), "same file, size and modification time")
    ]
    if isinstance(read.get("fingerprint"), str) and isinstance(read.get("inode"), list):
        keys.append((("inode", *read["inode"], read["fingerprint"]), "the same file: device, inode and content"))
    return keys


def _check_not_merged(
    index: int, path: str | Path, sources: list[SourceInfo], seen: dict[tuple, tuple[int, str | Path, Any]]
) -> None:
    """A part read by two states (the ``index``-th given, and an earlier one) would be counted twice: refuse (a state
    of the whole file overlaps any part)."""
    for info in sources:
        for read in info.reads:
            for key, how in _read_keys(read):
                if key in seen and seen[key][0] != index:
                    _, other, name = seen[key]
                    also = f", which {other} also read" if name == read.get("path") else f"; {other} read {name}"
                    raise InputError(
                        f"read {read.get('path')}{also} ({how}); merging it twice would count its rows twice: give "
                        "each shard's state once",
                        path=str(path),
                    )
                seen[key] = (index, path, read.get("path"))


def _with_identity(info: SourceInfo) -> dict[str, Any]:
    """A source as a state saves it: each local file read also by device, inode and a fingerprint of its content
    (``_read_keys``)."""
    saved = asdict(replace(info, reads=[]))  # the reads, flat dicts, copied without asdict's deep walk
    saved["reads"] = [dict(read) for read in info.reads]
    for read in saved["reads"]:
        name = read.get("path")
        if isinstance(name, str) and "://" not in name and "fingerprint" not in read and os.path.isfile(name):
            where = os.stat(name)
            read["inode"] = [where.st_dev, where.st_ino]
            read["fingerprint"] = content_fingerprint(name)
    return saved


FINGERPRINT_BLOCK = 64 << 10
FINGERPRINT_BLOCKS = 16
"""A file of up to ``FINGERPRINT_BLOCK * FINGERPRINT_BLOCKS`` bytes is fingerprinted whole; a larger one by that many
blocks spread evenly from its first byte to its last (a dump is read whole anyway; this adds at most 1 MiB)."""


def content_fingerprint(path: str) -> str:
    """A digest of a file's size and content (all of it, or evenly spread blocks of a large one)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        digest.update(str(size).encode())
        if size <= FINGERPRINT_BLOCK * FINGERPRINT_BLOCKS:
            digest.update(handle.read())
        else:
            last = size - FINGERPRINT_BLOCK
            for k in range(FINGERPRINT_BLOCKS):
                handle.seek(last * k // (FINGERPRINT_BLOCKS - 1))
                digest.update(handle.read(FINGERPRINT_BLOCK))
    return digest.hexdigest()[:32]


def combined_info(sources: list[SourceInfo]) -> SourceInfo:
    """One description of several inputs: their paths, and the columns and metadata they agree on."""
    if len(sources) == 1:
        return sources[0]
    paths = [s.path for s in sources]
    path = ", ".join(paths) if len(paths) <= 3 else f"{paths[0]} and {len(paths) - 1} more"
    formats = sorted({s.format for s in sources})
    first = sources[0]
    metadata = {k: v for k, v in first.metadata.items() if all(s.metadata.get(k) == v for s in sources)}
    columns = first.columns if all(s.columns == first.columns for s in sources) else {}
    dtypes = first.dtypes if all(s.dtypes == first.dtypes for s in sources) else {}
    rows = [s.total_rows for s in sources]
    return SourceInfo(
        path=path,
        format="+".join(formats),
        columns=columns,
        dtypes=dtypes,
        metadata=metadata,
        total_rows=None if None in rows else sum(r for r in rows if r is not None),
        files=sum(s.files for s in sources),
        step_source=first.step_source if all(s.step_source == first.step_source for s in sources) else "",
        reads=[read for s in sources for read in s.reads],
    )


def _describe(config: CorrectionConfig) -> str:
    return ", ".join(f"{k}={v}" for k, v in config.to_dict().items())


def encode_state(value: Any) -> Any:
    """A ``state_dict`` (or part of one) as a state file holds it: non-finite floats as strings."""
    return _encode(value)


def decode_state(value: Any) -> Any:
    """``encode_state``'s inverse: the strings ``nan``, ``inf`` and ``-inf`` back to floats."""
    return _decode(value)


def _encode(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if value != value else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_encode(v) for v in value]
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, str) and value in ("nan", "inf", "-inf"):
        return float(value)
    if isinstance(value, dict):
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value
