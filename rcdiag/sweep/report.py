"""Frozen sweep records: one row per (option, threshold), recommendations, presets ranked, and crash findings."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from rcdiag._version import __version__
from rcdiag.catalogue.metrics import PREFIX
from rcdiag.config import PRESETS, preset
from rcdiag.errors import ConfigError
from rcdiag.metrics.base import MetricValue, VerlCrash
from rcdiag.report import Finding, InputFacts
from rcdiag.versions import DEFAULT_VERSION

SWEEP_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class SweepRow:
    """One option at one threshold: verl's metrics for that single option, pooled and per step."""

    option: str
    threshold: str
    metrics: dict[str, MetricValue]
    steps: tuple[tuple[int, dict[str, MetricValue]], ...]
    crashes: tuple[VerlCrash, ...]
    crash_steps: tuple[int, ...] = ()

    @property
    def token_reject(self) -> MetricValue:
        """Share of valid tokens rejected (RS) or truncated / zeroed (IS: beyond the bounds)."""
        if self.option.startswith("is_"):
            if self.option == "is_token":
                return _sum(self.metrics, "rollout_is_ratio_fraction_high", "rollout_is_ratio_fraction_low", self)
            return None
        return self.metrics.get(f"{PREFIX}rollout_rs_{self.option}_masked_fraction")

    @property
    def seq_reject(self) -> MetricValue:
        """Share of responses with a rejected token (RS), or beyond the bounds (sequence IS)."""
        if self.option == "is_sequence":
            return _sum(self.metrics, "rollout_is_ratio_fraction_high", "rollout_is_ratio_fraction_low", self)
        if self.option.startswith("is_"):
            return None
        return self.metrics.get(f"{PREFIX}rollout_rs_{self.option}_seq_masked_fraction")

    @property
    def ess(self) -> MetricValue:
        return self.metrics.get(PREFIX + "rollout_is_eff_sample_size")

    def to_dict(self) -> dict[str, Any]:
        return {
            "option": self.option,
            "threshold": self.threshold,
            "metrics": dict(self.metrics),
            "steps": [{"step": step, "metrics": dict(metrics)} for step, metrics in self.steps],
        }


def _sum(metrics: dict[str, MetricValue], high: str, low: str, row: SweepRow) -> MetricValue:
    """IS: TIS truncates above U only (the high share); IcePop zeroes both sides."""
    hi, lo = metrics.get(PREFIX + high), metrics.get(PREFIX + low)
    if hi is None:
        return None
    icepop = "_" in row.threshold
    return hi + (lo or 0.0) if icepop else hi


@dataclass(frozen=True)
class Recommendation:
    """The threshold of one option whose rejected share comes closest to the target without exceeding it."""

    option: str
    threshold: str | None
    """``None`` when the target cannot be met (``unreachable`` says why)."""
    token_reject: float | None
    seq_reject: float | None
    share: str
    """Which share was targeted: ``token`` or ``response``."""
    yaml: str
    warnings: tuple[str, ...] = ()
    """What to know before pasting it: beyond verl's clamp, outside verl's typical range."""
    unreachable: str | None = None
    """Why no threshold meets the target on this dump (too few responses or tokens)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "option": self.option,
            "threshold": self.threshold,
            "token_reject": self.token_reject,
            "seq_reject": self.seq_reject,
            "warnings": list(self.warnings),
            "unreachable": self.unreachable,
        }


@dataclass(frozen=True)
class PresetRank:
    """One of verl's presets: what it would reject and the ESS it would leave on this dump."""

    name: str
    token_reject: float
    seq_reject: float
    ess: float | None
    """``None`` without IS (every weight is 1)."""
    meets_min_ess: bool

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class SweepReport:
    """Everything ``rcdiag sweep`` prints."""

    rows: tuple[SweepRow, ...]
    recommendations: tuple[Recommendation, ...]
    target_reject: float | None
    presets: tuple[PresetRank, ...]
    min_ess: float
    input: InputFacts
    findings: tuple[Finding, ...]
    device: str
    version: str = __version__
    verl_version: str = DEFAULT_VERSION
    """The verl release whose semantics every row follows."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SWEEP_SCHEMA_VERSION,
            "rcdiag_version": self.version,
            "verl_version": self.verl_version,
            "device": self.device,
            "sweep": [row.to_dict() for row in self.rows],
            "recommendations": [r.to_dict() for r in self.recommendations],
            "target_reject": self.target_reject,
            "presets": [p.to_dict() for p in self.presets],
            "min_ess": self.min_ess,
            "input": self.input.to_dict(),
            "findings": [f.to_dict() for f in self.findings],
        }


def rank_presets(rows: list[SweepRow], min_ess: float, version: str = DEFAULT_VERSION) -> list[PresetRank]:
    """verl ``version``'s presets whose IS and RS settings are all rows of this sweep, ranked by the token share
    they reject (then the response share), the ESS they leave (higher first) breaking ties; presets below
    ``min_ess`` last."""
    by_key = {(row.option, row.threshold): row for row in rows}
    ranked = []
    for name in PRESETS:
        try:
            config = preset(name, version)
        except ConfigError:  # a preset this release did not have
            continue
        is_row = rs_row = None
        if config.rollout_is is not None:
            is_row = _lookup(by_key, f"is_{config.rollout_is}", config.rollout_is_threshold)
            if is_row is None:
                continue
        if config.rollout_rs is not None:
            rs_row = _lookup(by_key, config.rollout_rs, config.rollout_rs_threshold)
            if rs_row is None:
                continue
        ess = is_row.ess if is_row is not None else None
        token = rs_row.token_reject if rs_row is not None else 0.0
        seq = rs_row.seq_reject if rs_row is not None else 0.0
        if token is None or seq is None:
            continue
        meets = ess is None or ess >= min_ess
        ranked.append(PresetRank(name, token, seq, ess, meets))
    ranked.sort(key=lambda p: (not p.meets_min_ess, p.token_reject, p.seq_reject, -(1.0 if p.ess is None else p.ess)))
    return ranked


def _lookup(by_key: dict[tuple[str, str], SweepRow], option: str, spec: Any) -> SweepRow | None:
    """The row of an option at a preset's threshold, matching specs by value (``2`` is ``2.0``)."""
    from rcdiag.sweep.grid import resolve

    wanted = resolve(option, str(spec))
    for (row_option, row_spec), row in by_key.items():
        if row_option == option and resolve(option, row_spec) == dataclasses.replace(wanted, spec=row_spec):
            return row
    return None
