"""Which column holds what: flags first, then the names trainers actually use, never a guess between two.

A dump from verl says ``old_log_probs``, NeMo-RL ``prev_logprobs``, prime-rl ``trainer_logprobs``; all mean the
trainer's per-token log-probs. ``resolve`` maps a dump's column names onto rcdiag's five roles. A role named by
the user must exist; otherwise exactly one alias may match, and two matches are an error naming both.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rcdiag.io.base import ColumnMap
from rcdiag.runtime.errors import InputError

ALIASES: dict[str, tuple[str, ...]] = {
    "old": (
        "old_log_prob", "old_log_probs", "old_logprob", "old_logprobs", "prev_logprobs", "prev_log_probs",
        "trainer_logprobs", "trainer_log_probs", "train_log_prob", "train_log_probs", "training_logprobs",
        "old_per_token_logps",
    ),
    "rollout": (
        "rollout_log_prob", "rollout_log_probs", "rollout_logprob", "rollout_logprobs", "generation_logprobs",
        "generation_log_probs", "inference_logprobs", "inference_log_probs", "sampling_logprobs",
        "sampling_per_token_logps",
    ),
    "mask": (
        "response_mask", "response_masks", "loss_mask", "loss_masks", "token_loss_mask", "completion_mask",
        "action_mask",
    ),
    "step": ("step", "global_step", "train_step", "training_step"),
    "seq": ("seq_id", "sequence_id", "seq_idx", "sample_id", "sample_idx", "response_id"),
    # verl's batch ``responses``; NeMo-RL's and prime-rl's ``token_ids`` (their log-probs cover the same positions)
    # optional loss inputs (read for ``--as``): the advantages, and the current policy's log-probs (verl's actor
    # ``log_prob``, TRL's ``per_token_logps``), which no trainer names like the old policy's
    "advantages": ("advantages", "advantage", "token_advantages"),
    "current": ("log_prob", "current_log_prob", "current_log_probs", "current_logprobs", "per_token_logps"),
    "token": ("responses", "response_ids", "response_token_ids", "token_ids", "output_ids", "output_token_ids",
              "completion_ids"),
}  # fmt: skip
"""Recognised names per role, exact and case-sensitive."""

ID_ALIASES = ("uid", "sample_id", "prompt_id")
"""Per-response id columns, in order of preference (list layouts; the long layout's id is its sequence id)."""

LABEL_ALIASES: dict[str, tuple[str, ...]] = {
    "replica": ("replica", "replica_id", "replica_rank", "rank", "dp_rank", "worker", "worker_id", "worker_rank",
                "engine_id", "engine_rank", "server_id", "gpu", "gpu_id", "device_id"),
    "policy_version": ("policy_version", "weight_version", "weights_version", "model_version", "param_version",
                       "rollout_version", "policy_lag", "staleness"),
}  # fmt: skip
"""Per-row columns read on every run when the dump has them (exact names): which engine replica, worker or GPU
produced a row, and which policy version sampled it (the verdict's ``replica`` class and its staleness split)."""


def label_role(name: str) -> str | None:
    """``"replica"`` or ``"policy_version"`` for a column named like one (``LABEL_ALIASES``), else ``None``."""
    return next((role for role, names in LABEL_ALIASES.items() if name in names), None)


ROLE_FLAGS = {"old": "--old-col", "rollout": "--rollout-col", "mask": "--mask-col", "step": "--step-col",
              "seq": "--seq-col", "token": "--token-col", "advantages": "--advantages-col",
              "current": "--current-col"}  # fmt: skip
ROLE_KEYS = {"old": "old_log_prob", "rollout": "rollout_log_prob", "mask": "response_mask", "step": "step",
             "seq": "seq_id"}  # fmt: skip
"""Canonical names: the keys of ``InputFacts.columns``."""
_WHAT = {
    "old": "the trainer's per-token log-probs",
    "rollout": "the rollout engine's per-token log-probs",
    "mask": "the response mask",
    "step": "the training step",
    "seq": "the sequence id",
    "token": "the token ids",
    "advantages": "the advantages",
    "current": "the current policy's log-probs",
}
LOSS_INPUTS = {"advantages": "advantages", "current": "log_prob"}
"""The optional loss-input roles -> their canonical names (``Chunk.loss_inputs`` keys, ``InputFacts.columns``)."""


@dataclass(frozen=True)
class Resolved:
    """The column used for each role (``None``: the optional role is absent)."""

    old: str
    rollout: str
    mask: str | None
    step: str | None
    seq: str | None
    id: str | None = None
    """The per-response id column (``None``: the dump has none)."""
    token: str | None = None
    """The per-token id column (``None``: the dump has none); read only with ``--explain``."""
    advantages: str | None = None
    """The advantages column (``None``: the dump has none); read for ``--as``."""
    current: str | None = None
    """The current policy's log-prob column (``None``: the dump has none); read for ``--as``."""
    labels: tuple[str, ...] = ()
    """Per-row label columns read: those given with ``--by``, then those named like a replica or a policy version
    (``LABEL_ALIASES``)."""

    def used(self, long: bool) -> dict[str, str | None]:
        """``InputFacts.columns``: canonical role name -> column used."""
        out = {ROLE_KEYS[r]: getattr(self, r) for r in ("old", "rollout", "mask", "step")}
        if long:
            out["seq_id"] = self.seq
        if self.id is not None and not (long and self.id == self.seq):
            out["id"] = self.id
        for role, key in LOSS_INPUTS.items():
            if getattr(self, role) is not None:
                out[key] = getattr(self, role)
        return out

    def loss_inputs(self) -> dict[str, str]:
        """Canonical loss-input name -> the column holding it, for those the dump has."""
        return {key: name for role, key in LOSS_INPUTS.items() if (name := getattr(self, role)) is not None}


def resolve(
    names: Iterable[str],
    columns: ColumnMap | None,
    path: str,
    *,
    extra: Mapping[str, tuple[str, ...]] | None = None,
    need_seq: bool | str = False,
) -> Resolved:
    """Pick a column for every role; ``extra`` adds format-specific aliases (e.g. slime's ``log_probs``);
    ``need_seq``: the long layout's sequence id is required (a string: why, for the error)."""
    present = list(names)
    columns = columns or ColumnMap()
    chosen: dict[str, str | None] = {}
    for role in ("old", "rollout", "mask", "step", "seq", "token", "advantages", "current"):
        given = getattr(columns, role)
        if given is not None:
            if given not in present:
                raise InputError(
                    f"has no column '{given}' (given with {ROLE_FLAGS[role]}); columns present: {_list(present)}",
                    path=path,
                )
            chosen[role] = given
            continue
        aliases = ALIASES[role] + tuple((extra or {}).get(role, ()))
        taken = {v for v in chosen.values() if v is not None}
        found = [name for name in present if name in aliases and name not in taken]
        if len(found) > 1:
            raise InputError(
                f"has several columns that could hold {_WHAT[role]}: {_list(found)}; pick one with "
                f"{ROLE_FLAGS[role]} NAME",
                path=path,
            )
        if (not found and role in ("old", "rollout")) or (role == "seq" and need_seq and not found):
            claimed = [name for name in present if name in aliases and name in taken]
            if claimed:  # the only candidate already plays another role (e.g. --old-col rollout_log_prob)
                other = next(r for r, v in chosen.items() if v == claimed[0])
                raise InputError(
                    f"has no column for {_WHAT[role]} left: '{claimed[0]}' is already taken as {_WHAT[other]} "
                    f"({ROLE_FLAGS[other]} {claimed[0]}); name another with {ROLE_FLAGS[role]} NAME",
                    path=path,
                )
            long = isinstance(need_seq, str) and role == "seq"
            why = f"{need_seq}, which needs a column for {_WHAT[role]}; it has none" if long else ""
            raise InputError(
                f"{why or 'has no column for ' + _WHAT[role]} (looked for {_list(aliases[:6])}, ...; columns present: "
                f"{_list(present)}); name it with {ROLE_FLAGS[role]} NAME",
                path=path,
            )
        chosen[role] = found[0] if found else None
    if columns.id is not None and columns.id not in present:
        raise InputError(
            f"has no column '{columns.id}' (given with --id-col); columns present: {_list(present)}", path=path
        )
    default_id = chosen["seq"] if need_seq else next((name for name in ID_ALIASES if name in present), None)
    missing = [name for name in columns.by if name not in present]
    if missing:
        raise InputError(
            f"has no column '{missing[0]}' (given with --by); columns present: {_list(present)}", path=path
        )
    roles = {name for name in chosen.values() if name is not None}
    recognised = [n for n in present if label_role(n) is not None and n not in roles and present.count(n) == 1]
    labels = tuple(dict.fromkeys([*columns.by, *recognised]))
    resolved = Resolved(**chosen, id=columns.id or default_id, labels=labels)  # type: ignore[arg-type]
    roles_read = (*ROLE_KEYS, "id", "token", *LOSS_INPUTS)
    for name in dict.fromkeys([*(getattr(resolved, role) for role in roles_read), *labels]):
        check_unique(present, name, path)
    return resolved


def check_unique(present: list[str], name: str | None, path: str) -> None:
    """A column rcdiag reads must be the only one of its name: with two, which one a reader returns is arbitrary."""
    count = present.count(name) if name is not None else 0
    if count > 1:
        raise InputError(
            f"has {count} columns named '{name}'; rcdiag cannot tell which one to read: rename all but one",
            path=path,
        )


def _list(names: Iterable[str]) -> str:
    items = [f"'{n}'" for n in names]
    return ", ".join(items) if items else "none"


def long_layout_reason(column: str, dtype: object, path: str) -> str:
    """Why a dump is read as one row per token (its log-prob column holds numbers, not lists), for the error that
    the sequence id is missing; a column that holds neither is refused here, saying what it holds."""
    text = str(dtype)
    if not any(text.startswith(kind) for kind in ("float", "double", "halffloat", "int", "uint", "decimal")):
        raise InputError(
            f"column '{column}' holds {text} values; expected lists of log-probs (one response per row) or "
            "numbers with a sequence-id column (one row per token)",
            path=path,
        )
    return f"column '{column}' holds {text}, not lists of log-probs, so the dump is read as one row per token"
