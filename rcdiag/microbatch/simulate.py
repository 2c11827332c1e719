"""What verl computes per micro-batch, and whether it crashes there (reference sections 10 and 11).

Two paths run per micro-batch, each with the accumulators the whole-batch report uses (one implementation of
every formula):

* **legacy actor** (verl <= 0.7.1, decoupled mode): the 13 off-policy metrics on the micro-batch's
  RS-modified mask; ``assert response_mask.any()`` fails on a micro-batch whose tokens RS all rejected. The
  values were reduced over all micro-batches (every mini-batch and rank) by key name: np.max for keys
  containing "max", np.min for "min", the mean otherwise.
* **bypass mode**: the whole pipeline on the micro-batch's original mask; verl raises ``ValueError`` on a
  micro-batch without a valid token (and ``ZeroDivisionError`` when IcePop zeroes all its weights). From v0.8.0
  the values are averaged over the micro-batches and ranks of each mini-batch, then reduced over mini-batches by
  key name; v0.7.1 reduced all micro-batches by key name at once.

Offline, the dump's ``old_log_prob`` stands for the actor's current log-probs in both paths (equal on the first
micro-batch of an on-policy update).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rcdiag.catalogue.metrics import PREFIX
from rcdiag.core.limits import finite
from rcdiag.metrics.backend import NumpyBackend
from rcdiag.metrics.base import MetricValue, verl_float
from rcdiag.metrics.batch import BatchMetrics, BatchResult
from rcdiag.metrics.block import Block
from rcdiag.metrics.offpolicy import OffPolicyMetrics
from rcdiag.metrics.rejection import rejected_tokens
from rcdiag.microbatch.partition import SplitRefusedError
from rcdiag.microbatch.plan import MicroBatchSettings, plan
from rcdiag.microbatch.rows import StepRows, take
from rcdiag.records.report import BYPASS_VALUEERROR, MicroBatch, StepMicroBatches
from rcdiag.settings.correction import ResolvedConfig


def reduce_by_name(key: str, values: list[float]) -> float:
    """verl's ``reduce_metrics``: np.max for a key containing "max", np.min for "min", np.mean otherwise."""
    if "max" in key:
        return float(np.max(values))
    if "min" in key:
        return float(np.min(values))
    return float(np.mean(values))


def simulate_step(
    step: int | None, rows: StepRows, resolved: ResolvedConfig, settings: MicroBatchSettings
) -> StepMicroBatches:
    """Split one step as verl does and run both paths on every micro-batch."""
    try:
        layout = plan(settings, resolved.version, rows.response_lengths, rows.widths)
    except SplitRefusedError as exc:
        return StepMicroBatches(step, str(exc), (), None, None)
    with np.errstate(all="ignore"):
        whole = Block(NumpyBackend(), rows.old, rows.rollout, rows.valid_lengths)
        rejected = rejected_tokens(whole, resolved.rs_options)
    keep = None if rejected is None else ~np.asarray(rejected)
    kept_per_row = (
        rows.valid_lengths
        if keep is None
        else np.add.reduceat(np.concatenate([keep, [False]]).astype(np.int64), rows.offsets[:-1])
        * (rows.valid_lengths > 0)
    )
    legacy: list[dict[str, Any]] = []  # per micro-batch, of every mini-batch and rank
    bypass: list[list[dict[str, Any]]] = []  # per mini-batch, per micro-batch of every rank
    minis = []
    for ranks in layout.mini_batches:
        bypass.append([])
        built = []
        for micros in ranks:
            out = []
            for indices in micros:
                micro, legacy_values, bypass_values = _run(rows, indices, resolved, keep, kept_per_row)
                legacy += [legacy_values] if legacy_values is not None else []
                bypass[-1] += [bypass_values] if bypass_values is not None else []
                out.append(micro)
            built.append(tuple(out))
        minis.append(tuple(built))
    result = StepMicroBatches(step, None, tuple(minis), None, None)
    legacy_metrics = None if result.legacy_crashes else _flat(legacy)
    if result.bypass_crashes:
        bypass_metrics = None
    elif resolved.version.legacy_actor:
        bypass_metrics = _flat([values for mini in bypass for values in mini])
    else:  # Metric(MEAN).aggregate_dp: the mean over ranks and micro-batches of each mini-batch
        bypass_metrics = _flat([{k: float(np.mean([v[k] for v in mini])) for k in mini[0]} for mini in bypass])
    return StepMicroBatches(step, None, tuple(minis), legacy_metrics, bypass_metrics)


def _run(
    rows: StepRows, indices: list[int], resolved: ResolvedConfig, keep: np.ndarray | None, kept_per_row: np.ndarray
) -> tuple[MicroBatch, dict[str, Any] | None, dict[str, Any] | None]:
    """One micro-batch: its record, the legacy actor's values and bypass mode's (``None`` where each crashes)."""
    backend = NumpyBackend()
    batch = BatchMetrics(resolved)
    with np.errstate(all="ignore"):
        batch.update(Block(backend, *take(rows, indices)))
        result = batch.compute()
    crash = _bypass_crash(result)
    bypass = None if crash is not None else {k: v for k, v in result.raw.items() if k.startswith(PREFIX)}
    after = int(kept_per_row[indices].sum())
    legacy = None
    if after:
        offpolicy = OffPolicyMetrics()
        with np.errstate(all="ignore"):
            offpolicy.update(Block(backend, *take(rows, indices, keep)))
            values, _ = offpolicy.compute()
        legacy = {PREFIX + key: verl_float(value) for key, value in values.items()}
    micro = MicroBatch(tuple(indices), int(rows.valid_lengths[indices].sum()), after, crash)
    return micro, legacy, bypass


def _bypass_crash(result: BatchResult) -> str | None:
    for crash in result.crashes:
        if crash.code == "verl_crash_empty_batch":
            return BYPASS_VALUEERROR
        if crash.code == "verl_crash_ess_zero_division":
            return "ZeroDivisionError: float division by zero (IcePop zeroed every IS weight of the micro-batch)"
    return None


def _flat(dicts: list[dict[str, Any]]) -> dict[str, MetricValue] | None:
    """Per-micro-batch (or per-mini-batch) values reduced by key name; non-finite values as ``None``."""
    if not dicts:
        return None
    out: dict[str, MetricValue] = {}
    for key in dicts[0]:
        column = [d[key] for d in dicts]
        value = None if any(x is None for x in column) else reduce_by_name(key, column)
        out[key] = finite(value)
    return out
