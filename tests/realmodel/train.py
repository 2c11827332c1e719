"""Train the tiny model on the synthetic language and write ``checkpoint.pt`` beside this file.

    PYTHONPATH=. python tests/realmodel/train.py

Seeded and CPU-only (about 5 minutes on one core). The checkpoint records the hash of the code that made it
(corpus.py, model.py, this file), and the tests check it, so a change to any of them asks for a retrain.
"""

from __future__ import annotations

import hashlib
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from realmodel.corpus import Language  # noqa: E402
from realmodel.model import Config, TinyLM  # noqa: E402

CHECKPOINT = HERE / "checkpoint.pt"
STEPS = 2000
BATCH = 8
LENGTH = 272
LR = 4e-3


def code_hash() -> str:
    """What the checkpoint depends on: the language, the architecture and the training recipe."""
    digest = hashlib.sha256()
    for name in ("corpus.py", "model.py", "train.py"):
        digest.update((HERE / name).read_bytes())
    return digest.hexdigest()[:16]


def main() -> None:
    torch.set_num_threads(1)  # tiny ops: one thread beats two that spin on a loaded machine
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    language = Language()
    stream = torch.from_numpy(language.tokens(1_000_000, rng))
    model = TinyLM(Config())
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01, betas=(0.9, 0.98))
    began = time.monotonic()
    for step in range(STEPS):
        lr = LR * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * step / STEPS))
        for group in optimizer.param_groups:
            group["lr"] = lr
        starts = torch.from_numpy(rng.integers(0, stream.numel() - LENGTH - 1, BATCH))
        window = torch.stack([stream[s : s + LENGTH + 1] for s in starts.tolist()])
        logits = model(window[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 100 == 0 or step == STEPS - 1:
            print(f"step {step} loss {loss.item():.3f} ({time.monotonic() - began:.0f} s)", flush=True)
    state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    torch.save({"config": Config().to_dict(), "state": state, "code_hash": code_hash()}, CHECKPOINT)
    print(f"wrote {CHECKPOINT} ({CHECKPOINT.stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
