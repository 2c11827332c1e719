"""Per-rank training dumps, ``train_data/{rollout_id}_{rank}.pt``: Miles' ``--dump-details`` and slime's before
format 2 (``--save-debug-train-data`` with ``{rollout_id}_{rank}``), joined into one rollout as Miles joins them.

Every rank writes ``{"rollout_id", "rank", "rollout_data": {per-sample lists}}``; Miles adds ``cp_rank``,
``cp_size`` and ``qkv_format`` (``miles/utils/train_dump_utils.py:24-44`` at radixark/miles 31f1ca96). Data-parallel
ranks hold different samples, tensor-parallel ranks copies of the same ones, and with context parallelism each rank
holds only its zigzag slice of the per-token fields (``log_probs``, ``rollout_log_probs``, ...) beside full-length
``loss_masks``. So one rank's file is never a rollout: the rank files of a rollout are read together, rows joined
by ``sample_indices`` (a copy read once, the lowest rank's: Miles' ``chunks.setdefault``), and each per-token field
stitched from its ranks' slices with the inverse of Miles' split (``cp_utils.py:19-67`` for the offsets,
``:440-472`` ``assemble_log_prob_from_cp``, as ``miles/dashboard/dump_reader.py:233-282`` does). A missing rank,
a slice no offsets place, or a slice in a file that records no ``cp_rank`` is an error naming the file and rank:
never a slice read as a whole response.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rcdiag.io import storage
from rcdiag.io.limits import ROW_TOKENS
from rcdiag.io.paths import natural_key
from rcdiag.io.storage import FilePath, RemotePath
from rcdiag.runtime.errors import InputError

RANK_FILE = re.compile(r"^(\d+)_(\d+)\.pt$")
"""``{rollout_id}_{rank}.pt``: the name Miles' and slime's ``--dump-details`` give each rank's train data."""
TRAIN_DATA = "train_data"
"""The ``--dump-details`` subfolder (Miles', slime's) holding the training dump; its other subfolders (``rollout_data``,
``trajectory``, ``dashboard_columns``, ``events``) hold the rollout side, which rcdiag cannot analyse."""

ROLES = ("log_probs", "rollout_log_probs", "loss_masks")
"""The per-sample fields rcdiag reads: each holds one value per response token."""
CP_SHARDED = ("log_probs", "rollout_log_probs", "ref_log_probs", "entropy", "ref_entropy", "advantages", "returns")
"""Per-token fields each context-parallel rank holds its slice of (``miles/dashboard/dump_reader.py:132-140``)."""


def file_path(path: str | FilePath) -> FilePath:
    """``path`` as a local ``Path`` or a ``RemotePath``."""
    if isinstance(path, (Path, RemotePath)):
        return path
    text = storage.local_path(path)
    return storage.parse(text) if storage.is_remote(text) else Path(text)


def rollout_and_rank(path: str | FilePath) -> tuple[int, int] | None:
    """``(rollout id, rank)`` from a rank file's name, or ``None`` for any other name."""
    match = RANK_FILE.match(file_path(path).name)
    return (int(match.group(1)), int(match.group(2))) if match else None


def unit_of(name: str) -> tuple[str, int, int] | None:
    """``(directory, rollout id, rank)`` of a rank file named ``name`` (a ``/``-separated path), ``None`` for any
    other name: the rank files sharing a directory and rollout id are one unit, read together."""
    directory, _, base = name.rpartition("/")
    match = RANK_FILE.match(base)
    return (directory, int(match.group(1)), int(match.group(2))) if match else None


def leaders(files: Sequence[FilePath]) -> list[FilePath]:
    """The files to open: one rank file per rollout and directory (the lowest rank; it reads the others), every
    other file as it is, in the given order."""
    seen: set[tuple[str, int]] = set()
    kept = []
    for file in sorted(files, key=lambda f: (natural_key(f.parent), (rollout_and_rank(f) or (0, 0))[1])):
        named = rollout_and_rank(file)
        if named is not None:
            key = (str(file.parent), named[0])
            if key in seen:
                continue
            seen.add(key)
        kept.append(file)
    order = {str(f): i for i, f in enumerate(files)}
    return sorted(kept, key=lambda f: order[str(f)])


def rollout_files(path: str | FilePath) -> list[str]:
    """Every rank file of the rollout ``path`` belongs to, in rank order (``path`` alone for another name)."""
    file = file_path(path)
    named = rollout_and_rank(file)
    if named is None:
        return [str(path)]
    if isinstance(file, RemotePath):
        names = [p.name for p, below in storage.listing(file.parent) if len(below) == 1]
    else:
        names = os.listdir(file.parent)
    ranks = sorted(
        rank
        for name in names
        if (found := rollout_and_rank(Path(name))) is not None and found[0] == named[0]
        for rank in (found[1],)
    )
    return [str(file.parent / f"{named[0]}_{rank}.pt") for rank in ranks] or [str(path)]


class Pack:
    """One rank file: its rank, context-parallel position and per-sample columns (numpy)."""

    def __init__(self, path: str, obj: dict[str, Any], convert: Callable[[Any, str, str], Any]) -> None:
        """``obj`` as ``torch.load`` gave it (format 1's shape); ``convert(value, key, path)`` makes its tensors
        numpy."""
        self.path = path
        data = obj.get("rollout_data")
        if not isinstance(data, dict):
            raise InputError(
                "is named as a rank file of a training dump ({rollout_id}_{rank}.pt, as Miles and slime name them) "
                "but holds no 'rollout_data'; rename it to read it alone",
                path=path,
            )
        self.rank = _whole(obj.get("rank", (rollout_and_rank(path) or (0, 0))[1]), "rank", path)
        self.cp_size = _whole(obj.get("cp_size", 1), "cp_size", path)
        self.cp_rank = _whole(obj.get("cp_rank", 0), "cp_rank", path)
        self.recorded = "cp_size" in obj
        if self.cp_size < 1 or not 0 <= self.cp_rank < self.cp_size:
            raise InputError(f"holds cp_rank {self.cp_rank} of cp_size {self.cp_size}", path=path)
        self.qkv_format = obj.get("qkv_format", "thd")
        if self.qkv_format not in ("thd", "bshd"):
            raise InputError(f"holds qkv_format {self.qkv_format!r}; Miles writes 'thd' or 'bshd'", path=path)
        self.data = {str(k): convert(v, str(k), path) for k, v in data.items()}
        lengths = self.data.get("response_lengths")
        self.has_lengths = lengths is not None
        counted = lengths if lengths is not None else next((self.data[k] for k in ROLES if k in self.data), None)
        if not isinstance(counted, (list, np.ndarray)):
            raise InputError(
                "holds no per-sample 'response_lengths', 'log_probs' or 'rollout_log_probs' in 'rollout_data'; is it "
                "a training dump?",
                path=path,
            )
        self.rows = len(counted)
        indices = self.data.get("sample_indices")
        self.samples = [_whole(i, "sample_indices", path) for i in indices] if indices is not None else None
        if self.samples is not None and len(self.samples) != self.rows:
            raise InputError(
                f"holds {len(self.samples)} sample_indices for {self.rows} samples (response_lengths)", path=path
            )
        if self.samples is not None and len(set(self.samples)) != self.rows:
            twice = next(i for i, n in Counter(self.samples).items() if n > 1)
            raise InputError(f"holds sample_indices {twice} twice; each sample is one row of a rank file", path=path)

    def per_sample(self, key: str, row: int) -> Any:
        values = self.data.get(key)
        if values is None:
            return None
        if not isinstance(values, (list, np.ndarray)) or len(values) != self.rows:
            raise InputError(
                f"holds '{key}' of {len(values) if isinstance(values, (list, np.ndarray)) else type(values).__name__}"
                f" entries for {self.rows} samples; every per-sample field needs one entry per sample",
                path=self.path,
            )
        return values[row]


def join(packs: Sequence[Pack], path: str) -> dict[str, list]:
    """The rollout's samples (by sample index) as full-length per-sample columns: ``loss_masks`` and the other
    full-length fields from the lowest rank holding the sample, each context-parallel field stitched."""
    if len(packs) > 1 and any(p.samples is None for p in packs):
        bare = next(p for p in packs if p.samples is None)
        raise InputError(
            f"holds no 'sample_indices', so rcdiag cannot tell copies (tensor parallel) from other samples (data "
            f"parallel) among the {len(packs)} rank files of its rollout",
            path=bare.path,
        )
    where: dict[int, list[tuple[Pack, int]]] = {}
    for pack in packs:
        for row in range(pack.rows):
            where.setdefault(pack.samples[row] if pack.samples is not None else row, []).append((pack, row))
    keys = [k for k in packs[0].data if k not in CP_SHARDED and _is_per_token(packs[0], k)]
    out: dict[str, list] = {key: [] for key in (*keys, *CP_SHARDED)}
    for sample in sorted(where):
        holders = where[sample]
        total, response = _lengths(holders, sample)
        first, row = holders[0]
        for key in keys:
            value = first.per_sample(key, row)
            if key in ROLES and response is not None and value.shape != (response,):
                raise InputError(
                    f"holds '{key}' of {value.shape[0]} values for sample {sample}, whose response has {response} "
                    "tokens (response_lengths)",
                    path=first.path,
                )
            out[key].append(value)
        for key in CP_SHARDED:
            out[key].append(_stitched(holders, key, sample, total, response))
    for key, values in out.items():
        absent = [i for i, v in enumerate(values) if v is None]
        if absent and len(absent) < len(values) and key in ROLES:
            raise InputError(
                f"holds no '{key}' for sample {sorted(where)[absent[0]]}, which other samples of its rollout have",
                path=path,
            )
    return {key: values for key, values in out.items() if values and all(v is not None for v in values)}


def _is_per_token(pack: Pack, key: str) -> bool:
    values = pack.data[key]
    return isinstance(values, list) and len(values) == pack.rows and all(isinstance(v, np.ndarray) for v in values)


def _lengths(holders: list[tuple[Pack, int]], sample: int) -> tuple[int | None, int | None]:
    """``(total, response)`` length of a sample, the same in every file holding it (``None`` where the files do not
    record it: a lone format-1 file may omit both; context-parallel slices need both)."""
    seen = []
    for pack, row in holders:
        stored = pack.per_sample("total_lengths", row)
        total = None if stored is None else _whole(stored, "total_lengths", pack.path)
        given = pack.per_sample("response_lengths", row) if pack.has_lengths else None
        response = None if given is None else _whole(given, "response_lengths", pack.path)
        if response is not None and (response < 0 or (total is not None and total < response)):
            raise InputError(f"holds sample {sample} of {response} response tokens in {total} tokens", path=pack.path)
        if response is not None:
            ROW_TOKENS.check(response, pack.path, f"sample {sample}'s response")
        seen.append((total, response, pack.path))
    for total, response, other in seen[1:]:
        if (total, response) != seen[0][:2]:
            raise InputError(
                f"says sample {sample} has {response} of {total} tokens but {seen[0][2]} says {seen[0][1]} of "
                f"{seen[0][0]}; the rank files of one rollout must agree (mixed or damaged dumps)",
                path=other,
            )
    return seen[0][0], seen[0][1]


def _stitched(holders: list[tuple[Pack, int]], key: str, sample: int, total: int | None, response: int | None) -> Any:
    """One sample's ``key`` at full response length: the lowest rank's copy of each context-parallel slice, put
    back in place; ``None`` when no file holds the field (pipeline stages before the last)."""
    found = [(pack, row) for pack, row in holders if pack.per_sample(key, row) is not None]
    if not found:
        return None
    pack, row = found[0]
    for holder, _ in found[1:]:
        if (holder.cp_size, holder.qkv_format) != (pack.cp_size, pack.qkv_format):
            raise InputError(
                f"holds cp_size {holder.cp_size} ({holder.qkv_format}) but {pack.path} holds cp_size {pack.cp_size} "
                f"({pack.qkv_format}); the rank files of one rollout must agree",
                path=holder.path,
            )
    if pack.cp_size == 1:
        value = np.asarray(pack.per_sample(key, row))
        if value.ndim != 1 or (response is not None and value.shape[0] != response):
            why = (
                "; a context-parallel slice, and the file records no cp_rank/cp_size to place it"
                if value.ndim == 1 and response is not None and value.shape[0] < response and not pack.recorded
                else ""
            )
            raise InputError(
                f"holds '{key}' of {value.shape[0] if value.ndim == 1 else value.shape} values for sample {sample}, "
                f"whose response has {response} tokens{why}; rcdiag does not guess which tokens they are",
                path=pack.path,
            )
        return value
    if total is None or response is None:
        raise InputError(
            f"holds context-parallel slices of sample {sample} but no 'total_lengths' and 'response_lengths' to place "
            "them",
            path=pack.path,
        )
    chunks: dict[int, np.ndarray] = {}
    files: dict[int, str] = {}
    for holder, at in found:
        if holder.cp_rank not in chunks:
            chunks[holder.cp_rank] = np.asarray(holder.per_sample(key, at))
            files[holder.cp_rank] = holder.path
    missing = sorted(set(range(pack.cp_size)) - set(chunks))
    if missing:
        raise InputError(
            f"holds context-parallel rank {pack.cp_rank} of {pack.cp_size} of sample {sample}'s '{key}', but no rank "
            f"file of its rollout holds cp_rank {missing[0]}"
            + (f" (nor {', '.join(map(str, missing[1:]))})" if missing[1:] else "")
            + "; a rank file is missing: copy every train_data/{rollout_id}_{rank}.pt of the rollout",
            path=pack.path,
        )
    max_len = None
    if pack.qkv_format == "bshd":
        max_len = _whole(pack.per_sample("max_seq_lens", row), "max_seq_lens", pack.path)
    what = f"sample {sample}'s '{key}'"
    return assemble(chunks, total, response, pack.cp_size, pack.qkv_format, max_len, files, what)


def logit_ranges(
    total: int, response: int, cp_rank: int, cp_size: int, qkv_format: str, max_seq_len: int | None
) -> tuple[tuple[int, int], tuple[int, int]]:
    """The two ``[lo, hi)`` logit ranges (from the prompt's start) context-parallel rank ``cp_rank`` holds: Miles'
    ``get_logits_and_tokens_offset_with_cp`` (``cp_utils.py:19-67``), its zigzag split of the sequence into
    ``2 * cp_size`` chunks, rank ``r`` holding chunks ``r`` and ``2 * cp_size - 1 - r``."""
    prompt = total - response
    size = (total if qkv_format == "thd" else max_seq_len or 0) + 2 * cp_size - 1
    chunk = size // (2 * cp_size)
    chunks = (
        (cp_rank * chunk, (cp_rank + 1) * chunk),
        ((2 * cp_size - cp_rank - 1) * chunk, (2 * cp_size - cp_rank) * chunk),
    )
    ranges = []
    for start, stop in chunks:
        lo, hi = max(start, prompt - 1), min(stop, total - 1)
        ranges.append((lo, hi) if lo < hi else (0, 0))
    return ranges[0], ranges[1]


def assemble(
    chunks: dict[int, np.ndarray],
    total: int,
    response: int,
    cp_size: int,
    qkv_format: str,
    max_seq_len: int | None,
    files: dict[int, str],
    what: str,
) -> np.ndarray:
    """One response from its context-parallel slices: Miles' ``assemble_log_prob_from_cp`` (``cp_utils.py:440-472``),
    each slice (from ``files[cp_rank]``) checked to fill exactly its ranges and the ranges to tile the response
    once."""
    prompt = total - response
    placed = []
    for cp_rank, chunk in sorted(chunks.items()):
        ranges = logit_ranges(total, response, cp_rank, cp_size, qkv_format, max_seq_len)
        widths = [max(hi - lo, 0) for lo, hi in ranges]
        if chunk.ndim != 1 or chunk.shape[0] != sum(widths):
            raise InputError(
                f"holds {chunk.shape[0] if chunk.ndim == 1 else chunk.shape} values of {what} at cp_rank {cp_rank} "
                f"of {cp_size}, where Miles' zigzag split of {total} tokens ({response} of them the response, "
                f"{qkv_format}) places {sum(widths)}; the file is not Miles' dump of that sample",
                path=files[cp_rank],
            )
        placed.append((chunk, ranges, widths))
    out = np.zeros(response, dtype=np.result_type(*chunks.values()))
    covered = np.zeros(response, dtype=np.int64)
    for chunk, ranges, widths in placed:
        taken = 0
        for (lo, _), width in zip(ranges, widths, strict=True):
            if width:
                start = lo - (prompt - 1)
                if start < 0 or start + width > response:
                    raise InputError(f"holds a context-parallel slice of {what} outside its response", path=files[0])
                out[start : start + width] = chunk[taken : taken + width]
                covered[start : start + width] += 1
                taken += width
    if not np.all(covered == 1):
        raise InputError(f"holds context-parallel slices of {what} that do not tile its response", path=files[0])
    return out


def _whole(value: Any, key: str, path: str) -> int:
    """An integer field (a number, a 0-d array or a one-element list), else an ``InputError`` naming it."""
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.reshape(()).item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise InputError(f"holds {key} {value!r}, expected a whole number", path=path)
    return int(value)
