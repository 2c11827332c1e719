"""Library entry points. Nothing here imports typer or rich."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from rcdiag import __version__
from rcdiag.backend import Backend, NumpyBackend, get_backend
from rcdiag.config import CorrectionConfig
from rcdiag.engine import Engine, EngineState
from rcdiag.errors import ConfigError
from rcdiag.health import evaluate
from rcdiag.io import DEFAULT_CHUNK_TOKENS, Chunk, ColumnMap, open_dump, prefetch
from rcdiag.io.base import Source, SourceInfo
from rcdiag.report import InputFacts, Report, StepReport


def analyze(
    path: str | Path,
    config: CorrectionConfig | None = None,
    *,
    device: str | Backend = "cpu",
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    columns: ColumnMap | None = None,
    workers: int = 1,
    save_state: str | Path | None = None,
) -> Report:
    """Run verl's rollout correction over a dump and return the report.

    Args:
        path: the dump (canonical Parquet: ``old_log_prob``, ``rollout_log_prob``, optional ``response_mask``
            and ``step``).
        config: verl's ``rollout_correction`` fields; default: metrics only (verl's YAML default).
        device: ``cpu`` (numpy), ``cuda`` / ``cuda:N`` (torch) or ``auto``; or a ``Backend``.
        chunk_tokens: read about this many tokens at a time (memory is bounded by it; results do not
            depend on it).
        columns: column names when they differ from the canonical ones.
        workers: split the file's row groups among this many processes (CPU only); same result.
        save_state: also write the accumulated state here, for ``merge_states`` (scale-out over shards).

    Raises:
        ConfigError: invalid configuration (the message is verl's, where verl has one).
        InputError: unreadable file or invalid values (the message names file, row and column).

    Example:
        >>> from rcdiag import analyze, preset
        >>> report = analyze("sample_data/healthy.parquet", preset("decoupled_geo_rs"))  # doctest: +SKIP
        >>> report.metrics["rollout_corr/kl"]  # doctest: +SKIP
    """
    state, info, device_name = accumulate(
        path, config, device=device, chunk_tokens=chunk_tokens, columns=columns, workers=workers, save_state=save_state
    )
    return build_report(state, info, device_name)


def accumulate(
    path: str | Path,
    config: CorrectionConfig | None = None,
    *,
    device: str | Backend = "cpu",
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    columns: ColumnMap | None = None,
    workers: int = 1,
    save_state: str | Path | None = None,
) -> tuple[EngineState, SourceInfo, str]:
    """Read a dump into an ``EngineState`` (the mergeable accumulators), without computing the report.

    With ``workers > 1`` the file's row groups are split among that many processes, whose states are merged:
    the result is the same as one process reading everything. Returns the state, what was read, and the
    device used.
    """
    resolved = (config or CorrectionConfig()).resolve()
    if chunk_tokens < 1:
        raise ConfigError(f"chunk_tokens must be a positive number of tokens, got {chunk_tokens}.")
    if workers < 1:
        raise ConfigError(f"workers must be at least 1, got {workers}.")
    backend = device if isinstance(device, Backend) else get_backend(device)
    source = open_dump(path, columns)
    partitions = source.partitions(workers) if workers > 1 else []
    if len(partitions) > 1:
        if not isinstance(backend, NumpyBackend):
            raise ConfigError("--workers runs several CPU processes; use it with --device cpu.")
        state = _accumulate_in_processes(source, resolved.config, partitions, chunk_tokens)
    else:
        state = Engine(resolved, backend).run(prefetch(source.chunks(chunk_tokens)))
    if save_state is not None:
        from rcdiag.state import save_state as write_state

        write_state(save_state, state, [source.info])
    return state, source.info, backend.name


def merge_states(paths: list[str | Path]) -> Report:
    """The report of one run over every shard whose state files are given (``analyze --save-state``)."""
    from rcdiag.state import combined_info, merge_state_files

    state, sources = merge_state_files(paths)
    return build_report(state, combined_info(sources), "merged")


def _accumulate_in_processes(
    source: Source, config: CorrectionConfig, partitions: list[Any], chunk_tokens: int
) -> EngineState:
    context = multiprocessing.get_context("spawn")  # the parent holds Arrow threads: fork is not safe
    columns = getattr(source, "columns", None)
    with ProcessPoolExecutor(max_workers=len(partitions), mp_context=context) as pool:
        futures = [
            pool.submit(_accumulate_part, source.info.path, columns, part, config, chunk_tokens) for part in partitions
        ]
        states = [future.result() for future in futures]
    resolved = config.resolve()
    merged = EngineState(resolved)
    for saved in states:
        merged.merge(EngineState.from_state_dict(resolved, saved))
    return merged


def _accumulate_part(
    path: str, columns: ColumnMap | None, part: Any, config: CorrectionConfig, chunk_tokens: int
) -> dict:
    source = open_dump(path, columns)
    engine = Engine(config.resolve())
    return engine.run(prefetch(source.chunks(chunk_tokens, part=part))).state_dict()


def analyze_chunks(
    chunks: Iterable[Chunk], config: CorrectionConfig | None = None, *, device: str | Backend = "cpu"
) -> Report:
    """Like ``analyze`` but over chunks you built yourself (e.g. from tensors in a training loop)."""
    resolved = (config or CorrectionConfig()).resolve()
    backend = device if isinstance(device, Backend) else get_backend(device)
    state = Engine(resolved, backend).run(chunks)
    return build_report(state, SourceInfo(path="<memory>", format="chunks"), backend.name)


def build_report(state: EngineState, info: SourceInfo, device: str) -> Report:
    """Compute every batch, the all-steps view and the findings."""
    has_steps = any(step is not None for step in state.batches)
    per_step = sorted(
        ((step, batch.compute()) for step, batch in state.batches.items()),
        key=lambda item: (item[0] is None, item[0] or 0),
    )
    pooled = per_step[0][1] if not has_steps and per_step else state.pooled().compute()
    findings = evaluate(per_step if per_step else [(None, pooled)], state.resolved)
    steps = tuple(
        StepReport(int(step), result.rows, result.valid_tokens, result.metrics, result.extras)
        for step, result in per_step
        if step is not None
    )
    facts = InputFacts(
        path=info.path,
        format=info.format,
        rows=state.rows,
        tokens=state.tokens,
        valid_tokens=state.valid_tokens,
        empty_rows=pooled.empty_rows,
        steps=len(steps),
        skipped_rows=0,
        columns=dict(info.columns),
        dtypes=dict(info.dtypes),
        metadata=dict(info.metadata),
    )
    return Report(
        config=state.resolved.config.to_dict(),
        input=facts,
        metrics=pooled.metrics,
        extras=pooled.extras,
        steps=steps,
        findings=tuple(findings),
        device=device,
        version=__version__,
    )
