"""Saved engine states: run shards anywhere, merge the states, get the report of one run over all of them.

A state file is JSON: the configuration, what was read (paths, formats, columns, metadata) and every step's
accumulator state (float64 sums, extremes, moments). Floats are written with ``repr`` precision, so a round trip
is exact; non-finite values are written as the strings ``"inf"``, ``"-inf"`` and ``"nan"``. Merging refuses
states computed with a configuration that computes something else. The file records the signature of the
accumulators' declared states (``state_layout``) and the rcdiag version that wrote it: a file written under
another layout is refused, naming that version.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rcdiag._version import __version__
from rcdiag.config import CorrectionConfig
from rcdiag.engine import EngineState
from rcdiag.errors import ConfigError, InputError
from rcdiag.io.base import SourceInfo
from rcdiag.metrics.batch import state_layout
from rcdiag.validate import ScreenStats

STATE_FORMAT = "rcdiag-state"
STATE_VERSION = 1


def save_state(path: str | Path, state: EngineState, sources: list[SourceInfo], screen: ScreenStats) -> None:
    """Write a state file atomically (a reader never sees a half-written file), locally or to object storage."""
    payload = {
        "format": STATE_FORMAT,
        "version": STATE_VERSION,
        "kind": state_kind_of(state),
        "rcdiag_version": __version__,
        "layout": state_layout(),
        "config": state.resolved.config.to_dict(),
        "sources": [asdict(info) for info in sources],
        "screen": screen.to_dict(),
        "state": _encode(state.state_dict()),
    }
    from rcdiag.io import storage

    text = storage.local_path(str(path))
    if storage.is_remote(text):  # one upload: the object appears whole or not at all
        storage.write_bytes(storage.parse(text), json.dumps(payload).encode())
        return
    from rcdiag.outputs import STATE_MODE, write_file

    write_file(text, json.dumps(payload).encode(), mode=STATE_MODE)  # whole or not at all, owner-only


def load_state(path: str | Path) -> tuple[EngineState, list[SourceInfo], ScreenStats]:
    """Read a state file; any problem is an ``InputError`` naming the file."""
    from rcdiag.io.paths import read_bytes

    name = str(path)
    try:
        payload = json.loads(read_bytes(name).decode("utf-8"))
    except FileNotFoundError:
        raise InputError("file not found", path=name) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"is not an rcdiag state file ({exc})", path=name) from None
    if not isinstance(payload, dict) or payload.get("format") != STATE_FORMAT:
        raise InputError("is not an rcdiag state file (write one with 'rcdiag analyze ... --save-state')", path=name)
    writer = f"rcdiag {payload.get('rcdiag_version', '(unknown version)')}"
    if payload.get("version") != STATE_VERSION:
        raise InputError(
            f"has state version {payload.get('version')} (written by {writer}); rcdiag {__version__} reads "
            f"version {STATE_VERSION}: re-run 'rcdiag analyze ... --save-state' with this rcdiag",
            path=name,
        )
    if payload.get("layout") != state_layout():
        raise InputError(
            f"was written by {writer}, whose accumulators hold a different state (layout "
            f"{payload.get('layout') or 'not recorded'}; rcdiag {__version__} has {state_layout()}), so it cannot "
            "be loaded or merged: re-run 'rcdiag analyze ... --save-state' with this rcdiag",
            path=name,
        )
    try:
        resolved = CorrectionConfig(**payload["config"]).resolve()
        state = _state_class(payload.get("kind", "analyze")).from_state_dict(resolved, _decode(payload["state"]))
        sources = [SourceInfo(**info) for info in payload["sources"]]
        screen = ScreenStats.from_dict(payload["screen"])
    except ConfigError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"holds a damaged state ({exc})", path=name) from None
    return state, sources, screen


def state_kind_of(state: EngineState) -> str:
    """``"sweep"`` for a sweep's state (``rcdiag sweep --save-state``), ``"analyze"`` otherwise."""
    return "sweep" if hasattr(state, "grid") else "analyze"


def state_kind(path: str | Path) -> str:
    """The kind of a state file (a path or URL), without loading its state (``"analyze"`` for files without one;
    a directory, prefix or glob: its first state file's)."""
    from rcdiag.io.paths import read_bytes, state_files

    try:
        payload = json.loads(read_bytes(state_files(str(path))[0]).decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, InputError):
        return "analyze"  # load_state gives the precise error
    return payload.get("kind", "analyze") if isinstance(payload, dict) else "analyze"


def _state_class(kind: str) -> type[EngineState]:
    if kind == "sweep":
        from rcdiag.sweep.batch import SweepState

        return SweepState
    return EngineState


def merge_state_files(paths: list[str | Path]) -> tuple[EngineState, list[SourceInfo], ScreenStats]:
    """Load and merge state files; they must compute the same metrics."""
    from rcdiag.io.paths import state_files

    paths = [file for path in paths for file in state_files(str(path))]
    if not paths:
        raise ConfigError("no state files to merge")
    merged, sources, screen = load_state(paths[0])
    seen = {_read_key(read): paths[0] for info in sources for read in info.reads}
    for path in paths[1:]:
        state, more, more_screen = load_state(path)
        _check_not_merged(path, more, seen)
        if not merged.resolved.same_computation(state.resolved):
            raise ConfigError(
                f"{path} was computed with a different configuration ({_describe(state.resolved.config)}) than "
                f"{paths[0]} ({_describe(merged.resolved.config)}); states merge only under the same configuration"
            )
        if state_kind_of(state) != state_kind_of(merged):
            kinds = state_kind_of(state), state_kind_of(merged)
            raise ConfigError(f"{path} holds a {kinds[0]} state and {paths[0]} a {kinds[1]} one; they do not merge")
        if (merged.explain is None) != (state.explain is None):
            raise ConfigError(
                f"{path} was {'' if state.explain is not None else 'not '}analysed with --explain but {paths[0]} "
                f"was{'' if merged.explain is not None else ' not'}; merge states written with the same flags"
            )
        if merged.explain is not None and state.explain is not None and merged.explain.worst.n != state.explain.worst.n:
            raise ConfigError(
                f"{path} keeps {state.explain.worst.n} worst responses but {paths[0]} keeps {merged.explain.worst.n}; "
                "use the same --worst"
            )
        if merged.batches and state.batches and (None in merged.batches) != (None in state.batches):
            raise ConfigError(f"{path}: cannot merge a dump that has a step column with one that has none")
        merged.merge(state)
        sources.extend(more)
        screen = screen.merge(more_screen)
    return merged, sources, screen


def _read_key(read: dict[str, Any]) -> tuple:
    return read.get("path"), read.get("size"), read.get("mtime_ns")


def _check_not_merged(path: str | Path, sources: list[SourceInfo], seen: dict[tuple, str | Path]) -> None:
    """A part read by two states would be counted twice: refuse (a state of the whole file overlaps any part)."""
    for info in sources:
        for read in info.reads:
            key = _read_key(read)
            if key in seen:
                raise InputError(
                    f"read {key[0]}, which {seen[key]} also read (same file, size and modification time); merging "
                    "it twice would count its rows twice: give each shard's state once",
                    path=str(path),
                )
            seen[key] = path


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
