"""Constants shared by the library and the CLI, in a module that imports nothing (keeps ``--help`` fast)."""

DEFAULT_CHUNK_TOKENS = 1 << 20
"""Rows are read about a million tokens at a time: big enough to amortise decoding, small enough that memory
stays flat (docs/performance.md)."""
MAX_CHUNK_TOKENS = 1 << 40
"""The largest ``--chunk-tokens``: more than any dump holds, and within the 64-bit counts of the readers."""
DEVICES = ("cpu", "cuda", "cuda:N", "auto", "torch-cpu")
"""``device`` spellings (``cuda:N`` stands for any GPU index); ``rcdiag.metrics.backend.get_backend`` reads them."""

TEMPERATURE_KEY = "temperature"
"""Dump metadata key holding the rollout sampling temperature."""
TRAIN_TEMPERATURE_KEY = "train_temperature"
"""Dump metadata key holding the temperature the trainer divided its logits by, when the dump records it."""
ROUTER_REPLAY_KEY = "verl.router_replay.mode"
"""Dump metadata key recording the actor's MoE ``router_replay.mode`` (written by ``rcdiag.integrations.verl``):
verl 0.9.1 refuses R2 with bypass mode, so a sweep never ranks a bypass preset for such a run."""
