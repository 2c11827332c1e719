"""Dumps from the tiny model with one planted cause each: ``make_dump(scenario, path, seed=..., n_responses=...)``.

Each dump holds ``n_responses`` responses (lengths log-uniform in [min_len, max_len]) after prompts cut from the
synthetic language, spread over ``steps`` training steps. Every scenario plants one cause on an otherwise exact
float32 rollout, so the cause it names is the only one in the dump; ``rollout_dtype`` puts a precision floor
under any of them (e.g. "bf16", as real engines run).

``DEFECTS`` are the causes beyond the engines' numerics that real pipelines plant by mistake (issue 34): an
alignment bug in the trainer, prompt tokens or padding inside the mask, a log-prob offset, one bad replica among
eight, log-probs of another distribution than was sampled, logit processing on one side. Each is an engine
(``Rollout``) plus what the pipeline then does to the dump (``Defect``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from .corpus import Language
from .engines import Rollout, rollout_model, sample, score
from .model import Config, TinyLM

CHECKPOINT = Path(__file__).resolve().parent / "checkpoint.pt"
TOP_K = 50
"""Of a 256-token vocabulary: at the model's uncertain positions (word starts) it drops up to a third of the mass
(2.3% on average, kl 0.023 on the default dump); near-certain positions keep everything."""

SCENARIOS: dict[str, Rollout] = {
    "clean_fp32": Rollout(),
    "bf16": Rollout(dtype="bf16"),
    "fp16": Rollout(dtype="fp16"),
    "int4": Rollout(dtype="bf16", int4=True),
    "temperature_0.9": Rollout(temperature=0.9),
    "temperature_0.7": Rollout(temperature=0.7),
    f"topk_{TOP_K}": Rollout(top_k=TOP_K),
    "topp_0.95": Rollout(top_p=0.95),
    "rope_low_precision": Rollout(rope_dtype="bf16"),
    "drift": Rollout(drift=0.004),
    "spikes": Rollout(spike_rate=0.002, spike_scale=4.0),
    "swapped": Rollout(dtype="bf16"),
    "swapped_int4": Rollout(dtype="bf16", int4=True),
}


@dataclass(frozen=True)
class Defect:
    """What a pipeline does to an engine's dump beyond the engine itself (all defaults: nothing)."""

    rollout: Rollout = field(default_factory=Rollout)
    shift: int = 0
    """The trainer scores token t with the logits ``shift`` positions later (an off-by-one slice)."""
    trainer_temperature: float = 1.0
    """The temperature the trainer divides its logits by (verl applies the rollout's sampling temperature)."""
    prompt_in_mask: bool = False
    """Each response starts with its prompt's tokens (all but the first), inside the mask: the trainer's
    teacher-forced log-probs of them, the rollout's 0.0 (it sampled none of them)."""
    inverted_mask: bool = False
    """Rows padded to the longest response with 0.0 on both sides, and the mask inverted: the padding valid, the
    response masked."""
    offset: float = 0.0
    """Added to every rollout log-prob of the rows it touches (``offset_share`` of the rows, spread evenly)."""
    offset_share: float = 1.0
    bad_replica: Rollout | None = None
    """One of ``replicas`` contiguous blocks of rows is sampled and reported by this engine instead."""
    replicas: int = 8
    replica_column: bool = False
    """Write each row's replica number in a ``replica`` column."""


BAD_REPLICA = 3
"""Which of the replicas is the bad one."""
DEFECTS: dict[str, Defect] = {
    "alignment": Defect(shift=1),
    "prompt_in_mask": Defect(prompt_in_mask=True),
    "inverted_mask": Defect(inverted_mask=True),
    "offset": Defect(offset=-0.05),
    "offset_some": Defect(offset=-0.05, offset_share=0.25),
    "raw_logprobs_0.7": Defect(Rollout(temperature=0.7, logprob_mode="raw"), trainer_temperature=0.7),
    "top1_logprobs": Defect(Rollout(logprob_mode="top1")),
    "repetition_penalty": Defect(Rollout(repetition_penalty=1.3)),
    "softcap": Defect(Rollout(softcap=4.0)),
    "replica": Defect(Rollout(dtype="bf16"), bad_replica=Rollout(dtype="bf16", int4=True)),
    "replica_column": Defect(Rollout(dtype="bf16"), bad_replica=Rollout(dtype="bf16", int4=True), replica_column=True),
    "kv_fp8": Defect(Rollout(dtype="bf16", kv_dtype="fp8")),
    "stale": Defect(Rollout(dtype="bf16", stale=0.004)),
}
"""Causes a pipeline plants beyond its engines' numerics (the first eleven), and two more clean engines (``kv_fp8``:
a bf16 rollout with a float8 key-value cache; ``stale``: a policy a constant small step behind), for the false-alarm
rates."""
CLEAN_DEFECTS = ("kv_fp8", "stale")
SWAPPED = {"swapped", "swapped_int4"}
"""Written with old_log_prob and rollout_log_prob exchanged (the same tokens as bf16 / int4 at the same seed)."""
DEFAULT_STEPS = {"drift": 8}


@dataclass(frozen=True)
class Dump:
    path: Path
    scenario: str
    responses: int
    tokens: int
    steps: int
    seconds: float


def load_model() -> TinyLM:
    saved = torch.load(CHECKPOINT, weights_only=True)
    model = TinyLM(Config(**saved["config"]))
    model.load_state_dict(saved["state"])
    return model.eval()


_MODEL: TinyLM | None = None


def model() -> TinyLM:
    """The trained checkpoint, loaded once per process."""
    global _MODEL
    if _MODEL is None:
        _MODEL = load_model()
    return _MODEL


_SAMPLED: dict[tuple, tuple] = {}


def _sample_rows(
    spec: Rollout,
    seed: int,
    n_responses: int,
    steps: int,
    min_len: int,
    max_len: int,
    prompt_len: int,
    shift: int = 0,
    trainer_temperature: float = 1.0,
) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray, int, list[np.ndarray], list[np.ndarray]]:
    """Per response: the trainer's and the rollout's log-probs; each response's step; the token count; the sampled
    token ids (written as the dump's ``token_ids``, for ``--explain``'s by-token breakdown); the trainer's log-probs
    of the prompt's tokens after the first, and those tokens (as the last list, in pairs)."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)
    base = model()
    language = Language()
    stream = language.tokens(n_responses * prompt_len * 4, rng)
    starts = rng.choice(stream.size - prompt_len, size=n_responses, replace=False)
    prompts = torch.from_numpy(np.stack([stream[s : s + prompt_len] for s in starts]))
    lengths = np.exp(rng.uniform(math.log(min_len), math.log(max_len + 1), n_responses)).astype(np.int64)
    lengths = np.clip(lengths, min_len, max_len)
    step_of = np.arange(n_responses) * steps // n_responses
    # One engine serves every step unless the weights drift, so the steps are sampled as one batch then.
    groups = [np.arange(n_responses)] if spec.drift == 0.0 else [np.flatnonzero(step_of == s) for s in range(steps)]
    old_rows: list[np.ndarray] = [np.zeros(0, np.float32)] * n_responses
    rollout_rows: list[np.ndarray] = [np.zeros(0, np.float32)] * n_responses
    token_rows: list[np.ndarray] = [np.zeros(0, np.int64)] * n_responses
    prompt_rows: list[np.ndarray] = [np.zeros(0, np.float32)] * n_responses
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: one thread beats several spinning on a loaded machine
    try:
        for rows in groups:
            rows = rows[np.argsort(-lengths[rows], kind="stable")]
            length = torch.from_numpy(lengths[rows])
            engine = rollout_model(base, spec, int(step_of[rows[0]]))
            tokens, rollout = sample(engine, prompts[rows], length, spec, generator)
            old, prompt_scores = score(
                base, prompts[rows], tokens, length, shift=shift, temperature=trainer_temperature
            )
            for i, row in enumerate(rows.tolist()):
                n = int(lengths[row])
                old_rows[row], rollout_rows[row] = old[i, :n].numpy(), rollout[i, :n].numpy()
                token_rows[row] = tokens[i, :n].numpy().astype(np.int64)
                prompt_rows[row] = prompt_scores[i].numpy()
    finally:
        torch.set_num_threads(threads)
    prompt_tokens = [prompts[r, 1:].numpy().astype(np.int64) for r in range(n_responses)]
    return old_rows, rollout_rows, step_of, int(lengths.sum()), token_rows, [*prompt_rows, *prompt_tokens]


def make_dump(
    scenario: str,
    path: str | Path,
    *,
    seed: int = 0,
    n_responses: int = 512,
    steps: int | None = None,
    min_len: int = 16,
    max_len: int = 256,
    prompt_len: int = 16,
    rollout_dtype: str | None = None,
) -> Dump:
    """Sample ``n_responses`` responses with the scenario's rollout engine, score them with the trainer, and write
    a canonical dump (a DumpWriter directory, one part per step) at ``path``."""
    from rcdiag import DumpWriter

    spec = SCENARIOS[scenario]
    if rollout_dtype is not None:
        spec = replace(spec, dtype=rollout_dtype)
    steps = steps if steps is not None else DEFAULT_STEPS.get(scenario, 4)
    began = time.monotonic()
    key = (spec, seed, n_responses, steps, min_len, max_len, prompt_len)
    if key not in _SAMPLED:  # a swapped scenario reuses its engine's rows when they were sampled in this process
        _SAMPLED[key] = _sample_rows(spec, seed, n_responses, steps, min_len, max_len, prompt_len)
    old_rows, rollout_rows, step_of, tokens_total, token_rows, _ = _SAMPLED[key]
    if scenario in SWAPPED:
        old_rows, rollout_rows = rollout_rows, old_rows
    path = Path(path)
    with DumpWriter(path, metadata={"source": "tests/realmodel"}) as writer:
        for step in range(steps):
            rows = np.flatnonzero(step_of == step).tolist()
            writer.write(
                step=step,
                old_log_prob=[old_rows[r] for r in rows],
                rollout_log_prob=[rollout_rows[r] for r in rows],
                token_ids=[token_rows[r] for r in rows],
            )
    return Dump(path, scenario, n_responses, tokens_total, steps, time.monotonic() - began)


def make_defect_dump(
    name: str,
    path: str | Path,
    *,
    seed: int = 0,
    n_responses: int = 512,
    steps: int = 4,
    min_len: int = 16,
    max_len: int = 256,
    prompt_len: int = 16,
) -> Dump:
    """The dump of ``DEFECTS[name]``: its engine's rows (``_sample_rows``) with the pipeline's defect applied,
    written as one Parquet part per step (a ``response_mask`` where the defect has one, a ``replica`` column where
    it writes one)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    defect = DEFECTS[name]
    began = time.monotonic()
    sizes = (seed, n_responses, steps, min_len, max_len, prompt_len)
    old, rollout, step_of, _, tokens, prompt = _sample_rows(
        defect.rollout, *sizes, shift=defect.shift, trainer_temperature=defect.trainer_temperature
    )
    old, rollout, tokens = list(old), list(rollout), list(tokens)
    replica = np.arange(n_responses) * defect.replicas // n_responses
    if defect.bad_replica is not None:
        bad = _sample_rows(defect.bad_replica, *sizes, trainer_temperature=defect.trainer_temperature)
        for row in np.flatnonzero(replica == BAD_REPLICA).tolist():
            old[row], rollout[row], tokens[row] = bad[0][row], bad[1][row], bad[4][row]
    masks = [np.ones(len(row), np.int8) for row in old]
    if defect.prompt_in_mask:
        scores, prompt_tokens = prompt[:n_responses], prompt[n_responses:]
        old = [np.concatenate([scores[r], old[r]]) for r in range(n_responses)]
        rollout = [np.concatenate([np.zeros_like(scores[r]), rollout[r]]) for r in range(n_responses)]
        tokens = [np.concatenate([prompt_tokens[r], tokens[r]]) for r in range(n_responses)]
        masks = [np.ones(len(row), np.int8) for row in old]
    if defect.offset:
        touched = np.arange(n_responses) % round(1 / defect.offset_share) == 0
        rollout = [(r + np.float32(defect.offset)) if touched[i] else r for i, r in enumerate(rollout)]
    if defect.inverted_mask:
        width = max(len(row) for row in old)

        def padded(row: np.ndarray) -> np.ndarray:
            return np.concatenate([row, np.zeros(width - len(row), row.dtype)])

        masks = [np.concatenate([np.zeros(len(row), np.int8), np.ones(width - len(row), np.int8)]) for row in old]
        old, rollout, tokens = [padded(r) for r in old], [padded(r) for r in rollout], [padded(r) for r in tokens]
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for step in range(steps):
        rows = np.flatnonzero(step_of == step).tolist()
        columns = {
            "old_log_prob": pa.array([old[r] for r in rows], pa.list_(pa.float32())),
            "rollout_log_prob": pa.array([rollout[r] for r in rows], pa.list_(pa.float32())),
            "response_mask": pa.array([masks[r] for r in rows], pa.list_(pa.int8())),
            "token_ids": pa.array([tokens[r] for r in rows], pa.list_(pa.int64())),
            "step": pa.array([step] * len(rows), pa.int64()),
        }
        if defect.replica_column:
            columns["replica"] = pa.array(replica[rows], pa.int64())
        pq.write_table(pa.table(columns), path / f"step-{step:06d}.parquet")
    total = sum(int(m.sum()) for m in masks)
    return Dump(path, name, n_responses, total, steps, time.monotonic() - began)
