"""Library entry points. Nothing here imports typer or rich."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from rcdiag import __version__
from rcdiag.backend import Backend, get_backend
from rcdiag.config import CorrectionConfig
from rcdiag.engine import Engine, EngineState
from rcdiag.health import evaluate
from rcdiag.io import DEFAULT_CHUNK_TOKENS, Chunk, ColumnMap, open_dump, prefetch
from rcdiag.io.base import SourceInfo
from rcdiag.report import InputFacts, Report, StepReport


def analyze(
    path: str | Path,
    config: CorrectionConfig | None = None,
    *,
    device: str | Backend = "cpu",
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    columns: ColumnMap | None = None,
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

    Raises:
        ConfigError: invalid configuration (the message is verl's, where verl has one).
        InputError: unreadable file or invalid values (the message names file, row and column).

    Example:
        >>> from rcdiag import analyze, preset
        >>> report = analyze("sample_data/healthy.parquet", preset("decoupled_geo_rs"))  # doctest: +SKIP
        >>> report.metrics["rollout_corr/kl"]  # doctest: +SKIP
    """
    resolved = (config or CorrectionConfig()).resolve()
    if chunk_tokens < 1:
        from rcdiag.errors import ConfigError

        raise ConfigError(f"chunk_tokens must be a positive number of tokens, got {chunk_tokens}.")
    backend = device if isinstance(device, Backend) else get_backend(device)
    source = open_dump(path, columns)
    state = Engine(resolved, backend).run(prefetch(source.chunks(chunk_tokens)))
    return build_report(state, source.info, backend.name)


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
