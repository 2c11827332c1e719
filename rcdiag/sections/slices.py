"""Mismatch by slice: which rows carry it (docs/verdict.md#replica, docs/options.md#by).

A slice is the rows of one value of a per-row label column (``--by COLUMN``, and a column named like a replica or
a policy version: ``rcdiag.io.columns.LABEL_ALIASES``) or, without a replica column, a block of rows in reading
order. The unit is the response: each keeps its row number and, from the signature pass's per-row sums (no pass
of its own), its tokens with a finite log-ratio and its k3 with each token's ratio capped at e^3 (equal to k3
wherever no ratio exceeds 20, so one extreme token cannot make a slice stand out). A slice is *concentrated* when
its k3 per token is at least ``RATIO_MIN`` times the rest's, above ``NOISE_K3_MAX``, and beyond ``z_critical``
standard errors of the difference (``rcdiag.core.stats.ratio_variance``: responses as the units; Bonferroni over every
slice tested). Row blocks are compared with the rest of their own step (a trend across steps is not a replica),
and the same block of every step with the rest of every step.

With ``--by`` each response also keeps its exact sums (one compiled pass, ``rcdiag.kernels.slices``) and the moments
the precision tests read, for the per-slice table (``breakdowns.by.COLUMN``): 13 numbers a response instead of 3.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from rcdiag.catalogue.emit import emit
from rcdiag.catalogue.findings import Code
from rcdiag.catalogue.keys import Key
from rcdiag.core import formulas
from rcdiag.core.stats import ratio_variance
from rcdiag.diagnosis.signature_rules import NOISE_K3_MAX, mismatch_large, precision_tests
from rcdiag.io.base import RowNumbering
from rcdiag.io.columns import label_role
from rcdiag.metrics.signatures import signature_sums
from rcdiag.records.report import Finding, SliceRow
from rcdiag.runtime.errors import InputError
from rcdiag.runtime.fields import FieldError
from rcdiag.runtime.fields import step as saved_step
from rcdiag.sections.base import PlainSection, RunFacts

if TYPE_CHECKING:
    from rcdiag.metrics.block import Block

MAX_VALUES = 1000
"""Distinct values a label column may hold: a ``--by`` column with more is refused (exit 2: it is an id, not a
slice); a recognised one is left out of the test, said in the verdict's next steps."""
SHOWN = 16
"""Slices per column the terminal shows (those with the largest share of k3_kl; the JSON and HTML have all)."""
MIN_ROWS = 8
"""Responses a slice and the rest each need to be tested."""
RATIO_MIN = 3.0
"""A concentrated slice's k3 per token is at least this many times the rest's (clean real-model dumps: at most 3.4,
for a block of 8 responses at z 1.7; one int4 replica among bf16 ones: 340-410)."""
Z_MIN = 5.0
"""The least critical value: standard errors of the difference (two-sided 3e-7 per test, under 1e-4 per dump for
up to 350 slices tested); with more slices, Bonferroni's ``z_critical``."""
FAMILY_ALPHA = 1e-4
"""False alarms per dump the critical value allows over every slice tested."""
BLOCKS = (2, 4, 8, 16)
"""Each step's rows (in reading order) are cut into this many equal blocks, at every resolution."""
MAX_STEPS_SCANNED = 64
"""Each step's own blocks are tested in a dump of at most this many steps (30 tests a step); with more, only the same
block of every step (a replica serves its share of every batch), so the scan stays a few hundred tests."""
BASE = ("row", "tokens", "k3")
"""Per response on every run: its row number, its tokens with a finite log-ratio, its capped k3 sum."""
DETAIL = ("valid", "neg_lr", "k3_exact", "abs_lr", "ratio", "d", "d2", "mid", "mid2", "d_mid")
"""Per response with ``--by``: valid tokens, the sums of -log-ratio (the block's row sums), k3 and |log-ratio|, of
the capped ratio - 1 and d (the signature pass's), and of d^2, mid, mid^2 and d * mid (mid: the two log-probs' mean;
``rcdiag.kernels.slices``)."""


@cache
def z_critical(tests: int) -> float:
    """The critical |z| for ``tests`` slices tested at once: ``Z_MIN``, or Bonferroni's at ``FAMILY_ALPHA``."""
    from statistics import NormalDist

    return max(Z_MIN, NormalDist().inv_cdf(1 - FAMILY_ALPHA / (2 * max(tests, 1))))


class SliceRows(RowNumbering):
    """A whole-dump accumulator (``rcdiag.engine.stream.WholeDump``): each response's ``BASE`` (and ``DETAIL``)
    numbers and its label codes, per step, merged in reading order (a later part's rows numbered after this one's)."""

    KEY = "slices"

    def __init__(self, given: tuple[str, ...] = ()) -> None:
        self.given = given
        self.columns: list[str] = []
        """Label columns read, in the reader's order (``Resolved.labels``): known from the first block."""
        self.values: dict[str, list[Any]] = {}
        self._index: dict[str, dict[Any, int]] = {}
        self.overflow: set[str] = set()
        """Recognised columns with more than ``MAX_VALUES`` values: not coded (their codes are -1)."""
        self.steps: dict[int | None, list[np.ndarray]] = {}
        self.rows_read = 0
        self.part_rows: list[int] = []
        self._analysis: Analysis | None = None

    @property
    def detail(self) -> bool:
        return bool(self.given)

    @property
    def width(self) -> int:
        return len(BASE) + (len(DETAIL) if self.detail else 0) + len(self.columns)

    def update(self, block: Block) -> None:
        context = block.rows
        assert context is not None  # the engine gives whole-dump accumulators their rows
        labels = context.labels or {}
        if not self.columns and labels:
            self._adopt(list(labels))
        sums = block.once(signature_sums)
        parts = [context.rows.astype(np.float64), sums.row_n.astype(np.float64), sums.row_ratio - sums.row_d]
        if self.detail:
            valid, neg_lr = block.b.to_numpy(block.row_len), -block.b.to_numpy(block.row_sum_lr)
            row = _row_sums(block)
            parts.extend((valid.astype(np.float64), neg_lr, row[:, 1], row[:, 0], sums.row_ratio, sums.row_d))
            parts.extend(row[:, 2:].T)
        parts.extend(self._codes(column, labels[column]) for column in self.columns)
        self.steps.setdefault(context.step, []).append(np.column_stack(parts))
        self._analysis = None

    def _adopt(self, columns: list[str]) -> None:
        self.columns = columns
        self.values = {column: [] for column in columns}
        self._index = {column: {} for column in columns}

    def _codes(self, column: str, values: np.ndarray) -> np.ndarray:
        """Each row's code in ``column``'s value table (new values appended; -1 for an overflowed column)."""
        if column in self.overflow:
            return np.full(values.shape[0], -1.0)
        firsts, inverse = _distinct(values)
        codes = np.array([self._code(column, value) for value in firsts], dtype=np.float64)
        if column in self.overflow:  # this block's values overflowed it
            return np.full(values.shape[0], -1.0)
        return codes[inverse] if codes.size else np.zeros(0)

    def _code(self, column: str, value: Any) -> float:
        index = self._index[column]
        code = index.get(value)
        if code is None:
            if len(index) >= MAX_VALUES:
                self._overflowed(column)
                return -1.0
            code = index[value] = len(index)
            self.values[column].append(value)
        return float(code)

    def _overflowed(self, column: str) -> None:
        if column in self.given:
            raise InputError(
                f"has more than {MAX_VALUES:,} distinct values: --by breaks the mismatch down by a column of few "
                "values (an environment, a data source, a replica, a policy version), not by a per-response id",
                column=column,
            )
        self.overflow.add(column)
        at = len(BASE) + (len(DETAIL) if self.detail else 0) + self.columns.index(column)
        for tables in self.steps.values():
            for table in tables:
                table[:, at] = -1.0

    def merge(self, other: SliceRows) -> SliceRows:
        if other.given != self.given:
            raise ValueError(f"cannot merge slices by {list(other.given)} into slices by {list(self.given)}")
        if not self.columns and other.columns:
            self._adopt(list(other.columns))
        if other.columns and other.columns != self.columns:
            raise ValueError(f"cannot merge slices of columns {other.columns} into slices of {self.columns}")
        for column in other.overflow:
            if column not in self.overflow:
                self._overflowed(column)
        base = len(BASE) + (len(DETAIL) if self.detail else 0)
        for step, tables in other.steps.items():
            for table in tables:
                moved = table.copy()
                moved[:, 0] += self.rows_read
                for i, column in enumerate(self.columns):
                    moved[:, base + i] = self._remap(column, other.values.get(column, []), moved[:, base + i])
                self.steps.setdefault(step, []).append(moved)
        self.rows_read += other.rows_read
        self._analysis = None
        return self

    def _remap(self, column: str, values: list[Any], codes: np.ndarray) -> np.ndarray:
        if column in self.overflow or not codes.size:
            return np.full(codes.shape[0], -1.0)
        table = np.array([self._code(column, value) for value in values] or [-1.0], dtype=np.float64)
        if column in self.overflow:  # the merge itself overflowed it
            return np.full(codes.shape[0], -1.0)
        return table[codes.astype(np.int64)]

    def signature(self) -> tuple:
        return (type(self).__name__, self.given)

    def tables(self) -> dict[int | None, np.ndarray]:
        """Each step's responses (``BASE``, ``DETAIL`` with ``--by``, then one code per label column) in reading
        order."""
        out = {}
        for step, tables in self.steps.items():
            table = np.concatenate(tables) if len(tables) > 1 else tables[0]
            table = table[np.argsort(table[:, 0], kind="stable")]
            self.steps[step] = [table]
            out[step] = table
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "given": list(self.given),
            "columns": list(self.columns),
            "values": json.dumps([self.values[column] for column in self.columns]),
            "overflow": sorted(self.overflow),
            "rows_read": self.rows_read,
            "steps": [[step, table.tolist()] for step, table in self.tables().items()],
        }

    def steps_state(self, steps: list[int | None]) -> dict[str, Any]:
        """``state_dict`` with only ``steps``' responses (``rcdiag watch`` logs the steps a file touched)."""
        out = self.state_dict()
        out["steps"] = [[step, table] for step, table in out["steps"] if step in steps]
        return out

    def replace_steps(self, part: SliceRows) -> None:
        """Take ``part``'s steps (a ``steps_state`` read back) in place of this state's, with its value tables."""
        self._adopt(list(part.columns))
        self.values, self._index, self.overflow = part.values, part._index, set(part.overflow)
        self.steps.update(part.steps)
        self.rows_read = part.rows_read
        self._analysis = None

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> SliceRows:
        keys = {"given", "columns", "values", "overflow", "rows_read", "steps"}
        if not isinstance(state, dict) or set(state) != keys:
            raise FieldError(f"slices must be a table of {', '.join(sorted(keys))}")
        given, columns = state["given"], state["columns"]
        if not all(isinstance(name, str) for name in [*given, *columns]):
            raise FieldError("slices.given and slices.columns must be lists of column names")
        out = cls(tuple(given))
        out._adopt(list(columns))
        try:
            values = json.loads(state["values"])
        except (TypeError, ValueError):
            raise FieldError("slices.values must be a JSON list of each column's values") from None
        if not isinstance(values, list) or len(values) != len(columns):
            raise FieldError("slices.values must hold one list of values per column")
        for column, listed in zip(columns, values, strict=True):
            out.values[column] = list(listed)
            out._index[column] = {_hashable(value): i for i, value in enumerate(listed)}
        out.overflow = {str(name) for name in state["overflow"]}
        rows = state["rows_read"]
        if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0:
            raise FieldError("slices.rows_read must be a count")
        out.rows_read = rows
        for pair in state["steps"]:
            if not isinstance(pair, list) or len(pair) != 2:
                raise FieldError("slices.steps must be a list of [step, table] pairs")
            step, listed = saved_step(pair[0], "slices.steps step"), pair[1]
            if step in out.steps:
                raise FieldError(f"slices.steps holds step {step} twice")
            try:
                table = np.asarray(listed, dtype=np.float64) if listed else np.zeros((0, out.width))
            except (TypeError, ValueError):
                table = np.zeros((0, 0))
            if table.ndim != 2 or table.shape[1] != out.width:
                raise FieldError(f"slices.steps tables must have {out.width} columns")
            out._check(table)
            out.steps[step] = [table]
        return out

    def _check(self, table: np.ndarray) -> None:
        """A saved table's row numbers are rows read, and its codes index their column's values (or are -1)."""
        rows = table[:, 0]
        if rows.size and not (np.all(rows >= 0) and np.all(rows < self.rows_read) and np.all(rows == np.floor(rows))):
            raise FieldError(f"slices.steps row numbers must be rows read (0 to {self.rows_read - 1})")
        base = len(BASE) + (len(DETAIL) if self.detail else 0)
        for i, column in enumerate(self.columns):
            codes = table[:, base + i]
            if codes.size and not (np.all(codes >= -1) and np.all(codes < len(self.values[column]))):
                count = len(self.values[column])
                raise FieldError(f"slices.steps codes of column '{column}' must index its {count} values")

    @classmethod
    def layout(cls) -> dict[str, Any]:
        return {"base": list(BASE), "detail": list(DETAIL), "max_values": MAX_VALUES}


def _row_sums(block: Block) -> np.ndarray:
    """Per row (rows x 6): |d| and k3 over its valid tokens, d^2, mid, mid^2 and d * mid over those with a finite
    log-ratio (``rcdiag.kernels.slices``, or its numpy twin ``slice_arrays``)."""
    old, rollout, mask, lengths = block.raw
    old = np.ascontiguousarray(old, dtype=np.float32)
    rollout = np.ascontiguousarray(rollout, dtype=np.float32)
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    if not block.b.compiled:
        return slice_arrays(old, rollout, mask, lengths)
    from rcdiag.kernels.slices import slice_pass

    out = np.empty((lengths.shape[0], 6))
    flags = np.zeros(0, dtype=np.bool_) if mask is None else np.ascontiguousarray(mask, dtype=np.bool_)
    with np.errstate(all="ignore"):
        slice_pass(old, rollout, flags, mask is not None, lengths, out)
    return out


def slice_arrays(old: np.ndarray, rollout: np.ndarray, mask: np.ndarray | None, lengths: np.ndarray) -> np.ndarray:
    """``rcdiag.kernels.slices.slice_pass`` with numpy's array operations."""
    rows = lengths.shape[0]
    row = np.repeat(np.arange(rows), lengths)
    if mask is not None:
        old, rollout, row = old[mask], rollout[mask], row[mask]
    out = np.zeros((rows, 6))
    with np.errstate(all="ignore"):
        d32 = (old - rollout).astype(np.float64)
        out[:, 0] = np.bincount(row, weights=np.abs(d32), minlength=rows)
        out[:, 1] = np.bincount(row, weights=formulas.k3(np.expm1(d32), d32), minlength=rows)
        d = old.astype(np.float64) - rollout.astype(np.float64)
        finite = np.isfinite(d)
        d, row = d[finite], row[finite]
        mid = 0.5 * (old.astype(np.float64) + rollout.astype(np.float64))[finite]
    for i, weights in enumerate((d * d, mid, mid * mid, d * mid), start=2):
        out[:, i] = np.bincount(row, weights=weights, minlength=rows)
    return out


def _plain(value: Any) -> Any:
    """A label value as JSON holds it: numpy scalars as Python ones, NaN as ``None``."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _hashable(value: Any) -> Any:
    return value if not isinstance(value, list) else tuple(value)


def _distinct(values: np.ndarray) -> tuple[list[Any], np.ndarray]:
    """The distinct values (as ``_plain``) in order of first appearance, and each row's index into them."""
    firsts: dict[Any, int] = {}
    inverse = np.empty(values.shape[0], dtype=np.int64)
    if values.dtype.kind in "iub":
        unique, first, codes = np.unique(values, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        return [_plain(unique[i]) for i in order], rank[codes.reshape(-1)]
    for i, value in enumerate(values.tolist()):
        key = _plain(value)
        inverse[i] = firsts.setdefault(key, len(firsts))
    return list(firsts), inverse


# ----------------------------------------------------------------------------------------------- the analysis


@dataclass(frozen=True)
class Excess:
    """One slice against the rest (responses as the units; k3 with token ratios capped at e^3)."""

    mean: float
    """The slice's capped k3 per token."""
    rest: float
    ratio: float
    """``mean / rest`` (inf when the rest has none)."""
    z: float
    """(mean - rest) over the standard error of the difference."""
    share: float
    """The slice's share of the capped k3 (of the slice and the rest together)."""
    token_share: float
    responses: int

    def concentrated(self, critical: float) -> bool:
        return self.z >= critical and self.ratio >= RATIO_MIN and self.mean > NOISE_K3_MAX


def excess(tokens: np.ndarray, k3: np.ndarray, inside: np.ndarray) -> Excess | None:
    """The slice ``inside`` (a boolean per response) against the other responses; ``None`` when either side has
    fewer than ``MIN_ROWS`` responses with tokens."""
    kept = tokens > 0
    t_in, c_in = tokens[kept & inside], k3[kept & inside]
    t_out, c_out = tokens[kept & ~inside], k3[kept & ~inside]
    if t_in.size < MIN_ROWS or t_out.size < MIN_ROWS:
        return None
    mean, rest = float(c_in.sum() / t_in.sum()), float(c_out.sum() / t_out.sum())
    if not (math.isfinite(mean) and math.isfinite(rest)):
        return None
    se = math.sqrt(ratio_variance(t_in, c_in, mean) + ratio_variance(t_out, c_out, rest))
    difference = mean - rest
    z = difference / se if se > 0 else (math.inf if difference > 0 else 0.0)
    total = float(c_in.sum() + c_out.sum())
    ratio = mean / rest if rest > 0 else (math.inf if mean > 0 else 1.0)
    share = float(c_in.sum()) / total if total > 0 else 0.0
    return Excess(mean, rest, ratio, z, share, float(t_in.sum() / (t_in.sum() + t_out.sum())), int(t_in.size))


@dataclass(frozen=True)
class Candidate:
    """A slice tested: what it is (a column's value, or a block of rows) and its test."""

    what: str
    """The slice in words: ``replica=3 (column 'replica')``, ``rows 192-255 (...)``."""
    test: Excess
    members: np.ndarray
    """The responses it holds (indices in reading order)."""
    column: str | None
    value: Any = None
    scope: str = ""
    """Where the rest it is tested against lies: ``""`` (the dump) or `` of step S``."""


@dataclass(frozen=True)
class Analysis:
    """Every slice tested and what the report keeps: the per-column tables (``--by``), the most concentrated
    slice and how a policy-version column splits it."""

    tables: dict[str, tuple[SliceRow, ...]]
    best: Candidate | None
    tests: int
    critical: float
    versions: str | None
    """The policy-version column's verdict on ``best``: ``engine`` or ``stale`` (``None``: no such column)."""
    version_text: str
    left_out: tuple[str, ...]
    """Recognised columns not tested (too many values)."""
    dump_share: tuple[float, float] = (0.0, 0.0)
    """``best``'s share of the whole dump's capped k3 and of its tokens."""


def analyse(state: SliceRows) -> Analysis:
    """The slices of a finished state (computed once per state)."""
    if state._analysis is None:
        state._analysis = _analyse(state)
    return state._analysis


def _analyse(state: SliceRows) -> Analysis:
    tables = state.tables()
    steps = list(tables)
    whole = np.concatenate([tables[s] for s in steps]) if steps else np.zeros((0, state.width))
    order = np.argsort(whole[:, 0], kind="stable")
    whole = whole[order]
    step_of = np.concatenate([np.full(tables[s].shape[0], i) for i, s in enumerate(steps)] or [np.zeros(0)])[order]
    tokens, k3 = whole[:, 1], whole[:, 2]
    base = len(BASE) + (len(DETAIL) if state.detail else 0)
    codes = {column: whole[:, base + i].astype(np.int64) for i, column in enumerate(state.columns)}
    ordered = {column: _value_order(codes[column], len(state.values[column])) for column in state.columns}
    candidates: list[Candidate] = []
    tested: dict[tuple[str, int], Excess] = {}
    replica_column = False
    for column in state.columns:
        role = label_role(column)
        if column in state.overflow or role == "policy_version":
            continue
        replica_column = replica_column or role == "replica"
        for code in ordered[column]:
            members = np.flatnonzero(codes[column] == code)
            test = excess(tokens, k3, _mask(members, tokens.shape[0]))
            if test is not None:
                tested[column, code] = test
                what = f"the {members.size} rows with {column} = {state.values[column][code]!r}"
                candidates.append(Candidate(what, test, members, column, state.values[column][code]))
    if not replica_column:
        candidates.extend(_blocks(tokens, k3, step_of, steps, whole[:, 0]))
    critical = z_critical(len(candidates))
    hits = [c for c in candidates if c.test.concentrated(critical)]
    best = max(hits, key=lambda c: c.test.z, default=None)
    versions, version_text = None, ""
    version = next((c for c in state.columns if label_role(c) == "policy_version" and c not in state.overflow), None)
    shares = (0.0, 0.0)
    if best is not None:
        inside = _mask(best.members, tokens.shape[0])
        shares = (_ratio(k3[inside].sum(), k3.sum()) or 0.0, _ratio(tokens[inside].sum(), tokens.sum()) or 0.0)
        if version is not None:
            versions, version_text = _split(tokens, k3, inside, codes[version], version)
    by = {
        column: tuple(
            _row(state.values[column][code], whole, codes[column] == code, tested.get((column, code)))
            for code in ordered[column]
        )
        for column in state.given
        if column in state.columns
    }
    left_out = tuple(sorted(c for c in state.overflow if c not in state.given))
    return Analysis(by, best, len(candidates), critical, versions, version_text, left_out, shares)


def _mask(members: np.ndarray, size: int) -> np.ndarray:
    inside = np.zeros(size, dtype=bool)
    inside[members] = True
    return inside


def _value_order(codes: np.ndarray, count: int) -> list[int]:
    """A column's value codes in reading order of their first row (whatever order the parts coded them in)."""
    firsts = np.full(count, np.iinfo(np.int64).max)
    kept = codes >= 0
    np.minimum.at(firsts, codes[kept], np.flatnonzero(kept))
    return [int(code) for code in np.argsort(firsts, kind="stable") if firsts[code] < np.iinfo(np.int64).max]


def _blocks(
    tokens: np.ndarray, k3: np.ndarray, step_of: np.ndarray, steps: list[int | None], rows: np.ndarray
) -> list[Candidate]:
    """Each step's rows cut into ``BLOCKS`` equal blocks in reading order, each against the rest of its step; with
    several steps, the same block of every step against the rest of every step (only those beyond
    ``MAX_STEPS_SCANNED`` steps). Each step's blocks are tested on that step's responses alone."""
    out = []
    same_block: dict[tuple[int, int], list[np.ndarray]] = {}
    by_step = np.argsort(step_of, kind="stable")  # each step's responses, in reading order
    bounds = np.searchsorted(step_of[by_step], np.arange(len(steps) + 1))
    for i, step in enumerate(steps):
        members = by_step[bounds[i] : bounds[i + 1]]
        t, c = tokens[members], k3[members]
        for count in BLOCKS:
            for j in range(count):
                lo, hi = members.size * j // count, members.size * (j + 1) // count
                same_block.setdefault((count, j), []).append(members[lo:hi])
                if hi - lo < MIN_ROWS or members.size - (hi - lo) < MIN_ROWS or len(steps) > MAX_STEPS_SCANNED:
                    continue
                inside = np.zeros(members.size, dtype=bool)
                inside[lo:hi] = True
                test = excess(t, c, inside)
                if test is not None:
                    where = "the dump's rows" if step is None else f"step {step}'s rows"
                    first, last = int(rows[members[lo]]), int(rows[members[hi - 1]])
                    what = f"rows {first}-{last} (block {j + 1} of {count} of {where}, in reading order)"
                    scope = "" if step is None or len(steps) == 1 else f" of step {step}"
                    out.append(Candidate(what, test, members[lo:hi], None, scope=scope))
    if len(steps) > 1:
        for (count, j), parts in same_block.items():
            pooled = np.concatenate(parts)
            test = excess(tokens, k3, _mask(pooled, tokens.shape[0]))
            if test is not None:
                what = f"block {j + 1} of {count} of every step's rows (in reading order)"
                out.append(Candidate(what, test, pooled, None))
    return out


def _split(tokens: np.ndarray, k3: np.ndarray, inside: np.ndarray, version: np.ndarray, column: str) -> tuple[str, str]:
    """Whether the slice stands out within each policy version (``engine``) or only because its rows are of the
    versions that carry the mismatch (``stale``): its capped k3 against what the rest's k3 per token at each of its
    rows' versions predicts."""
    observed = expected = 0.0
    for code in np.unique(version[inside & (tokens > 0)]):
        same = version == code
        rest_tokens = tokens[same & ~inside].sum()
        if rest_tokens <= 0:
            continue
        observed += float(k3[same & inside].sum())
        expected += float(tokens[same & inside].sum() * k3[same & ~inside].sum() / rest_tokens)
    if expected <= 0:
        return "stale", (
            f"its rows are of policy versions (column '{column}') no other row has, so staleness and the engine "
            "cannot be told apart"
        )
    ratio = observed / expected
    if ratio >= RATIO_MIN:
        return "engine", (
            f"within each policy version (column '{column}') it still carries {ratio:.3g}x what the other rows of "
            "that version predict: an engine difference, not staleness"
        )
    return "stale", (
        f"within each policy version (column '{column}') it carries {ratio:.3g}x what the other rows of that version "
        "predict: its excess follows the policy version (staleness), not the engine"
    )


def _row(value: Any, whole: np.ndarray, inside: np.ndarray, test: Excess | None) -> SliceRow:
    """One slice's row of ``breakdowns.by.COLUMN`` (``test``: its ``slice_concentrated`` test, if it had one)."""
    named = {name: whole[:, len(BASE) + i] for i, name in enumerate(DETAIL)}
    valid_all = named["valid"]
    total_tokens, total_k3 = float(valid_all.sum()), float(named["k3_exact"].sum())
    tokens = float(valid_all[inside].sum())
    mean = {key: _ratio(named[key][inside].sum(), tokens) for key in ("neg_lr", "k3_exact", "abs_lr")}
    return SliceRow(
        value=value,
        rows=int(inside.sum()),
        tokens=int(tokens),
        token_share=_ratio(tokens, total_tokens),
        kl=mean["neg_lr"],
        k3_kl=mean["k3_exact"],
        abs_log_ratio_mean=mean["abs_lr"],
        k3_share=_ratio(float(named["k3_exact"][inside].sum()), total_k3),
        z=None if test is None or not math.isfinite(test.z) else test.z,
        status=_status(named, inside, whole[:, 1]),
    )


def _ratio(top: float, bottom: float) -> float | None:
    value = float(top) / bottom if bottom > 0 else math.nan
    return value if math.isfinite(value) else None


def _status(named: dict[str, np.ndarray], inside: np.ndarray, finite: np.ndarray) -> str:
    """The slice's own status by the verdict's size and precision tests (``rcdiag.diagnosis.signature_rules``) on its
    numbers: ``healthy`` below the noise level, ``correct`` when the tests pass, ``fix`` when one fails."""
    valid, n = named["valid"][inside], finite[inside]
    kl = _ratio(named["neg_lr"][inside].sum(), valid.sum())
    k3 = _ratio(named["k3_exact"][inside].sum(), valid.sum())
    metrics: dict[str, float | None] = {Key.KL: kl, Key.K3_KL: k3}
    extras: dict[str, float | None] = {}
    if kl is not None and valid.size > 1:
        extras[Key.KL_STD_ERROR] = math.sqrt(ratio_variance(valid, named["neg_lr"][inside], kl))
    ratio = _ratio(named["ratio"][inside].sum(), n.sum())
    if ratio is not None and n.size > 1:
        extras[Key.CAPPED_RATIO_MEAN] = 1.0 + ratio
        extras[Key.CAPPED_RATIO_STD_ERROR] = math.sqrt(ratio_variance(n, named["ratio"][inside], ratio))
    extras[Key.SHAPE_CORR] = _correlation({key: float(named[key][inside].sum()) for key in named}, n.sum())
    if not mismatch_large(metrics, extras):
        return "healthy"
    return "fix" if precision_tests(metrics, extras)[1] else "correct"


def _correlation(sums: dict[str, float], n: float) -> float | None:
    """corr(d, mid) over the slice's tokens from its sums (as ``rcdiag.metrics.signatures``' ``shape_corr``)."""
    if n <= 0:
        return None
    var_d = sums["d2"] / n - (sums["d"] / n) ** 2
    var_mid = sums["mid2"] / n - (sums["mid"] / n) ** 2
    cov = sums["d_mid"] / n - (sums["d"] / n) * (sums["mid"] / n)
    if var_d <= 1e-12 * max(sums["d2"] / n, 1e-300) or var_mid <= 0:
        return None
    return max(-1.0, min(1.0, cov / math.sqrt(var_d * var_mid)))


# ------------------------------------------------------------------------------------------- record, findings


class SlicesRecord:
    """``--by``'s tables: per column, one row per value (in reading order of its first row); JSON
    ``breakdowns.by``."""

    JSON_PATH: ClassVar[tuple[str, ...]] = ("breakdowns", "by")

    def __init__(self, tables: dict[str, tuple[SliceRow, ...]], concentrated: str | None) -> None:
        self.tables = tables
        self.concentrated = concentrated
        """The concentrated slice, in words (``None``: none)."""

    def to_dict(self) -> dict[str, Any]:
        return {column: [row.to_dict() for row in rows] for column, rows in self.tables.items()}


class SlicesSection(PlainSection):
    """Mismatch by slice on every analyze: the ``slice_concentrated`` test over a replica column's values or blocks
    of rows; with ``by`` (``--by``), the per-slice table of each column and the test over its values too."""

    KEY: ClassVar[str] = SliceRows.KEY
    STATE = SliceRows

    def __init__(self, by: tuple[str, ...] = ()) -> None:
        self.by = tuple(by)

    def new_state(self) -> SliceRows:
        return SliceRows(self.by)

    def record(self, state: SliceRows | None, run: RunFacts) -> SlicesRecord | None:
        if state is None or not state.given:
            return None
        found = analyse(state)
        return SlicesRecord(found.tables, None if found.best is None else found.best.what)

    def findings(self, state: SliceRows | None, run: RunFacts) -> list[Finding]:
        if state is None:
            return []
        found = analyse(state)
        for column in found.left_out:
            from rcdiag.runtime.notices import notify

            notify(
                f"column '{column}' is named like a replica column but holds more than {MAX_VALUES:,} distinct values: "
                "no replica is tested by it (blocks of rows are, instead)"
            )
        best = found.best
        if best is None:
            return []
        test = best.test
        share, tokens = found.dump_share
        whole = f" ({share:.1%} of the whole dump's, with {tokens:.1%} of its tokens)" if best.scope else ""
        facts = (
            f"{best.what} carry {test.share:.1%} of the mismatch{best.scope} (k3, token ratios capped at e^3) with "
            f"{test.token_share:.1%} of the valid tokens{whole}: k3 per token {test.mean:.3g}, {test.ratio:.3g}x the "
            f"other rows' {test.rest:.3g} ({_z(test.z)} standard errors, responses as the units; critical "
            f"{found.critical:.3g} over {found.tests} slices tested)"
        )
        if found.version_text:
            facts += f"; {found.version_text}"
        code = Code.SLICE_STALE if found.versions == "stale" else Code.SLICE_CONCENTRATED
        return [emit(code, facts, value=test.ratio, threshold=RATIO_MIN)]


def _z(z: float) -> str:
    return f"{z:.3g}" if math.isfinite(z) else "infinitely many"
