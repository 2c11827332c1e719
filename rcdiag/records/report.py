"""Frozen result records: what ``analyze`` returns and every renderer reads."""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass, field
from typing import Any, Literal

from rcdiag.core.limits import finite, finite_tree
from rcdiag.settings.correction import ResolvedConfig

Severity = Literal["error", "warning", "info"]
Side = Literal["a", "b"]
"""The two dumps of ``rcdiag compare``."""
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Finding:
    """One health observation, with a stable ``code`` (documented in docs/findings.md; ``compare``'s codes in
    docs/compare.md). Made by ``rcdiag.catalogue.emit.emit``."""

    code: str
    severity: Severity
    message: str
    metric: str | None = None
    value: float | None = None
    threshold: float | tuple[float, float] | None = None
    steps: tuple[int, ...] | None = None
    """Steps at which it holds; ``None`` for a dump without steps (one batch) or the dump as a whole."""
    detail: dict[str, str] | None = None
    """Per-metric detail folded into this finding (``logprob_neg_inf``: each non-finite metric and its value)."""
    evidence: dict[str, Any] | None = None
    """The numbers behind a detector's verdict (``analyze --explain``), as in its message."""
    side: Side | None = None
    """``compare``: the dump it is about (``None``: the pair as a whole, or an ``analyze`` finding)."""
    facts: str = ""
    """The measured statement the message opens with (one sentence, no full stop): what the verdict quotes."""
    advice: str = ""
    """The spec's advice the message ends with (``rcdiag.catalogue.emit.emit`` sets both)."""

    def to_dict(self) -> dict[str, Any]:
        """``analyze``'s JSON finding (docs/json.md): no ``side``; ``facts`` and ``advice`` are in its message."""
        out = dataclasses.asdict(self)
        for key in ("side", "facts", "advice"):
            del out[key]
        out["evidence"] = None if self.evidence is None else finite_tree(self.evidence)
        out["value"] = finite(self.value)
        out["threshold"] = list(self.threshold) if isinstance(self.threshold, tuple) else self.threshold
        out["steps"] = list(self.steps) if self.steps is not None else None
        return out

    def to_pair_dict(self) -> dict[str, Any]:
        """``compare``'s JSON finding (docs/compare.md): its ``side``, and no per-step fields."""
        threshold = list(self.threshold) if isinstance(self.threshold, tuple) else self.threshold
        return {
            "code": self.code,
            "severity": self.severity,
            "message": self.message,
            "side": self.side,
            "metric": self.metric,
            "value": finite(self.value),
            "threshold": threshold,
        }


@dataclass(frozen=True)
class InputFacts:
    """What was read."""

    path: str
    format: str
    rows: int
    tokens: int
    """List values read, padding included."""
    valid_tokens: int
    empty_rows: int
    """Rows without a valid token (empty or fully masked responses)."""
    steps: int
    """Distinct values of the step column (0 without one)."""
    skipped_rows: int
    """Rows left out by ``--on-bad-row skip`` (not in ``rows``)."""
    columns: dict[str, str | None]
    """Canonical role -> the column (or JSON key) used; ``None`` for an absent optional column."""
    dtypes: dict[str, str]
    metadata: dict[str, str]
    """Run facts from the dump: key-value metadata, then constant columns such as ``temperature``."""
    skipped_by_reason: dict[str, int] = dataclasses.field(default_factory=dict)
    """``skipped_rows`` by reason: bad_mask, nan, pos_inf, positive_logprob (a row counts under its first)."""
    neg_inf_tokens: dict[str, int] = dataclasses.field(default_factory=dict)
    """Valid tokens whose log-prob is ``-inf`` (legal: probability 0), per side."""
    files: int = 1
    step_source: str = ""
    """Where the steps come from: "column 'NAME'", "file name", "directory name", "key 'NAME'"; "" without."""
    neg_inf_first: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    """Per side, ``[row, position]`` of the first valid token with a ``-inf`` log-prob (0-based)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Histogram:
    """Valid tokens per bin of a per-token value: bin ``i`` holds ``[edges[i-1], edges[i])``, the first bin
    everything below ``edges[0]`` and the last everything from ``edges[-1]`` up (so ``len(counts) ==
    len(edges) + 1``); ``nan`` counts the tokens no bin holds."""

    edges: tuple[float, ...]
    counts: tuple[int, ...]
    nan: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"edges": list(self.edges), "counts": list(self.counts), "nan": self.nan}


@dataclass(frozen=True)
class StepReport:
    """Metrics of one training step: what verl would have logged at that step."""

    step: int
    rows: int
    valid_tokens: int
    metrics: dict[str, float | None]
    extras: dict[str, float | None]

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "rows": self.rows,
            "valid_tokens": self.valid_tokens,
            "metrics": self.metrics,
            "extras": self.extras,
        }


@dataclass(frozen=True)
class TokenTrace:
    """One response's log-ratio ``old - rollout`` at its valid tokens: list positions and values (thinned by
    ``rcdiag.explain.worst.token_trace``)."""

    row: int
    positions: tuple[int, ...]
    log_ratios: tuple[float, ...]

    def shifted(self, offset: int) -> TokenTrace:
        return TokenTrace(self.row + offset, self.positions, self.log_ratios)

    def to_dict(self) -> dict[str, Any]:
        return {"row": self.row, "positions": list(self.positions), "log_ratios": [finite(v) for v in self.log_ratios]}


@dataclass(frozen=True)
class TokenText:
    """A worst response's token ids and log-ratios at its valid tokens, up to ``rcdiag.explain.worst.TEXT_TOKENS``
    of them from valid token ``start`` (a window around its largest |log-ratio|); ``pieces``: each token's text,
    when a tokenizer was given (``--tokenizer``), for the highlighted text of the worst responses."""

    row: int
    start: int
    ids: tuple[int, ...]
    log_ratios: tuple[float, ...]
    pieces: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        values = [finite(v) for v in self.log_ratios]
        return {"row": self.row, "start": self.start, "ids": list(self.ids), "log_ratios": values}


@dataclass(frozen=True)
class ChecklistRow:
    """One check of ``analyze``'s checklist (``rcdiag.catalogue.checklist``): ``ok``, the finding's severity when
    it fired, or ``not_computed`` (its metric is not computed for this configuration, or a detector had too little
    data: ``reason`` says which)."""

    code: str
    check: str
    """The check in words (the finding spec's ``check``, its threshold filled in)."""
    status: Literal["ok", "not_computed"] | Severity
    value: float | None = None
    """The fired finding's value."""
    steps: tuple[int, ...] | None = None
    """Steps at which the finding fired; ``None``: the dump as a whole (or it did not fire)."""
    reason: str = ""
    """Why it is ``not_computed``."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "check": self.check,
            "status": self.status,
            "value": finite(self.value),
            "steps": None if self.steps is None else list(self.steps),
            "reason": self.reason or None,
        }


@dataclass(frozen=True)
class FirstDifference:
    """A response whose log-probs differ in some bit at a valid token: its row (reading order, skipped rows
    included, 0-based), the list position of its first such token (padding included, 0-based), how many of its
    valid tokens differ and by how many float32 ulps at most."""

    row: int
    position: int
    tokens_different: int
    max_ulp: int

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ExactMatch:
    """Bitwise exact match of the two log-prob columns over the valid tokens (``rcdiag.sections.exact``; JSON
    ``exact``): tokens compared, those whose float32 bit patterns differ, the responses holding one, the greatest
    distance in float32 ulps (``rcdiag.core.formulas.ulp_distance``; 0 when none differs, or only signed zeros
    do) and the earliest differing
    responses in reading order (at most ``rcdiag.sections.exact.FIRST_RESPONSES``)."""

    responses_compared: int
    """Responses read (empty and fully masked ones included; skipped bad rows not)."""
    tokens_compared: int
    tokens_different: int
    responses_different: int
    max_ulp: int
    first_difference: tuple[FirstDifference, ...] = ()

    @property
    def identical(self) -> bool:
        """No valid token differs, and at least one was compared (the verdict's ``identical``)."""
        return self.tokens_compared > 0 and self.tokens_different == 0

    def summary(self) -> str:
        """One line: ``bitwise identical at all 43,992 valid tokens``, or ``1,234 of 43,992 valid tokens differ in
        37 of 512 responses, max 3 ulp; first at row 5 position 17``."""
        if not self.tokens_compared:
            return "no valid token to compare"
        if self.identical:
            return f"bitwise identical at all {self.tokens_compared:,} valid tokens"
        ulp = "ulp" if self.max_ulp == 1 else "ulps"
        text = (
            f"{self.tokens_different:,} of {self.tokens_compared:,} valid tokens differ in "
            f"{self.responses_different:,} of {self.responses_compared:,} responses, max {self.max_ulp:,} {ulp}"
        )
        if self.first_difference:
            first = self.first_difference[0]
            text += f"; first at row {first.row} position {first.position}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "responses_compared": self.responses_compared,
            "tokens_compared": self.tokens_compared,
            "tokens_different": self.tokens_different,
            "responses_different": self.responses_different,
            "max_ulp": self.max_ulp,
            "first_difference": [first.to_dict() for first in self.first_difference],
        }


VerdictStatus = Literal["identical", "healthy", "correct", "fix", "broken"]
CauseClass = Literal[
    "noise",
    "temperature",
    "truncation",
    "position",
    "trend",
    "outliers",
    "saturated_is",
    "swapped_columns",
    "crash",
    "token_specific",
    "mask",
    "alignment",
    "offset",
    "logprob_mode",
    "processing",
    "unexplained",
    "replica",
]


@dataclass(frozen=True)
class Cause:
    """One cause the verdict names: its class, the finding codes that show it and the evidence in one line."""

    cls: CauseClass
    codes: tuple[str, ...]
    evidence: str

    def to_dict(self) -> dict[str, Any]:
        return {"class": self.cls, "codes": list(self.codes), "evidence": self.evidence}


@dataclass(frozen=True)
class Effect:
    """What the prescription does on this dump, measured (never guessed); ``None``: not applicable."""

    tokens_rejected: float
    responses_rejected: float
    is_ess: float | None = None
    is_truncated_share: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens_rejected": finite(self.tokens_rejected),
            "responses_rejected": finite(self.responses_rejected),
            "is_ess": finite(self.is_ess),
            "is_truncated_share": finite(self.is_truncated_share),
        }


@dataclass(frozen=True)
class FrameworkEffect:
    """What a framework's setting does on this dump under that framework's own semantics, measured by running its
    correction (``analyze --as NAME``), never guessed: rcdiag's readings ``rcdiag/NAME/*``; ``None``: no valid
    token (the ESS also when every weight is 0)."""

    weight_mean: float | None
    tokens_zeroed: float | None
    responses_zeroed: float | None
    """Share of the responses (every row, as verl counts them) in which it zeroes at least one token."""
    weights_truncated: float | None
    """Share of the valid tokens whose weight its clamp changed."""
    ess: float | None
    """(sum w)^2 / (N sum w^2) over the valid tokens."""

    def to_dict(self) -> dict[str, Any]:
        return {key: finite(value) for key, value in dataclasses.asdict(self).items()}


@dataclass(frozen=True)
class FrameworkSetting:
    """A verl setting in another framework's own settings (``--as NAME``): the options to paste, in its spelling,
    how they match verl's (``same``, ``same_rejections``, ``nearest``, ``none``: ``rcdiag.frameworks.translate``)
    and what differs, and their effect measured under its semantics."""

    name: str
    """The ``--as`` name."""
    release: str
    """``TRL 1.16.0``."""
    match: str
    options: dict[str, Any]
    """As ``--as-option`` takes them (empty where it has nothing alike)."""
    paste: str
    """The options as its users write them (a YAML block or argparse flags)."""
    meaning: str
    effect: FrameworkEffect | None = None

    @property
    def summary(self) -> str:
        """``vllm_importance_sampling_mode=token_truncate, vllm_importance_sampling_clip_max=2.0``: the options
        that are set (a null bound left out)."""
        shown = (f"{key}={_shown(value)}" for key, value in self.options.items() if value is not None)
        return ", ".join(shown) or "nothing alike"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "release": self.release,
            "match": self.match,
            "options": dict(self.options),
            "paste": self.paste,
            "meaning": self.meaning,
            "effect": None if self.effect is None else self.effect.to_dict(),
        }


def _shown(value: Any) -> str:
    import json

    return value if isinstance(value, str) else json.dumps(value)


@dataclass(frozen=True)
class PrescribedSetting:
    """A prescription's four rollout-correction keys, by verl's names, as given (a threshold a number or verl's
    string): the JSON ``verdict.recommendation.config``."""

    rollout_is: str | None
    rollout_is_threshold: float | str | None
    rollout_rs: str | None = None
    rollout_rs_threshold: float | str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Prescription:
    """One verl setting to use: the four rollout-correction keys, the preset it matches, its YAML and effect; under
    ``--as NAME`` (another framework than verl) the same setting in that framework's settings (``framework``)."""

    config: PrescribedSetting
    preset: str | None
    yaml: str
    effect: Effect | None
    why: str
    framework: FrameworkSetting | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {
            "config": self.config.to_dict(),
            "preset": self.preset,
            "yaml": self.yaml,
            "effect": None if self.effect is None else self.effect.to_dict(),
            "why": self.why,
        }
        if self.framework is not None:  # only under --as NAME: a plain report's JSON is unchanged
            out["framework"] = self.framework.to_dict()
        return out


@dataclass(frozen=True)
class Verdict:
    """The answer first: is the run healthy, why not, and what to set (policy: ``rcdiag.diagnosis.verdict``,
    docs/verdict.md).

    ``healthy``: mismatch at the level of numerical noise; ``correct``: noise-like but large enough that correction
    matters; ``fix``: a bug class correction cannot repair; ``broken``: verl would crash or reject everything, or the
    data cannot be right."""

    status: VerdictStatus
    headline: str
    causes: tuple[Cause, ...] = ()
    recommendation: Prescription | None = None
    next_steps: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "headline": self.headline,
            "causes": [cause.to_dict() for cause in self.causes],
            "recommendation": None if self.recommendation is None else self.recommendation.to_dict(),
            "next_steps": list(self.next_steps),
        }


LEGACY_ASSERT = "AssertionError: Expected at least one valid token in response_mask"
"""What verl <= 0.7.1's actor asserts on a micro-batch whose tokens RS all rejected."""
BYPASS_VALUEERROR = "ValueError: response_mask must contain at least one valid token (1)."
"""What bypass mode raises on a micro-batch without a valid token."""
MicroBatchPath = Literal["legacy_actor", "bypass", "driver"]


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch: its rows (indices into the step's rows, in dump order) and its valid tokens."""

    rows: tuple[int, ...]
    n_valid_tokens: int
    n_valid_tokens_after_rs: int
    bypass_crash: str | None
    """What bypass mode raises on it (``ValueError``, or IcePop's ``ZeroDivisionError``); ``None``: nothing."""

    @property
    def legacy_crash(self) -> bool:
        return self.n_valid_tokens_after_rs == 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": list(self.rows),
            "n_valid_tokens": self.n_valid_tokens,
            "n_valid_tokens_after_rs": self.n_valid_tokens_after_rs,
            "bypass_crash": self.bypass_crash,
        }


@dataclass(frozen=True)
class Where:
    """A micro-batch's place: step, mini-batch, rank, micro-batch (0-based)."""

    step: int | None
    mini: int
    rank: int
    micro: int

    def describe(self) -> str:
        step = "" if self.step is None else f"step {self.step}, "
        return f"{step}mini-batch {self.mini}, rank {self.rank}, micro-batch {self.micro}"


@dataclass(frozen=True)
class StepMicroBatches:
    """One step's split and what each path gives on it (``rcdiag.microbatch.simulate``)."""

    step: int | None
    refused: str | None
    """verl's condition when it refuses this split (then nothing else is simulated)."""
    mini_batches: tuple[tuple[tuple[MicroBatch, ...], ...], ...]
    """``mini_batches[m][rank]``: the rank's micro-batches in mini-batch ``m``."""
    legacy_metrics: dict[str, float | None] | None
    bypass_metrics: dict[str, float | None] | None

    def each(self) -> list[tuple[Where, MicroBatch]]:
        return [
            (Where(self.step, m, r, i), micro)
            for m, ranks in enumerate(self.mini_batches)
            for r, micros in enumerate(ranks)
            for i, micro in enumerate(micros)
        ]

    @property
    def legacy_crashes(self) -> list[tuple[Where, MicroBatch]]:
        return [(where, micro) for where, micro in self.each() if micro.legacy_crash]

    @property
    def bypass_crashes(self) -> list[tuple[Where, MicroBatch]]:
        return [(where, micro) for where, micro in self.each() if micro.bypass_crash is not None]

    def to_dict(self) -> dict[str, Any]:
        return {
            "legacy_actor_assert_would_fire": bool(self.legacy_crashes),
            "bypass_valueerror_would_fire": any(m.bypass_crash == BYPASS_VALUEERROR for _, m in self.each()),
            "legacy_metrics": self.legacy_metrics,
            "bypass_metrics": self.bypass_metrics,
            "refused": self.refused,
            "mini_batches": [
                {
                    "index": m,
                    "ranks": [
                        {
                            "rank": r,
                            "rows": sum(len(micro.rows) for micro in micros),
                            "micro_batches": [micro.to_dict() for micro in micros],
                        }
                        for r, micros in enumerate(ranks)
                    ],
                }
                for m, ranks in enumerate(self.mini_batches)
            ],
        }


@dataclass(frozen=True)
class MicroBatchReport:
    """Every step's split, both paths' metrics, and which path the configuration takes under its release (built by
    ``rcdiag.microbatch.section.simulate``; its findings by ``rcdiag.microbatch.section.findings``)."""

    settings: dict[str, Any]
    """The actor's batching as given (``rcdiag.MicroBatchSettings.to_dict()``)."""
    path: MicroBatchPath
    """``legacy_actor``: verl <= 0.7.1 decoupled; ``bypass``: bypass mode; ``driver``: verl >= 0.8.0 decoupled,
    where no per-micro-batch rollout-correction call exists (nothing crashes there)."""
    steps: tuple[StepMicroBatches, ...]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "settings": dict(self.settings),
            "path": self.path,
            "legacy_actor_assert_would_fire": any(s.legacy_crashes for s in self.steps),
            "bypass_valueerror_would_fire": any(s.to_dict()["bypass_valueerror_would_fire"] for s in self.steps),
        }
        if len(self.steps) == 1 and self.steps[0].step is None:
            out |= {k: v for k, v in self.steps[0].to_dict().items() if k not in out}
        else:
            out["steps"] = [{"step": s.step, **s.to_dict()} for s in self.steps]
        return out


@dataclass(frozen=True)
class BucketRow:
    """One bucket of a breakdown (JSON ``breakdowns.position[i]``, ...): ``[lo, hi)`` (``hi`` ``None``: open
    ended), its valid tokens and verl's token metrics over them (``None`` for an empty bucket)."""

    lo: float
    hi: float | None
    tokens: int
    kl: float | None
    k3_kl: float | None
    chi2_token: float | None
    abs_log_ratio_mean: float | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class TokenRow:
    """One ranked token id (JSON ``breakdowns.token.by_k3_share[i]``, docs/explain.md)."""

    id: int
    text: str | None
    """Its text with ``--tokenizer``, else ``None``."""
    tokens: int
    token_share: float
    k3_share: float | None
    kl: float | None
    k3_kl: float | None
    chi2_token: float | None
    abs_log_ratio_mean: float | None
    z: float | None
    significant: bool

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class TokenBreakdown:
    """The by-token table's size, its test and its two ranked lists (JSON ``breakdowns.token``)."""

    ids: int
    tokens: int
    min_count: int
    ids_tested: int
    z_critical: float
    by_k3_share: tuple[TokenRow, ...]
    by_abs_log_ratio: tuple[TokenRow, ...]

    def ranked(self) -> tuple[tuple[str, tuple[TokenRow, ...]], ...]:
        """The two ranked lists by their JSON names, in the table's order."""
        return (("by_k3_share", self.by_k3_share), ("by_abs_log_ratio", self.by_abs_log_ratio))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: getattr(self, k) for k in ("ids", "tokens", "min_count", "ids_tested", "z_critical")}
        return out | {name: [row.to_dict() for row in rows] for name, rows in self.ranked()}


@dataclass(frozen=True)
class ExplainBreakdowns:
    """``--explain``'s breakdowns (JSON ``breakdowns``): one row per bucket of position, rollout probability and
    length (docs/json.md); with token ids, the by-token table (``token``)."""

    position: tuple[BucketRow, ...]
    rollout_prob: tuple[BucketRow, ...]
    length: tuple[BucketRow, ...]
    token: TokenBreakdown | None = None

    def bucketed(self) -> tuple[tuple[str, tuple[BucketRow, ...]], ...]:
        """The three bucketed breakdowns by their JSON names, in the report's order."""
        return (("position", self.position), ("rollout_prob", self.rollout_prob), ("length", self.length))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: [row.to_dict() for row in rows] for name, rows in self.bucketed()}
        if self.token is not None:
            out["token"] = self.token.to_dict()
        return out


@dataclass(frozen=True)
class SliceRow:
    """One value of a ``--by`` column (JSON ``breakdowns.by.COLUMN[i]``, docs/json.md): its rows and tokens, verl's
    token metrics over them, its share of the dump's k3, its ``slice_concentrated`` z (``None``: not tested) and
    its own status (``healthy``, ``correct``, ``fix``)."""

    value: Any
    rows: int
    tokens: int
    token_share: float | None
    kl: float | None
    k3_kl: float | None
    abs_log_ratio_mean: float | None
    k3_share: float | None
    z: float | None
    status: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class WorstRow:
    """One of the worst responses (JSON ``worst_sequences[i]``); a non-finite value is ``None``."""

    row: int
    step: int | None
    id: Any
    length: int
    """Valid tokens."""
    log_ratio_sum: float | None
    max_abs_log_ratio: float | None
    position_of_max: int | None
    old_log_prob_at_max: float | None
    rollout_log_prob_at_max: float | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ExplainReport:
    """``analyze --explain``: where the mismatch sits (breakdowns) and which responses carry most of it."""

    breakdowns: ExplainBreakdowns
    worst_sequences: tuple[WorstRow, ...]
    """Most extreme |log-ratio sum| first."""
    sequences_path: str | None = None
    """Where ``--sequences`` wrote one row per response."""
    traces: tuple[TokenTrace, ...] = ()
    """Per-token log-ratios of the few worst responses (bounded, ``rcdiag.explain.worst``), for the HTML report's
    plot; not in the JSON."""
    not_run: dict[str, str] = dataclasses.field(default_factory=dict)
    """Detectors that had too little data to test (code: "not run: why"); their checklist rows show "–"."""
    texts: tuple[TokenText, ...] = ()
    """Token ids (and text, with a tokenizer) of the few worst responses, when the dump has token ids; not in the
    JSON."""

    def to_dict(self) -> dict[str, Any]:
        """Its keys at the top of the report's JSON (docs/json.md)."""
        out: dict[str, Any] = {
            "breakdowns": self.breakdowns.to_dict(),
            "worst_sequences": [row.to_dict() for row in self.worst_sequences],
            "detectors_not_run": dict(self.not_run),
        }
        if self.sequences_path is not None:
            out["sequences_path"] = self.sequences_path
        return out


@dataclass(frozen=True)
class DetectorsReport:
    """The bias detectors every analyze runs (``rcdiag.explain.detector_section``; ``--explain`` reports them in its
    own record): those that did not run, and why."""

    not_run: dict[str, str]
    """Detectors that had too little data to test, or need ``--explain`` (code: "not run: why")."""

    def to_dict(self) -> dict[str, str]:
        return dict(self.not_run)


@dataclass(frozen=True)
class Report:
    """The result of analysing one dump.

    ``metrics`` holds verl's ``rollout_corr/*`` keys for the whole dump as one batch (for a dump with a step
    column, the all-steps view: every step's rows pooled); ``steps`` holds the per-step values verl would
    have logged; ``extras`` holds rcdiag's own ``rcdiag/*`` diagnostics. Non-finite values are ``None``.
    """

    config: ResolvedConfig
    """The configuration it was computed with, resolved once where the report is built (``rcdiag.api.report``):
    its fields (``config.config``) and what verl's parser makes of them (``is_spec``, ``rs_options``); in the JSON
    as the fields (``ResolvedConfig.to_dict``)."""
    input: InputFacts
    metrics: dict[str, float | None]
    extras: dict[str, float | None]
    steps: tuple[StepReport, ...]
    findings: tuple[Finding, ...]
    device: str
    version: str
    log_ratio: Histogram | None = None
    """Valid tokens per bin of the log-ratio ``log pi_train - log pi_rollout``, all steps pooled (logarithmic bins,
    ``rcdiag.metrics.histogram``)."""
    explain: ExplainReport | None = None
    """Set by ``analyze --explain``."""
    detectors: DetectorsReport | None = None
    """Set by an analyze without ``--explain`` (whose record reports the detectors); ``None`` with ``--explain`` and
    for a state without the detectors' sums."""
    microbatch: MicroBatchReport | None = None
    """How verl cut each step into micro-batches and what it computed there (``analyze`` with micro-batch
    options); ``None`` otherwise."""
    verdict: Verdict | None = None
    """Status, causes and one prescription (``rcdiag.diagnosis.verdict``); first in every rendering."""
    sections: dict[str, Any] = field(default_factory=dict)
    """Each section's typed record by its key (``rcdiag.sections``; ``--explain``'s is ``explain``), in the JSON
    under that key."""
    checklist: tuple[ChecklistRow, ...] = ()
    """Every check of the finding catalogue with whether (and where) it fired (``rcdiag.catalogue.checklist``)."""

    def command(self, *words: str) -> str:
        """An rcdiag command line on this report's dump, its path shell-quoted (``DUMP`` where the report has no
        one path to read again: merged states, chunks given in memory), for a next step to suggest."""
        path = self.input.path
        where = "DUMP" if self.device == "merged" or path in ("", "<memory>") else shlex.quote(path)
        return " ".join(["rcdiag", words[0], where, *words[1:]])

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (schema documented in docs/json.md)."""
        out = {
            "schema_version": SCHEMA_VERSION,
            "rcdiag_version": self.version,
            "verdict": None if self.verdict is None else self.verdict.to_dict(),
            "config": self.config.to_dict(),
            "input": self.input.to_dict(),
            "device": self.device,
            "metrics": self.metrics,
            "extras": self.extras,
            "steps": [step.to_dict() for step in self.steps],
            "findings": [finding.to_dict() for finding in self.findings],
            "checklist": [row.to_dict() for row in self.checklist],
            "log_ratio_histogram": self.log_ratio.to_dict() if self.log_ratio is not None else None,
        }
        if self.explain is not None:
            out.update(self.explain.to_dict())
        elif self.detectors is not None:
            out["detectors_not_run"] = self.detectors.to_dict()
        if self.microbatch is not None:
            out["microbatch"] = self.microbatch.to_dict()
        for key, record in self.sections.items():
            _place(out, getattr(record, "JSON_PATH", (key,)), record.to_dict())
        return out

    @property
    def detectors_not_run(self) -> dict[str, str] | None:
        """The bias detectors that did not run, and why (empty: every one ran); ``None`` when none ran."""
        if self.explain is not None:
            return self.explain.not_run
        return None if self.detectors is None else self.detectors.not_run

    def steps_frame(self) -> Any:
        """Per-step metrics as a polars DataFrame: ``step``, ``rows``, ``valid_tokens``, then every metric."""
        import polars as pl

        records = [
            {"step": s.step, "rows": s.rows, "valid_tokens": s.valid_tokens, **s.metrics, **s.extras}
            for s in self.steps
        ]
        return pl.DataFrame(records, infer_schema_length=None)

    def sequences_frame(self) -> Any:
        """One row per response (the ``--sequences`` file) as a polars DataFrame."""
        import polars as pl

        if self.explain is None or self.explain.sequences_path is None:
            raise ValueError("no per-response file: run analyze(..., sequences='FILE.parquet') first")
        return pl.read_parquet(self.explain.sequences_path)


def _place(out: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    """``value`` at ``path`` in ``out`` (a section's ``JSON_PATH``, e.g. ``breakdowns.by``), copying each table on
    the way so that no record's own dict is changed."""
    *parents, last = path
    for name in parents:
        out[name] = out = dict(out.get(name) or {})
    out[last] = value
