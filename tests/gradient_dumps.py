"""Real-model dumps for ``framework_drops_gradient``'s per-step rule: a clean run with one bad step spliced in.

``one_bad_step(seed, root)`` copies the bf16 dump of ``seed`` (tests/shape_dumps.py, four steps) and puts the int4
dump's last step in place of its own: the same rows, tokens and step numbers, only step 3's rollout is 4-bit. Under
TRL's default ``sequence_mask`` that step keeps ~0.13 of its weight while the pool keeps ~0.77."""

from __future__ import annotations

import shutil
from pathlib import Path

from shape_dumps import dump

BAD_STEP = 3
"""The step whose rollout is int4's."""


def one_bad_step(seed: int, root: Path) -> Path:
    """A copy under ``root`` of bf16 seed ``seed`` with step ``BAD_STEP`` taken from int4 seed ``seed``."""
    clean, bad = dump("bf16", seed), dump("int4", seed)
    out = root / f"one_bad_step_s{seed}"
    shutil.copytree(clean, out)
    name = f"step-{BAD_STEP:09d}-0000.parquet"
    shutil.copyfile(bad / name, out / name)
    return out
