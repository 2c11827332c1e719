"""Turning the flags every engine command shares into library arguments: a ``CorrectionConfig`` (preset first,
flags on top) and the keyword arguments that say how to read a dump."""

from __future__ import annotations

from typing import Any

from rcdiag.cli.options import BadRowPolicy, ISLevel
from rcdiag.config import CorrectionConfig, preset


def build_config(
    *,
    preset_name: str | None,
    is_level: ISLevel | None,
    is_threshold: str | None,
    rs: str | None,
    rs_threshold: str | None,
    batch_normalize: bool | None,
    base: CorrectionConfig | None = None,
) -> CorrectionConfig:
    """The configuration the flags describe, on top of ``--preset``, else ``base`` (a rules file's ``[engine]``),
    else verl's default; raises ``ConfigError`` for an unknown preset."""
    config = preset(preset_name) if preset_name else base or CorrectionConfig()
    changes: dict[str, Any] = {}
    if is_level is not None:
        changes["rollout_is"] = None if is_level is ISLevel.none else is_level.value
    if is_threshold is not None:
        changes["rollout_is_threshold"] = is_threshold
    if rs is not None:
        changes["rollout_rs"] = None if rs.strip().lower() == "none" else rs
    if rs_threshold is not None:
        changes["rollout_rs_threshold"] = rs_threshold
    if batch_normalize is not None:
        changes["rollout_is_batch_normalize"] = batch_normalize
    return config.replace(**changes)


def read_options(
    *,
    device: str,
    chunk_tokens: int,
    old_col: str | None,
    rollout_col: str | None,
    mask_col: str | None,
    step_col: str | None,
    seq_col: str | None,
    on_bad_row: BadRowPolicy,
    workers: int,
    id_col: str | None = None,
) -> dict[str, Any]:
    """The keyword arguments of ``rcdiag.analyze`` (and ``compare``, ``check``) that say how to read a dump."""
    from rcdiag.io import ColumnMap

    return {
        "device": device,
        "chunk_tokens": chunk_tokens,
        "columns": ColumnMap(old=old_col, rollout=rollout_col, mask=mask_col, step=step_col, seq=seq_col, id=id_col),
        "on_bad_row": on_bad_row.value,
        "workers": workers,
    }
