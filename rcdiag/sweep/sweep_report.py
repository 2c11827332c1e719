"""Frozen sweep records: one row per (option, threshold), recommendations, presets ranked, and crash findings."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from rcdiag._version import __version__
from rcdiag.catalogue.keys import Key
from rcdiag.catalogue.metrics import rs_key
from rcdiag.metrics.base import MetricValue, VerlCrash
from rcdiag.records.report import Finding, FrameworkSetting, InputFacts, Prescription, Verdict
from rcdiag.runtime.errors import ConfigError
from rcdiag.settings.correction import PRESETS, ISSpec, preset, refuse_router_replay
from rcdiag.settings.versions import DEFAULT_VERSION

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
    is_spec: ISSpec | None = None
    """What verl's parser makes of an IS option's threshold (IcePop or TIS, its bounds); ``None`` for RS. Not in
    the JSON (``threshold`` says it as written)."""

    @property
    def icepop(self) -> bool:
        """An IcePop IS band (weights outside [lower, upper] zeroed) rather than TIS or RS."""
        return self.is_spec is not None and self.is_spec.icepop

    @property
    def token_reject(self) -> MetricValue:
        """Share of valid tokens rejected (RS) or truncated / zeroed (IS: beyond the bounds)."""
        if self.option.startswith("is_"):
            if self.option == "is_token":
                return _sum(self.metrics, Key.ROLLOUT_IS_RATIO_FRACTION_HIGH, Key.ROLLOUT_IS_RATIO_FRACTION_LOW, self)
            return None
        return self.metrics.get(rs_key(self.option, "masked_fraction"))

    @property
    def seq_reject(self) -> MetricValue:
        """Share of responses with a rejected token (RS), or beyond the bounds (sequence IS)."""
        if self.option == "is_sequence":
            return _sum(self.metrics, Key.ROLLOUT_IS_RATIO_FRACTION_HIGH, Key.ROLLOUT_IS_RATIO_FRACTION_LOW, self)
        if self.option.startswith("is_"):
            return None
        return self.metrics.get(rs_key(self.option, "seq_masked_fraction"))

    @property
    def ess(self) -> MetricValue:
        return self.metrics.get(Key.ROLLOUT_IS_EFF_SAMPLE_SIZE)

    def to_dict(self) -> dict[str, Any]:
        return {
            "option": self.option,
            "threshold": self.threshold,
            "metrics": dict(self.metrics),
            "steps": [{"step": step, "metrics": dict(metrics)} for step, metrics in self.steps],
        }


def _sum(metrics: dict[str, MetricValue], high: str, low: str, row: SweepRow) -> MetricValue:
    """IS: TIS truncates above U only (the high share); IcePop zeroes both sides."""
    hi, lo = metrics.get(high), metrics.get(low)
    if hi is None:
        return None
    return hi + (lo or 0.0) if row.icepop else hi


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
    not_config: str | None = None
    """Why this threshold is no setting to paste (it rejects or truncates nothing, being beyond verl's clamp, or it
    sits at a float32 limit); ``None`` when it is. Such a recommendation has no ``yaml``: renderers never offer it
    as config."""
    nearest: GridNeighbour | None = None
    """Where the recommendation sits on the swept grid (set by ``place_on_grid``): the threshold is an exact value
    computed for the target, usually not one of the grid's points."""
    framework: FrameworkSetting | None = None
    """Under ``sweep --as NAME``: this setting in that framework's settings, measured under its semantics (``None``
    for a recommendation that is no setting to paste)."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "option": self.option,
            "threshold": self.threshold,
            "token_reject": self.token_reject,
            "seq_reject": self.seq_reject,
            "warnings": list(self.warnings),
            "unreachable": self.unreachable,
            "not_config": self.not_config,
            "on_grid": None if self.nearest is None else self.nearest.on_grid,
            "nearest_grid_threshold": None if self.nearest is None else self.nearest.threshold,
            "nearest_grid_share": None if self.nearest is None else self.nearest.share,
        }
        if self.framework is not None:  # only under --as NAME: a plain sweep's JSON is unchanged
            out["framework"] = self.framework.to_dict()
        return out


RS_SHARES = ("tokens rejected", "responses rejected")
"""What an RS recommendation's ``token_reject`` and ``seq_reject`` are, in every renderer's words."""
IS_SHARES = ("tokens under a truncated weight", "responses with a truncated weight")
"""The same two shares of an IS recommendation: TIS truncates weights, it never rejects a sample."""
WEIGHT_KIND = {"token": "token", "response": "sequence"}
"""The weights an IS recommendation's targeted share counts (``Recommendation.share`` -> token or sequence)."""
GRID_NOTE = (
    "The thresholds are exact values for the target, computed from the dump, not grid points unless marked 'on the "
    "grid'; the nearest grid point is the swept threshold whose share comes closest to the target (share in brackets)."
)
"""Said under the recommendations, by every renderer: what a threshold off the grid is."""


def weights_truncated(rec: Recommendation) -> str:
    """An IS recommendation's targeted share, as the share of weights it truncates."""
    share = rec.token_reject if rec.share == "token" else rec.seq_reject
    return "" if share is None else f"{share:.6g} of {WEIGHT_KIND[rec.share]} weights"


@dataclass(frozen=True)
class GridNeighbour:
    """The swept threshold whose targeted share comes closest to the target (among TIS thresholds for IS, which the
    recommendations truncate with), and whether the recommendation is that very threshold."""

    threshold: str
    share: float
    """Its targeted share (tokens or responses, as the recommendation's ``share``)."""
    on_grid: bool
    """The recommended threshold is this grid point (the same value, however written)."""


@dataclass(frozen=True)
class PresetRank:
    """One of verl's presets: what it would reject, the ESS it would leave and the share of IS weights it would
    truncate (or zero) on this dump, and where the ranking policy puts it (``tier``, ``note``)."""

    name: str
    token_reject: float
    seq_reject: float
    ess: float | None
    """``None`` without IS (every weight is 1)."""
    meets_min_ess: bool
    is_truncated_share: float | None = None
    """Share of IS weights beyond the bounds (truncated by TIS, zeroed by IcePop): tokens for token-level IS,
    responses for sequence-level IS; ``None`` without IS."""
    tier: int = 0
    """0: corrects without raising a finding; 1: applies no correction; 2: raises one of analyze's findings."""
    note: str = ""
    """Why it is not in tier 0."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


Correction = Literal["prescribed", "optional", "none", "not_a_remedy"]
"""What the verdict says of correcting this dump: ``correct`` prescribes one setting; ``healthy``: optional;
``identical``: nothing to correct; ``fix`` / ``broken``: no threshold is the remedy."""
NO_THRESHOLD_REMEDY = (
    "no threshold is the remedy: fix the engine, the data or the configuration first, then sweep again; the "
    "tables below only say what each threshold would do"
)
"""Said under a ``fix`` or ``broken`` verdict, before the tables."""
NOT_URGED = "what each would do, not a remedy"
"""How the recommendations are titled when no threshold is the remedy (``SweepAdvice.urges`` is false)."""


@dataclass(frozen=True)
class SweepAdvice:
    """The sweep's headline advice, agreeing with the verdict (the rule: ``rcdiag.sweep.advice.advise``)."""

    status: str
    """The verdict's status."""
    correction: Correction
    says: str
    """The sentence shown under the verdict, before the tables."""
    first: Prescription | None = None
    """The first recommendation: the verdict's prescription (``correct`` only)."""
    differs: str | None = None
    """Why the sweep's own recommendations or ranking differ from the prescription, said plainly."""

    @property
    def urges(self) -> bool:
        """Whether the recommendations are settings to use (no: under ``fix`` and ``broken``)."""
        return self.correction != "not_a_remedy"

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "correction": self.correction,
            "says": self.says,
            "first": None if self.first is None else self.first.to_dict(),
            "differs": self.differs,
        }


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
    framework: str | None = None
    """Under ``--as NAME``: the framework whose settings the recommendations are also given in (``TRL 1.16.0``)."""
    verdict: Verdict | None = None
    """``rcdiag analyze``'s verdict on the same dump, from the same facts (``None``: a report built without it)."""
    advice: SweepAdvice | None = None
    """What the sweep advises, agreeing with ``verdict`` (``rcdiag.sweep.advice``)."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema_version": SWEEP_SCHEMA_VERSION,
            "rcdiag_version": self.version,
            "verl_version": self.verl_version,
            "device": self.device,
            "verdict": None if self.verdict is None else self.verdict.to_dict(),
            "advice": None if self.advice is None else self.advice.to_dict(),
            "sweep": [row.to_dict() for row in self.rows],
            "recommendations": [r.to_dict() for r in self.recommendations],
            "target_reject": self.target_reject,
            "presets": [p.to_dict() for p in self.presets],
            "min_ess": self.min_ess,
            "input": self.input.to_dict(),
            "findings": [f.to_dict() for f in self.findings],
        }
        if self.framework is not None:
            out["framework"] = self.framework
        return out


ESS_FLOOR = 0.3
"""verl's ESS warning (is_ess_low): a preset leaving less raises it."""
SATURATED_SHARE = 0.9
"""is_saturated: from this share of truncated weights IS multiplies every sample by the same constant."""
MOST_REJECTED = 0.2
"""rs_rejects_most_tokens: RS rejecting more than this share of tokens."""


PRESET_RANKING = (
    "ranked by the verdict's policy: correcting without a finding first (token-level IS, then with RS, RS, sequence "
    "IS), then no correction, then those raising a finding"
)
"""How ``rank_presets`` orders the presets, in the words every renderer shows above the table (docs/sweep.md)."""


def rank_presets(
    rows: list[SweepRow], min_ess: float, version: str = DEFAULT_VERSION, router_replay: str = "disabled"
) -> list[PresetRank]:
    """verl ``version``'s presets whose IS and RS settings are all rows of this sweep, ranked by the verdict's policy
    (docs/verdict.md, docs/sweep.md): first those that correct without raising one of analyze's findings, then those
    that apply no correction (``disabled``, ``bypass_ppo_clip``: the PPO clip alone), last those that raise a finding
    (IS saturated, an ESS below verl's 0.3 or ``min_ess``, RS rejecting most tokens). Within a tier: token-level IS
    alone first (the robust default), then token IS with RS, RS alone, sequence-level IS; then fewer tokens and
    responses rejected, fewer weights truncated, higher ESS. A preset verl refuses with the run's ``router_replay``
    mode (R2 with bypass mode, verl 0.9.1: ``rcdiag.settings.correction.refuse_router_replay``) is never ranked."""
    by_key = {(row.option, row.threshold): row for row in rows}
    ranked = []
    for name in PRESETS:
        try:
            config = preset(name, version)
            refuse_router_replay(router_replay, config.bypass_mode, version)
        except ConfigError:  # a preset this release did not have, or one it refuses with this router replay
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
        truncated = None
        if is_row is not None:
            truncated = is_row.token_reject if config.rollout_is == "token" else is_row.seq_reject
        meets = ess is None or ess >= min_ess
        tier, note = _tier(config.rollout_is, config.rollout_rs, ess, truncated, token, meets, min_ess)
        ranked.append(PresetRank(name, token, seq, ess, meets, truncated, tier, note))
    order = {name: i for i, name in enumerate(PRESETS)}
    ranked.sort(
        key=lambda p: (
            p.tier,
            _policy_rank(preset(p.name, version)),
            p.token_reject,
            p.seq_reject,
            p.is_truncated_share or 0.0,
            -(1.0 if p.ess is None else p.ess),
            order[p.name],
        )
    )
    return ranked


def _tier(
    level: str | None,
    rs: str | None,
    ess: float | None,
    truncated: float | None,
    token_reject: float,
    meets: bool,
    min_ess: float,
) -> tuple[int, str]:
    raised = []
    if truncated is not None and truncated >= SATURATED_SHARE:
        raised.append(f"is_saturated ({truncated:.0%} of the {level}-level weights beyond the bounds)")
    if ess is not None and ess < ESS_FLOOR:
        raised.append(f"is_ess_low (ESS {ess:.3g} < {ESS_FLOOR:g})")
    elif not meets:
        raised.append(f"ESS {ess:.3g} below --min-ess {min_ess:g}")
    if token_reject > MOST_REJECTED:
        raised.append(f"rs_rejects_most_tokens ({token_reject:.0%} of tokens)")
    if raised:
        return 2, "raises " + "; ".join(raised)
    if level is None and rs is None:
        return 1, "applies no correction (fine only where analyze's verdict is identical or healthy)"
    return 0, ""


def _policy_rank(config: Any) -> int:
    """Token-level IS alone, token IS with RS, RS alone, sequence-level IS (seed 004: token-level truncation stays
    stable where sequence weights collapse as responses grow)."""
    if config.rollout_is == "token":
        return 0 if config.rollout_rs is None else 1
    if config.rollout_is is None:
        return 2
    return 3


def _lookup(by_key: dict[tuple[str, str], SweepRow], option: str, spec: Any) -> SweepRow | None:
    """The row of an option at a preset's threshold, matching specs by value (``2`` is ``2.0``)."""
    from rcdiag.sweep.grid import resolve

    wanted = resolve(option, str(spec))
    for (row_option, row_spec), row in by_key.items():
        if row_option == option and resolve(option, row_spec) == dataclasses.replace(wanted, spec=row_spec):
            return row
    return None
