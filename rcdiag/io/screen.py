"""Value checks on the valid tokens of each chunk: what is not a log-prob never silently becomes a metric.

``Screen`` runs between the reader and the engine. A row is *bad* when, at a valid position (mask 1), a log-prob
is NaN, +inf or above ``POSITIVE_TOLERANCE``, or when its mask holds a value other than 0/1. By default the
first bad row is an ``InputError`` naming it, its column and how many rows of the dump are bad (the rest of the
dump is still read, to count them); with ``on_bad_row="skip"`` bad rows are dropped whole before any metric sees
them and counted by reason. ``-inf`` (probability 0) is legal; such tokens are counted.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from rcdiag.io.base import Chunk
from rcdiag.io.ragged import take_rows
from rcdiag.io.record_batches import exact_steps
from rcdiag.runtime.errors import InputError

POSITIVE_TOLERANCE = 1e-3
"""A log-prob above this is not a log-prob (probabilities, logits or a sign error); see docs/formats.md."""

REASONS = ("bad_mask", "nan", "pos_inf", "positive_logprob")
"""Why a row is bad, in the order used when a row has several problems (it is counted under the first)."""


class OnBadRow(str, enum.Enum):
    """What to do with a row holding invalid values."""

    error = "error"
    skip = "skip"

    def __str__(self) -> str:
        return self.value


@dataclass
class ScreenStats:
    """What the screen saw: rows skipped by reason and ``-inf`` tokens per side."""

    rows_read: int = 0
    skipped_by_reason: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    neg_inf_tokens: dict[str, int] = field(default_factory=lambda: {"old_log_prob": 0, "rollout_log_prob": 0})
    neg_inf_first: dict[str, list[int]] = field(default_factory=dict)
    """Per side, ``[row, position]`` of the first ``-inf`` at a valid token (the earliest row wins a merge)."""

    @property
    def skipped_rows(self) -> int:
        return sum(self.skipped_by_reason.values())

    def merge(self, other: ScreenStats) -> ScreenStats:
        """The counts of two screens together (parallel workers, merged shard states)."""
        return ScreenStats(
            rows_read=self.rows_read + other.rows_read,
            skipped_by_reason={k: v + other.skipped_by_reason.get(k, 0) for k, v in self.skipped_by_reason.items()},
            neg_inf_tokens={k: v + other.neg_inf_tokens.get(k, 0) for k, v in self.neg_inf_tokens.items()},
            neg_inf_first={
                k: min(at for at in (self.neg_inf_first.get(k), other.neg_inf_first.get(k)) if at is not None)
                for k in {*self.neg_inf_first, *other.neg_inf_first}
            },
        )

    def to_dict(self) -> dict:
        """Plain data, for state files and worker processes."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ScreenStats:
        """Inverse of ``to_dict``."""
        return cls(
            rows_read=int(data["rows_read"]),
            skipped_by_reason={k: int(v) for k, v in data["skipped_by_reason"].items()},
            neg_inf_tokens={k: int(v) for k, v in data["neg_inf_tokens"].items()},
            neg_inf_first={k: [int(v) for v in at] for k, at in data.get("neg_inf_first", {}).items()},
        )


@dataclass
class Problem:
    """The first bad row: where it is and what it holds."""

    where: dict
    column: str
    what: str
    position: int | None


class Screen:
    """Check every chunk; drop or report bad rows; make masks boolean."""

    def __init__(
        self,
        on_bad_row: OnBadRow | str = OnBadRow.error,
        *,
        verdict_at_end: bool = True,
        vocab_size: int | None = None,
        compiled: bool = True,
    ) -> None:
        """``verdict_at_end=False`` leaves the final error to the caller (``raise_for_bad_rows``): a worker
        screening one part of a dump cannot tell how many rows of the whole dump are bad, or whether all are.
        ``vocab_size``: token ids (when read) must be below it. ``compiled=False``: the numpy forms of the screen's
        kernels (a small dump, ``rcdiag.kernels.small``; the same answers)."""
        self.compiled = compiled
        self.on_bad_row = OnBadRow(on_bad_row)
        self.vocab_size = vocab_size
        self.stats = ScreenStats()
        self.first: Problem | None = None
        self.verdict_at_end = verdict_at_end

    def __call__(self, chunks: Iterable[Chunk]) -> Iterator[Chunk]:
        for chunk in chunks:
            self.stats.rows_read += chunk.n_rows
            clean = self.screen(chunk)
            if clean is not None and self.first is None and clean.n_rows:
                yield clean
        if self.verdict_at_end:
            raise_for_bad_rows(self.first, self.stats)

    def screen(self, chunk: Chunk) -> Chunk | None:
        """The chunk with a boolean mask and without bad rows (``None`` once an error is pending)."""
        lengths = np.diff(chunk.offsets)
        valid, bad_mask = _valid(chunk.mask)
        if chunk.tokens is not None:
            check_token_ids(chunk, valid, self.vocab_size, self.compiled)
        flagged: dict[int, np.ndarray] = {}
        if bad_mask is not None:
            flagged[1] = bad_mask
        for values, key in ((chunk.old, "old_log_prob"), (chunk.rollout, "rollout_log_prob")):
            if not values.size:
                continue
            # Fast paths, one pass each: no value anywhere (padding included) above the tolerance or NaN, and
            # no -inf anywhere. Only when they fail are the valid positions looked at one by one.
            low, high = _range(values, self.compiled)
            if not high <= POSITIVE_TOLERANCE:
                ok = values <= POSITIVE_TOLERANCE
                if valid is not None:
                    ok |= ~valid
                if not ok.all():
                    bad = ~ok
                    for code, hit in ((2, np.isnan(values)), (3, values == np.inf), (4, values > POSITIVE_TOLERANCE)):
                        flagged[code] = flagged[code] | (bad & hit) if code in flagged else bad & hit
            if not low > -np.inf:  # NaN also takes this path
                neg_inf = values == -np.inf
                if valid is not None:
                    neg_inf &= valid
                count = int(np.count_nonzero(neg_inf))
                self.stats.neg_inf_tokens[key] += count
                if count and key not in self.stats.neg_inf_first:
                    index = int(np.argmax(neg_inf))
                    row = int(np.searchsorted(chunk.offsets, index, side="right")) - 1
                    self.stats.neg_inf_first[key] = [chunk.first_row + row, index - int(chunk.offsets[row])]
        reasons = np.zeros(lengths.shape[0], dtype=np.int8)  # 0 = fine, else 1 + index in REASONS
        for code in sorted(flagged):
            rows = _rows_with(flagged[code], chunk.offsets, lengths)
            reasons[rows & (reasons == 0)] = code
        bad_rows = np.flatnonzero(reasons)
        if bad_rows.size:
            counts = np.bincount(reasons[bad_rows], minlength=len(REASONS) + 1)
            for i, reason in enumerate(REASONS):
                self.stats.skipped_by_reason[reason] += int(counts[i + 1])
            if self.on_bad_row is OnBadRow.error:
                if self.first is None:
                    self.first = _describe(chunk, int(bad_rows[0]), int(reasons[bad_rows[0]]), valid)
                return None
            kept = dataclasses.replace(chunk, mask=valid, screened=True)
            return take_rows(kept, np.flatnonzero(reasons == 0))
        return dataclasses.replace(chunk, mask=valid, screened=True)


def check_token_ids(chunk: Chunk, valid: np.ndarray | None, vocab_size: int | None, compiled: bool = True) -> None:
    """Token ids at valid positions are 0 or more, and below ``vocab_size`` when given (padding may hold anything,
    as for log-probs); the first that is not is an ``InputError`` naming its row, column and position. A wrong id
    is a broken dump rather than a bad value in one row, so ``--on-bad-row skip`` does not apply."""
    tokens = chunk.tokens
    assert tokens is not None
    if not tokens.size:
        return
    from rcdiag.kernels.arrays import id_array

    valid_range: Callable[[np.ndarray, np.ndarray], tuple[int, int, int]]
    if compiled:
        from rcdiag.kernels.token_ids import valid_range
    else:
        from rcdiag.kernels.small import valid_range

    flags = np.zeros(0, dtype=np.uint8) if valid is None else np.ascontiguousarray(valid).view(np.uint8)
    low, high, _ = valid_range(id_array(tokens), flags)
    if low >= 0 and (vocab_size is None or high < vocab_size):
        return
    bad = (tokens < 0) if vocab_size is None else ((tokens < 0) | (tokens >= vocab_size))
    if valid is not None:
        bad &= valid
    at = int(np.flatnonzero(bad)[0])
    row = int(np.searchsorted(chunk.offsets, at, side="right") - 1)
    value = int(tokens[at])
    why = "token ids are 0 or more" if value < 0 else f"beyond the vocabulary (--vocab-size {vocab_size:,})"
    raise InputError(
        f"holds the token id {value} at valid position {at - int(chunk.offsets[row])} of the response; {why}",
        column=chunk.token_name,
        **chunk.where(row),
    )


def raise_for_bad_rows(first: Problem | None, stats: ScreenStats) -> None:
    """The end of a screen: the first bad row (in error mode) with the count over the whole dump, or every row
    skipped; nothing otherwise."""
    breakdown = ", ".join(f"{k} {v}" for k, v in stats.skipped_by_reason.items() if v)
    if first is not None:
        at = f" at valid position {first.position} of the response" if first.position is not None else ""
        # skipping is advised only when it leaves rows to analyse: with every row bad it would be refused below
        remedy = (
            f"every row of the dump is bad ({stats.skipped_rows} rows: {breakdown}), so skipping bad rows would "
            "leave nothing to analyze; fix the dump"
            if stats.skipped_rows == stats.rows_read
            else f"{stats.skipped_rows} row(s) of the dump are bad ({breakdown}); fix the dump, or pass --on-bad-row "
            "skip to leave those rows out"
        )
        raise InputError(f"holds {first.what}{at}; {remedy}", column=first.column, **first.where)
    if stats.rows_read and stats.skipped_rows == stats.rows_read:
        raise InputError(f"every row was skipped ({stats.skipped_rows} rows: {breakdown}); there is nothing to analyze")


def _range(values: np.ndarray, compiled: bool = True) -> tuple[float, float]:
    """(min, max) of the values, NaN-propagating enough for the fast paths: a NaN makes one of them NaN."""
    if values.dtype == np.float32 and compiled:
        from rcdiag.kernels.screen import value_range

        return value_range(values)
    return float(values.min()), float(values.max())


def _valid(mask: np.ndarray | None) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``(boolean mask, positions holding values other than 0/1)``."""
    if mask is None:
        return None, None
    if mask.dtype == np.bool_:
        return mask, None
    if mask.size and mask.dtype.kind in "iu" and mask.min() >= 0 and mask.max() <= 1:
        # 0/1 integers: one byte wide, they already are a valid boolean array (no copy); wider ones convert.
        return (mask.view(np.bool_) if mask.dtype.itemsize == 1 else mask.astype(np.bool_)), None
    ones = mask == 1
    bad = ~(ones | (mask == 0))
    return ones, (bad if bad.any() else None)


def _rows_with(token_flags: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Rows holding at least one flagged token."""
    rows = np.zeros(lengths.shape[0], dtype=bool)
    if token_flags.any():
        nonempty = lengths > 0
        rows[nonempty] = np.logical_or.reduceat(token_flags, offsets[:-1][nonempty])
    return rows


def _describe(chunk: Chunk, row: int, code: int, valid: np.ndarray | None) -> Problem:
    lo, hi = int(chunk.offsets[row]), int(chunk.offsets[row + 1])
    where = chunk.where(row)
    if code == 1:
        assert chunk.mask is not None  # code 1 is a mask value other than 0 and 1
        values = chunk.mask[lo:hi]
        position = int(np.flatnonzero((values != 0) & (values != 1))[0])
        value = values[position]
        shown = int(value) if float(value).is_integer() else float(value)
        return Problem(where, chunk.mask_name, f"the mask value {shown} (a mask must be 0 or 1)", position)
    nulls = chunk.nulls or (None, None)
    for values, name, held in zip((chunk.old, chunk.rollout), chunk.column_names, nulls, strict=True):
        row_values = values[lo:hi]
        row_valid = np.ones(hi - lo, dtype=bool) if valid is None else valid[lo:hi]
        tests = {
            2: np.isnan(row_values),
            3: row_values == np.inf,
            4: row_values > POSITIVE_TOLERANCE,
        }
        hits = np.flatnonzero(tests[code] & row_valid)
        if hits.size:
            position = int(hits[0])
            value = float(row_values[position])
            null = code == 2 and held is not None and bool(held[lo + position])
            what = {
                2: "null (a non-finite value written as null)" if null else "NaN",
                3: "+inf",
                4: f"a positive log-prob ({value:.6g}); log-probs are <= 0 (is this column probabilities or logits?)",
            }[code]
            return Problem(where, name, what, position)
    raise AssertionError("a bad row without a bad value")  # pragma: no cover


def screen_one(chunk: Chunk) -> Chunk:
    """A chunk that did not pass through a ``Screen`` (built by hand and given to the engine), checked as the
    screen checks a dump: its layout (``as_chunk``), then its values; the first bad row is an ``InputError``."""
    chunk = as_chunk(chunk)
    screen = Screen(OnBadRow.error)
    screen.stats.rows_read = chunk.n_rows
    clean = screen.screen(chunk)
    raise_for_bad_rows(screen.first, screen.stats)
    assert clean is not None  # no bad row, or raise_for_bad_rows raised
    return clean


def as_chunk(chunk: Chunk, index: int | None = None) -> Chunk:
    """A hand-built chunk (``rcdiag.analyze_chunks``) in the layout readers produce: numpy arrays (torch tensors
    and lists are converted), float32 log-probs, int64 offsets that cover the values exactly. 2-D arrays with
    ``offsets=None`` are the rows of a padded batch. Anything else is an ``InputError`` saying what is wrong."""
    name = "chunk" if index is None else f"chunk {index}"
    if not isinstance(chunk, Chunk):
        raise InputError(f"is a {type(chunk).__name__}, not an rcdiag.Chunk", path=name)
    where = chunk.source or name
    old, rollout = _array(chunk.old, "old", where), _array(chunk.rollout, "rollout", where)
    mask = None if chunk.mask is None else _array(chunk.mask, "mask", where)
    offsets, steps = chunk.offsets, chunk.steps
    if offsets is None:
        if old.ndim != 2:
            raise InputError(
                "has offsets=None: give offsets (row i is old[offsets[i]:offsets[i+1]]) with 1-D values, or 2-D "
                "(rows x positions) values for a padded batch",
                path=where,
            )
        offsets = np.arange(old.shape[0] + 1, dtype=np.int64) * old.shape[1]
        old, rollout = old.reshape(-1), rollout.reshape(-1) if rollout.ndim == 2 else rollout
        mask = mask.reshape(-1) if mask is not None and mask.ndim == 2 else mask
    offsets = _array(offsets, "offsets", where)
    for name, values in (("old", old), ("rollout", rollout), ("mask", mask), ("offsets", offsets)):
        if values is not None and values.ndim != 1:
            raise InputError(f"'{name}' has shape {values.shape}; a chunk holds flat (1-D) arrays", path=where)
    if rollout.shape != old.shape or (mask is not None and mask.shape != old.shape):
        shapes = f"old {old.shape[0]}, rollout {rollout.shape[0]}" + ("" if mask is None else f", mask {mask.shape[0]}")
        raise InputError(f"holds arrays of different lengths ({shapes}); they need one value per token", path=where)
    if old.dtype.kind != "f" or rollout.dtype.kind != "f":
        raise InputError(f"holds log-probs of type {old.dtype}/{rollout.dtype}; they must be floats", path=where)
    if offsets.dtype.kind not in "iu" or not offsets.size or offsets[0] != 0 or offsets[-1] != old.shape[0]:
        raise InputError(
            f"has offsets that do not cover the values (they must be integers from 0 to {old.shape[0]}, the number "
            "of values)",
            path=where,
        )
    if (np.diff(offsets) < 0).any():
        raise InputError("has decreasing offsets; row i is old[offsets[i]:offsets[i+1]]", path=where)
    tokens = None if chunk.tokens is None else _array(chunk.tokens, "tokens", where)
    if tokens is not None and (tokens.shape != old.shape or tokens.dtype.kind not in "iu"):
        raise InputError(f"has 'tokens' that are not one integer token id per value ({old.shape[0]})", path=where)
    if mask is not None and mask.dtype.kind not in "biuf":
        raise InputError(f"has a mask of type {mask.dtype}; a mask holds 0/1 or booleans", path=where)
    if steps is not None:
        steps = _array(steps, "steps", where)
        if steps.shape != (offsets.shape[0] - 1,) or steps.dtype.kind not in "iu":
            raise InputError("has 'steps' that are not one integer per row", path=where)
        steps = exact_steps(steps)
    return dataclasses.replace(
        chunk,
        old=old.astype(np.float32, copy=False),
        rollout=rollout.astype(np.float32, copy=False),
        offsets=offsets.astype(np.int64, copy=False),
        mask=mask,
        steps=steps,
        source=where,
        tokens=None if tokens is None else tokens.astype(np.int64, copy=False),
    )


def _array(values: object, name: str, where: str) -> np.ndarray:
    """numpy from numpy, torch (any device or dtype) or a list."""
    if hasattr(values, "detach"):  # a torch tensor
        tensor = values.detach().cpu()
        if tensor.is_floating_point() and tensor.element_size() < 4:  # bfloat16 / float16: numpy has no bfloat16
            tensor = tensor.float()
        return tensor.numpy()
    try:
        return np.asarray(values)
    except (TypeError, ValueError) as exc:
        raise InputError(f"'{name}' is not an array ({exc})", path=where) from None
