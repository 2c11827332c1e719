"""Every realmodel scenario's dump at one seed (tests/realmodel/README.md), for the verdict and real-model tests
(conftest's session fixture ``real_dumps``): built once, cached on disk under the temp directory."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

from shape_dumps import realmodel

HERE = Path(__file__).resolve().parent / "realmodel"
CHECKPOINT = HERE / "checkpoint.pt"
N_RESPONSES = 512
SEED = 0
SCENARIO_NAMES = [
    "clean_fp32",
    "bf16",
    "int4",
    "temperature_0.9",
    "temperature_0.7",
    "topk_50",
    "topp_0.95",
    "rope_low_precision",
    "drift",
    "spikes",
    "swapped",
    "swapped_int4",
]
"""The dumps the tests build: every scenario but fp16 (bf16 stands for the precision class). Spelled out so that
the module imports without torch, and a missing torch is reported by each test (a failure under CI=true)."""


def _cache_key() -> str:
    digest = hashlib.sha256()
    for file in [*sorted(HERE.glob("*.py")), CHECKPOINT]:
        digest.update(file.name.encode() + file.read_bytes())
    digest.update(f"{N_RESPONSES} {SEED}".encode())
    return digest.hexdigest()[:16]


def built_dumps() -> dict[str, dict]:
    """Every scenario's dump, built once and cached on disk under the temp directory, keyed by the hash of the
    model code, the checkpoint and the sizes (a second session reuses them). Each entry: path, tokens, seconds."""
    root = Path(tempfile.gettempdir()) / f"rcdiag-realmodel-{_cache_key()}"
    index = root / "index.json"
    make_dump = realmodel().make_dump
    if not index.exists():
        building = Path(tempfile.mkdtemp(prefix=".building-", dir=root.parent))
        built = {}
        for name in SCENARIO_NAMES:
            dump = make_dump(name, building / name, seed=SEED, n_responses=N_RESPONSES)
            built[name] = {"tokens": dump.tokens, "steps": dump.steps, "seconds": round(dump.seconds, 2)}
        (building / "index.json").write_text(json.dumps(built, indent=1))
        try:
            building.rename(root)
        except OSError:  # another session finished first
            shutil.rmtree(building, ignore_errors=True)
    built = json.loads(index.read_text())
    return {name: {**facts, "path": root / name} for name, facts in built.items()}
