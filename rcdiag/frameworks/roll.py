"""ROLL's train-inference correction (alibaba/ROLL 8eb27cc2: ``compute_train_infer_correction``,
``roll/utils/train_infer_corrections.py:57-183``, as ``apply_train_infer_correction_to_batch`` calls it on a whole
batch (``:186-255``), with ``agg_loss``, ``masked_mean`` and ``masked_sum`` of ``roll/utils/functionals.py`` and
``compute_segment_masked_mean`` of ``roll/pipeline/agentic/utils.py``; the ``@sum`` tags stripped when logged,
``roll/utils/tracking.py``).

Per token ``d = old - infer`` and ``diff = exp(old) - exp(infer)`` (float32), at four granularities: ``token``,
``geometric`` (the row's exp(mean d), and its mean diff), ``sequence`` (exp(sum d), the sum of diff) and
``segment`` (each run of valid positions' mean). ROLL always logs ``actor/train_infer_ratio_{agg}_mean`` and
``actor/train_infer_diff_{agg}_mean``: each row's masked mean, averaged over the rows with a valid token. With
``is_weight.enabled`` the weight is the ratio at ``weight_type``, clamped to [0, upper_bound]; with filters, each
enabled one keeps a token whose ratio (and/or diff) at ``agg_type`` lies in its bounds. Its pass rate
(``actor/train_infer_{agg}_{ratio,diff}_mask_mean``) and ``actor/is_weight_clipfrac`` are ROLL's ``token-mean``:
the sum over **every** position of the padded (B, T) batch, padding included, over the valid tokens: they depend
on the padding (a pad's ratio is exp(0) = 1 and its diff 0, a row-level value covers its whole row), and rcdiag
gives them for the step padded to its longest row as stored. ``actor/train_infer_final_mask_mean`` is the share of
valid tokens every filter keeps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from rcdiag.catalogue.metrics import framework_note
from rcdiag.core.limits import F32_MAX
from rcdiag.frameworks.base import Framework, FrameworkMetrics, MetricKey, Option, TokenRows, exp32, weight_keys
from rcdiag.frameworks.correction import NO_CLAMP_QUIRK, Band, Correction, Form, Unit, Weight
from rcdiag.metrics.base import Accumulator, MetricValue, Reduce, VerlCrash

BLOCK = "train_infer_correction"
IS_WEIGHT = BLOCK + ".is_weight"
FILTERS = BLOCK + ".filters"
AGGS = ("token", "geometric", "sequence", "segment")
ROW_AGGS = ("geometric", "sequence")
EPS = 1e-8
IS_FIELDS = (
    Option("enabled", "bool", False, "weigh each token's loss by the ratio"),
    Option("weight_type", "choice", "token", "token, segment, geometric or sequence", choices=AGGS),
    Option("upper_bound", "number", 1.2, "clamp the weight to [0, upper_bound]; null: no clamp", nullable=True),
)
FILTER_FIELDS = (
    Option("enabled", "bool", False, "apply this filter to the response mask"),
    Option("agg_type", "choice", "token", "token, segment, geometric or sequence", choices=AGGS),
    Option("ratio_enabled", "bool", True, "keep a ratio in [ratio_low, ratio_high]"),
    Option("ratio_low", "number", 0.8, "lower ratio bound"),
    Option("ratio_high", "number", 1.2, "upper ratio bound"),
    Option("diff_enabled", "bool", False, "keep a probability difference in [diff_low, diff_high]"),
    Option("diff_low", "number", -0.2, "lower diff bound"),
    Option("diff_high", "number", 0.2, "upper diff bound"),
)


@dataclass(frozen=True)
class Test:
    """One pass test: a filter's ratio or diff bounds at a granularity (or the weight's clip, ``kind`` clip)."""

    kind: str
    agg: str
    low: float
    high: float

    def passes(self, values: np.ndarray) -> np.ndarray:
        """ROLL's ``(x >= low) * (x <= high)`` (the clip: ``x > upper``), float32 compared with the bounds."""
        if self.kind == "clip":
            return values > np.float32(self.high)
        return (values >= np.float32(self.low)) & (values <= np.float32(self.high))

    @property
    def key(self) -> str:
        if self.kind == "clip":
            return "actor/is_weight_clipfrac"
        return f"actor/train_infer_{self.agg}_{self.kind}_mask_mean"


@dataclass(frozen=True)
class RollSettings:
    weight: bool
    weight_type: str
    upper: float | None
    filters: tuple[tuple[Test, ...], ...]
    """Each enabled filter's tests (ratio, diff)."""
    has_filters: bool
    """``cfg.filters`` is not empty (ROLL then logs the final pass rate, even with every filter off)."""
    shown: tuple[tuple[str, Any], ...]

    def tests(self) -> list[Test]:
        clip = [Test("clip", self.weight_type, 0.0, self.upper)] if self.weight and self.upper is not None else []
        return [*clip, *(test for tests in self.filters for test in tests)]

    def new_metrics(self) -> RollMetrics:
        return RollMetrics(self)

    def notes(self) -> tuple[str, ...]:
        notes = [
            "the train_infer_ratio/diff means are over the rows with a valid token, each row's masked mean; a dump "
            "step is one batch as apply_train_infer_correction_to_batch takes it (enable_old_logprobs_recompute)",
        ]
        if self.tests():
            notes.append(
                "is_weight_clipfrac and the filters' pass rates sum over every position of the padded batch, "
                "padding included, and divide by the valid tokens (they can exceed 1): ROLL's value depends on how "
                "its batch was padded (its prompt positions too); rcdiag pads the step to its longest row as "
                "stored, pads with log-probs 0 (ratio 1, diff 0), and the pooled view to the dump's longest row"
            )
        notes.append(framework_note("roll", "the IS weight (1 when off) times the filters' mask, per token"))
        return tuple(notes)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.shown)

    def correction(self) -> Correction:
        """The IS weight at its granularity, clamped to [0, upper_bound]; each enabled filter's ratio and diff
        tests as bands at theirs (a bound at float32's limit bounds nothing)."""
        if self.weight:
            label = f"is_weight {self.weight_type}, upper_bound {self.upper}"
            weight = Weight(UNITS[self.weight_type], None, self.upper, label=label)
        else:
            weight = Weight("one", label="is_weight off (weight 1)")
        bands = []
        for i, tests in enumerate(self.filters):
            for test in tests:
                label = f"filter {i + 1}: {test.kind} at {test.agg} in [{test.low:g}, {test.high:g}]"
                statistic = (RATIO_STATISTIC if test.kind == "ratio" else DIFF_STATISTIC)[test.agg]
                low = None if test.low <= -F32_MAX else test.low
                high = None if test.high >= F32_MAX else test.high
                bands.append(Band(statistic, low, high, label=label))
        return Correction(weight, tuple(bands), quirks=(NO_CLAMP_QUIRK,)).normal()


class RollMetrics(FrameworkMetrics):
    """One batch's ``actor/train_infer_*`` keys: per-row mean sums at each granularity, and for each pass test
    its passes inside the rows and the rows whose row-level value passes (times the padded width at the end)."""

    NAME = "roll"
    STATES: ClassVar[dict[str, Reduce]] = {
        **FrameworkMetrics.WEIGHT_STATES,
        "rows": "sum",
        "valid_rows": "sum",
        "stored": "sum",
        "width": "max",
        "means": "sums",
        "inside": "sums",
        "passing_rows": "sums",
        "final": "sum",
    }
    settings: RollSettings

    def __init__(self, settings: RollSettings) -> None:
        self.settings = settings
        n = max(len(settings.tests()), 1)
        Accumulator.__init__(self, {"means": 2 * len(AGGS), "inside": n, "passing_rows": n})

    def update(self, block: Any) -> None:
        s = self.settings
        rows = TokenRows(block)
        count = rows.counts.astype(np.float32)
        valid = rows.counts > 0
        d = rows.diff
        diff = exp32(rows.old) - exp32(rows.rollout)
        per_row = {  # masked_mean / masked_sum over dim -1: 0 for a row without a valid token
            "geometric": (exp32(_mean(rows, d, count)), _mean(rows, diff, count)),
            "sequence": (exp32(rows.row_sum(d).astype(np.float32)), rows.row_sum(diff).astype(np.float32)),
        }
        per_token = {
            "token": (exp32(d), diff),
            "segment": (exp32(rows.run_mean(d)), rows.run_mean(diff)),
        }
        means = []
        for agg in AGGS:
            for part in (0, 1):
                if agg in per_row:  # the row's value summed over its tokens in float32 (which can overflow)
                    with np.errstate(over="ignore"):
                        row_sum = (per_row[agg][part].astype(np.float64) * count).astype(np.float32)
                    row_mean = row_sum / (count + np.float32(EPS))
                else:
                    row_mean = rows.row_sum(per_token[agg][part]).astype(np.float32) / (count + np.float32(EPS))
                means.append(float(np.where(valid, row_mean, 0.0).astype(np.float64).sum()))
        tests = s.tests()
        inside, passing = np.zeros(max(len(tests), 1)), np.zeros(max(len(tests), 1))
        old_m, roll_m, _ = rows.masked
        in_list = {"token": (exp32(old_m - roll_m), exp32(old_m) - exp32(roll_m))}
        kept = np.ones(rows.n_tokens, dtype=bool)
        raw = rows.raw_counts.astype(np.float64)
        for i, test in enumerate(tests):
            part = 1 if test.kind == "diff" else 0
            if test.agg in per_row:
                ok = test.passes(per_row[test.agg][part])
                passing[i] = float(np.count_nonzero(ok))  # each covers its whole padded row: times T at the end
                token_ok = rows.per_token(ok)
            else:
                token_ok = test.passes(per_token[test.agg][part])
                inside[i] = float(np.count_nonzero(token_ok))
                if test.agg == "token":
                    inside[i] += float(np.count_nonzero(test.passes(in_list["token"][part])))
            if test.kind != "clip":
                kept &= token_ok
        weight = np.ones(rows.n_tokens, dtype=np.float32)
        moved = None
        if s.weight:
            w = per_row[s.weight_type][0] if s.weight_type in per_row else per_token[s.weight_type][0]
            w = rows.per_token(w) if s.weight_type in per_row else w
            weight = np.minimum(np.maximum(w, np.float32(0.0)), np.float32(s.upper)) if s.upper is not None else w
            moved = (weight != w) & kept if s.upper is not None else None
        self.add(
            rows=float(rows.n_rows),
            valid_rows=float(np.count_nonzero(valid)),
            stored=float(raw.sum()),
            width=float(raw.max()) if rows.n_rows else 0.0,
            means=np.asarray(means),
            inside=inside,
            passing_rows=passing,
            final=float(np.count_nonzero(kept)),
        )
        self.add_weights(np.where(kept, weight, np.float32(0.0)), rows, moved)

    def keys(self) -> list[str]:
        s = self.settings
        keys = [f"actor/train_infer_{what}_{agg}_mean" for agg in AGGS for what in ("ratio", "diff")]
        keys.extend(dict.fromkeys(test.key for test in s.tests()))  # a later filter of one granularity overwrites
        if s.has_filters:
            keys.append("actor/train_infer_final_mask_mean")
        return [*keys, *self.weight_keys()]

    def compute(self) -> tuple[dict[str, MetricValue], list[VerlCrash]]:
        st, s = self.state, self.settings
        keys = self.keys()
        samples = max(st["valid_rows"], 1.0) + EPS
        means = np.where(np.abs(st["means"]) > F32_MAX, np.inf * np.sign(st["means"]), st["means"])  # float32 sum
        values: dict[str, MetricValue] = dict(zip(keys[: 2 * len(AGGS)], means / samples, strict=True))
        tokens = max(st["tokens"], 1.0)
        width = max(st["width"], 0.0)
        pads = st["rows"] * width - st["stored"]  # positions beyond each row's stored length
        for i, test in enumerate(s.tests()):
            if test.agg in ROW_AGGS:
                total = st["passing_rows"][i] * width
            else:
                pad_value = np.float32(1.0 if test.kind != "diff" else 0.0)  # exp(0 - 0); 0 - 0
                padded = pads if test.agg == "token" else st["rows"] * width - st["tokens"]
                total = st["inside"][i] + float(test.passes(np.asarray([pad_value]))[0]) * padded
            values[test.key] = total / tokens
        if s.has_filters:
            values["actor/train_infer_final_mask_mean"] = st["final"] / (st["tokens"] + EPS)
        return {**values, **self.weight_values()}, []


UNITS: dict[str, Unit] = {"token": "token", "geometric": "geomean", "sequence": "product", "segment": "segment"}
RATIO_STATISTIC = {"token": "ratio", "geometric": "geomean", "sequence": "product", "segment": "segment_ratio"}
DIFF_STATISTIC = {"token": "diff", "geometric": "mean_diff", "sequence": "sum_diff", "segment": "segment_diff"}
"""Each granularity's weight, ratio and probability difference in the shared vocabulary."""
OFF = {"enabled": False, "weight_type": "token", "upper_bound": None}


def _weight(kind: str, clamped: bool) -> Callable[[float | None, float | None], dict[str, Any] | None]:
    def options(low: float | None, high: float | None) -> dict[str, Any] | None:
        if clamped and high is None:
            return None
        return {IS_WEIGHT: {"enabled": True, "weight_type": kind, "upper_bound": high if clamped else None}}

    return options


def _filter(agg: str, what: str) -> Callable[[float | None, float | None], dict[str, Any] | None]:
    """One enabled filter testing the ratio or the difference at ``agg`` (a missing bound at float32's limit)."""

    def options(low: float | None, high: float | None) -> dict[str, Any]:
        low_bound = (0.0 if what == "ratio" else -F32_MAX) if low is None else low
        high_bound = F32_MAX if high is None else high
        rule = {f.key: f.default for f in FILTER_FIELDS}
        rule.update(enabled=True, agg_type=agg, ratio_enabled=what == "ratio", diff_enabled=what == "diff")
        rule.update({f"{what}_low": low_bound, f"{what}_high": high_bound})
        return {FILTERS: [rule]}

    return options


def combine(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """One IS weight and any filters, in order."""
    weights = {repr(p[IS_WEIGHT]): p[IS_WEIGHT] for p in parts if IS_WEIGHT in p and p[IS_WEIGHT]["enabled"]}
    if len(weights) > 1:
        return None
    filters = [rule for p in parts for rule in p.get(FILTERS, [])]
    out: dict[str, Any] = {IS_WEIGHT: next(iter(weights.values()), OFF)}
    return {**out, FILTERS: filters} if filters or any(FILTERS in p for p in parts) else out


FORMS = (
    Form("one", "none", lambda low, high: {IS_WEIGHT: OFF, FILTERS: []}),
    *(
        form
        for kind, unit in UNITS.items()
        for form in (Form(unit, "clamp", _weight(kind, True)), Form(unit, "none", _weight(kind, False)))
    ),
    *(Form("one", "band", _filter(agg, "ratio"), statistic=s) for agg, s in RATIO_STATISTIC.items()),
    *(Form("one", "band", _filter(agg, "diff"), statistic=s) for agg, s in DIFF_STATISTIC.items()),
)
"""The IS weight at each granularity and a filter on the ratio or the difference at each: ROLL applies the weight
and every filter together."""


def _mean(rows: TokenRows, values: np.ndarray, count: np.ndarray) -> np.ndarray:
    """ROLL's ``masked_mean(x, mask, dim=-1)``: sum / (count + 1e-8), 0 for a row without a valid token."""
    return np.where(count > 0, rows.row_sum(values).astype(np.float32) / (count + np.float32(EPS)), 0.0).astype(
        np.float32
    )


def settings(values: Mapping[str, Any], given: frozenset[str] = frozenset()) -> RollSettings:
    weight = values[IS_WEIGHT]
    filters = []
    for f in values[FILTERS]:
        if not f["enabled"]:
            continue
        tests = []
        if f["ratio_enabled"]:
            tests.append(Test("ratio", f["agg_type"], f["ratio_low"], f["ratio_high"]))
        if f["diff_enabled"]:
            tests.append(Test("diff", f["agg_type"], f["diff_low"], f["diff_high"]))
        filters.append(tuple(tests))
    return RollSettings(
        weight=weight["enabled"],
        weight_type=weight["weight_type"],
        upper=weight["upper_bound"],
        filters=tuple(filters),
        has_filters=bool(values[FILTERS]),
        shown=((IS_WEIGHT, dict(weight)), (FILTERS, [dict(f) for f in values[FILTERS]])),
    )


FRAMEWORK = Framework(
    name="roll",
    title="ROLL",
    release="8eb27cc2",
    source=(
        "roll/utils/train_infer_corrections.py:14-183; roll/utils/functionals.py:229-297; "
        "roll/pipeline/agentic/utils.py:336-388; roll/configs/base_config.py:424-479"
    ),
    options=(
        Option(
            IS_WEIGHT, "block", {f.key: f.default for f in IS_FIELDS}, "the train-infer IS weight", fields=IS_FIELDS
        ),
        Option(FILTERS, "blocks", (), "filter rules, applied in order to the response mask", fields=FILTER_FIELDS),
    ),
    keys=(
        *(
            MetricKey(
                f"actor/train_infer_{what}_{agg}_mean",
                f"mean over rows with a valid token of the row's "
                f"{'ratio exp(old - infer)' if what == 'ratio' else 'diff exp(old) - exp(infer)'} at {agg} "
                "level, masked mean",
            )
            for agg in AGGS
            for what in ("ratio", "diff")
        ),
        MetricKey(
            "actor/is_weight_clipfrac",
            "positions of the padded batch whose weight exceeds upper_bound, over the valid tokens (padding-dependent)",
            "is_weight enabled with an upper bound",
        ),
        *(
            MetricKey(
                f"actor/train_infer_{agg}_{what}_mask_mean",
                f"positions of the padded batch whose {what} at "
                f"{agg} level passes the filter, over the valid tokens (padding-dependent)",
                f"an enabled filter at {agg} with {what}_enabled",
            )
            for agg in AGGS
            for what in ("ratio", "diff")
        ),
        MetricKey("actor/train_infer_final_mask_mean", "share of valid tokens every filter keeps", "filters given"),
        *weight_keys("roll", "ROLL", "response token", "ROLL's filters"),
    ),
    settings=settings,
    prefixes=(BLOCK + ".",),
    left_out=(
        "left out: the actor's pg_loss, ppo clip and KL keys need the current policy and advantages; ROLL's "
        "worker-level call (without enable_old_logprobs_recompute) is the same computation per micro-batch, "
        "padded per micro-batch"
    ),
    batching="one batch of apply_train_infer_correction_to_batch (padded to its longest row)",
    forms=FORMS,
    combine=combine,
)
