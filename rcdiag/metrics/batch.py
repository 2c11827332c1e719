"""All metric groups of one batch (one training step), built from a resolved configuration.

The groups run in verl's order: the ``training/*`` debug metrics (decoupled mode: verl logs them when it
recomputes ``old_log_probs``, before rollout correction), IS, then each RS option and the RS aggregates, then the
off-policy metrics; ``compute`` returns verl's keys in exactly the order verl inserts them into its metrics dict
(``training/*`` as they are, the others under ``rollout_corr/``), and rcdiag's own diagnostics separately.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rcdiag.catalogue.metrics import EXTRA_PREFIX, full_key
from rcdiag.core.limits import finite
from rcdiag.metrics.base import Accumulator, MetricValue, VerlCrash, verl_float
from rcdiag.metrics.block import Block
from rcdiag.metrics.debug import DebugMetrics
from rcdiag.metrics.extras import ExtraMetrics
from rcdiag.metrics.histogram import EDGES, LogRatioHistogram
from rcdiag.metrics.importance import ISMetrics
from rcdiag.metrics.offpolicy import OffPolicyMetrics
from rcdiag.metrics.rejection import RSAggregateMetrics, RSOptionMetrics
from rcdiag.metrics.signatures import SignatureMetrics
from rcdiag.records.report import Histogram
from rcdiag.runtime.fields import FieldError, integer, shown
from rcdiag.settings.correction import ResolvedConfig


@dataclass(frozen=True)
class BatchResult:
    """Metric values of one batch (or of several merged)."""

    metrics: dict[str, MetricValue]
    """verl's ``training/*`` (decoupled mode) and ``rollout_corr/*`` keys, in verl's order; ``None`` where verl
    would crash or the value is not finite."""
    extras: dict[str, MetricValue]
    """rcdiag's own ``rcdiag/*`` diagnostics."""
    raw: dict[str, float | None] = field(repr=False)
    """The same values before non-finite ones were turned into ``None`` (inf and NaN kept)."""
    crashes: tuple[VerlCrash, ...]
    rows: int
    valid_tokens: int
    empty_rows: int
    log_ratio: Histogram | None = None
    """Valid tokens per log-ratio bin (``None`` only where a result is built by hand)."""


class GroupedBatch(ABC):
    """One batch's accumulators (``groups``) and its row counts, fed, merged and saved one way for analyze's
    ``BatchMetrics`` and the sweep's ``SweepBatch`` (one state format for both)."""

    def __init__(self) -> None:
        self.rows = 0
        self.valid_tokens = 0
        self.empty_rows = 0

    @abstractmethod
    def groups(self) -> list[Accumulator]:
        """Every accumulator holding this batch's state, in a fixed order."""

    def update(self, block: Block) -> None:
        """Fold one block of whole rows into every group."""
        self.rows += block.n_rows
        self.valid_tokens += block.n_tokens
        self.empty_rows += block.n_rows - block.n_valid_rows
        for group in self.groups():
            group.update(block)

    def counts_contradiction(self) -> str | None:
        """Where this batch's counts contradict each other (a damaged or edited state file), else ``None``. The
        invariants follow from what ``update`` adds: every row is counted once, by the batch and by each group
        that declares a ``rows`` state; every valid token likewise (a ``tokens`` state); a ``valid_rows`` state
        counts the rows that are not empty; a histogram (a ``counts`` state, with its ``nan``) holds every valid
        token once."""
        rows, valid, empty = self.rows, self.valid_tokens, self.empty_rows
        if empty > rows:
            return f"empty_rows is {empty} but rows is {rows}"
        if valid < rows - empty:
            return f"valid_tokens is {valid} but {rows - empty} rows (rows - empty_rows) have a valid token each"
        expected = {
            "rows": ("rows", rows),
            "tokens": ("valid_tokens", valid),
            "valid_rows": ("rows - empty_rows", rows - empty),
        }
        for group in self.groups():
            declared, state, kind = type(group).STATES, group.state, type(group).__name__
            for name, (label, count) in expected.items():
                value = state.get(name)
                if declared.get(name) == "sum" and isinstance(value, float | int) and value != count:
                    return f"{kind}.{name} is {_count(value)} but {label} is {count}"
            if declared.get("counts") == "counts":
                held = float(np.asarray(state["counts"]).sum()) + float(state.get("nan", 0.0))  # nan: any sum
                if held != valid:
                    return f"{kind} holds {_count(held)} tokens (counts and nan) but valid_tokens is {valid}"
        return None

    def merge_state(self, other: GroupedBatch) -> None:
        """Fold ``other``'s groups and counts into this batch's (the caller checks they were configured alike)."""
        merge_groups(self.groups(), other.groups())
        self.rows += other.rows
        self.valid_tokens += other.valid_tokens
        self.empty_rows += other.empty_rows

    def state_dict(self) -> dict[str, Any]:
        """Serializable state (merge it back with ``load_state_dict`` + ``merge``)."""
        return {
            "rows": self.rows,
            "valid_tokens": self.valid_tokens,
            "empty_rows": self.empty_rows,
            "groups": groups_state(self.groups()),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace this batch's state with a saved one (same configuration), every field checked."""
        load_groups(self.groups(), state.get("groups") if isinstance(state, dict) else None)
        self.rows = integer(state["rows"], "rows")
        self.valid_tokens = integer(state["valid_tokens"], "valid_tokens")
        self.empty_rows = integer(state["empty_rows"], "empty_rows")


class BatchMetrics(GroupedBatch):
    """The accumulators of one batch; ``update`` with blocks, ``merge`` batches, ``compute`` the metrics."""

    def __init__(self, resolved: ResolvedConfig, *, debug: bool = True) -> None:
        """``debug=False`` leaves out verl's ``training/*`` debug metrics: the sweep's verdict reads none of them,
        and on its hot path they cost a fifth of what heading it with analyze's verdict adds."""
        super().__init__()
        self.resolved = resolved
        decoupled = not resolved.config.bypass_mode
        self.debug = DebugMetrics(resolved.version) if decoupled and debug else None
        self.debug_raises_on_empty = decoupled and not resolved.version.debug_metrics_on_empty
        """verl 0.7.1's ``calculate_debug_metrics`` raises first on a batch without a valid token (decoupled mode),
        whether or not its metrics are computed here."""
        self.importance = ISMetrics(resolved.is_spec, resolved.version) if resolved.is_spec is not None else None
        self.rs_options = [RSOptionMetrics(option) for option in resolved.rs_options]
        self.rs_aggregate = RSAggregateMetrics(resolved.rs_options) if self.rs_options else None
        self.offpolicy = OffPolicyMetrics()
        self.extras = ExtraMetrics()
        self.signatures = SignatureMetrics()
        self.log_ratio = LogRatioHistogram()

    def groups(self) -> list[Accumulator]:
        """Every accumulator, in verl's key order (rcdiag's extras and signatures, then the log-ratio histogram,
        last)."""
        groups: list[Accumulator] = []
        if self.debug is not None:  # decoupled mode: logged first, when verl recomputes old_log_probs
            groups.append(self.debug)
        if self.importance is not None:
            groups.append(self.importance)
        groups.extend(self.rs_options)
        if self.rs_aggregate is not None:
            groups.append(self.rs_aggregate)
        groups.extend([self.offpolicy, self.extras, self.signatures, self.log_ratio])
        return groups

    def merge(self, other: BatchMetrics) -> BatchMetrics:
        """Fold another batch's state (same configuration) into this one; returns ``self``."""
        if not self.resolved.same_computation(other.resolved):
            raise ValueError("cannot merge batches computed with different configurations")
        self.merge_state(other)
        return self

    def compute(self) -> BatchResult:
        """The batch's metrics; a batch without a valid token gives ``None`` everywhere and a crash note."""
        raw: dict[str, float | None] = {}
        crashes: list[VerlCrash] = []
        for group in self.groups():
            values, group_crashes = group.compute()
            raw.update(values)
            crashes.extend(prefixed_crash(crash) for crash in group_crashes)
        if self.valid_tokens == 0:
            crashes = [empty_batch_crash(debug_raises=self.debug_raises_on_empty)]
        metrics: dict[str, MetricValue] = {}
        extras: dict[str, MetricValue] = {}
        for key, value in raw.items():
            value = verl_float(value)
            target = extras if key.startswith(EXTRA_PREFIX) else metrics
            target[full_key(key)] = finite(value)
            raw[key] = value
        return BatchResult(
            metrics=metrics,
            extras=extras,
            raw={full_key(k): v for k, v in raw.items()},
            crashes=tuple(crashes),
            rows=self.rows,
            valid_tokens=self.valid_tokens,
            empty_rows=self.empty_rows,
            log_ratio=Histogram(
                tuple(EDGES.tolist()), tuple(self.log_ratio.counts.tolist()), int(self.log_ratio.state["nan"])
            ),
        )


def _count(value: float | int) -> str:
    """A count as a state file holds it (a float sum of whole numbers), shown as an integer where it is one."""
    return str(int(value)) if float(value).is_integer() else repr(value)


def merge_groups(groups: list[Accumulator], others: list[Accumulator]) -> None:
    """Fold each accumulator of ``others`` into its counterpart in ``groups`` (the same configuration, in order)."""
    for mine, theirs in zip(groups, others, strict=True):
        mine.merge(theirs)


def groups_state(groups: list[Accumulator]) -> list[dict[str, Any]]:
    """Accumulators' states as a state file holds them: each with its kind."""
    return [{"kind": type(group).__name__, "state": group.state_dict()} for group in groups]


def load_groups(groups: list[Accumulator], saved_groups: Any) -> None:
    """Load ``groups_state``'s output (from a file: anything) into ``groups``: as many, each of its kind, each
    state checked against its declaration."""
    if not isinstance(saved_groups, list) or len(saved_groups) != len(groups):
        raise ValueError("saved state was computed with a different configuration")
    for group, saved in zip(groups, saved_groups, strict=True):
        kind = saved.get("kind") if isinstance(saved, dict) else saved
        if kind != type(group).__name__:
            raise FieldError(f"group kind must be {type(group).__name__} here, got {shown(kind)}")
        group.load_state_dict(saved["state"])


def declared_states(owner: str | None = None) -> list:
    """Every accumulator's declared state (class, state names, their reductions, bins, shapes, items), sorted: the
    accumulators' part of the state layout (``rcdiag.engine.state_files.state_layout``). ``owner``: those of that
    whole-dump accumulator (``Accumulator.OWNER``; its layout declares them), else the engine's per-step ones."""
    declared: dict[str, list] = {}
    pending = list(Accumulator.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.__module__.startswith("rcdiag.") and owner == cls.OWNER:
            bins = [("bins", cls.BINS)] if cls.BINS else []  # a ``counts`` state's length is part of its layout
            shapes = [("shapes", sorted((k, list(v)) for k, v in cls.SHAPES.items()))] if cls.SHAPES else []
            items = [("items", sorted((k, v.__qualname__) for k, v in cls.ITEMS.items()))] if cls.ITEMS else []
            declared[f"{cls.__module__}.{cls.__qualname__}"] = sorted(cls.STATES.items()) + bins + shapes + items
    return sorted(declared.items())


def empty_batch_crash(debug_raises: bool = False) -> VerlCrash:
    """What verl does with a batch that has no valid token; ``debug_raises``: verl 0.7.1 in decoupled mode, whose
    ``calculate_debug_metrics`` raises first (``torch.max`` of no element)."""
    raised = (
        "RuntimeError('max(): Expected reduction dim to be specified for input.numel() == 0. ...') in "
        "calculate_debug_metrics"
        if debug_raises
        else "ValueError('response_mask must contain at least one valid token (1).')"
    )
    return VerlCrash(
        "verl_crash_empty_batch",
        None,
        f"this batch has no valid token (every response is empty or fully masked): verl raises {raised} and logs "
        "nothing",
    )


def prefixed_crash(crash: VerlCrash) -> VerlCrash:
    """Crash notes name metrics with the key users see (``rollout_corr/...``)."""
    if crash.metric is None or crash.metric == full_key(crash.metric):
        return crash
    return VerlCrash(crash.code, full_key(crash.metric), crash.message)
