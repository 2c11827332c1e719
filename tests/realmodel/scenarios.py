"""Dumps from the tiny model with one planted cause each: ``make_dump(scenario, path, seed=..., n_responses=...)``.

Each dump holds ``n_responses`` responses (lengths log-uniform in [min_len, max_len]) after prompts cut from the
synthetic language, spread over ``steps`` training steps. Every scenario plants one cause on an otherwise exact
float32 rollout, so the cause it names is the only one in the dump; ``rollout_dtype`` puts a precision floor
under any of them (e.g. "bf16", as real engines run).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
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
    spec: Rollout, seed: int, n_responses: int, steps: int, min_len: int, max_len: int, prompt_len: int
) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray, int, list[np.ndarray]]:
    """Per response: the trainer's and the rollout's log-probs; each response's step; the token count; the sampled
    token ids (written as the dump's ``token_ids``, for ``--explain``'s by-token breakdown)."""
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
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: one thread beats several spinning on a loaded machine
    try:
        for rows in groups:
            rows = rows[np.argsort(-lengths[rows], kind="stable")]
            length = torch.from_numpy(lengths[rows])
            engine = rollout_model(base, spec, int(step_of[rows[0]]))
            tokens, rollout = sample(engine, prompts[rows], length, spec, generator)
            old = score(base, prompts[rows], tokens, length)
            for i, row in enumerate(rows.tolist()):
                n = int(lengths[row])
                old_rows[row], rollout_rows[row] = old[i, :n].numpy(), rollout[i, :n].numpy()
                token_rows[row] = tokens[i, :n].numpy().astype(np.int64)
    finally:
        torch.set_num_threads(threads)
    return old_rows, rollout_rows, step_of, int(lengths.sum()), token_rows


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
    old_rows, rollout_rows, step_of, tokens_total, token_rows = _SAMPLED[key]
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
