"""slime's ``--save-debug-train-data`` files, format 1 and format 2, as one shape: ``{"rollout_id", "rank",
"rollout_data": {key: one entry per sample}}``.

Format 1 (slime before 681b3adc, and Miles) is that shape already. Format 2 (``format_version: 2``, slime
624b824a ``slime/observability/train_data_utils.py:112-188``, ``_build_dump_payload``) gathers every data-parallel
shard into one file: a top-level ``samples`` list (one dict per sample, sorted into rollout order, each with its
``log_probs``, ``rollout_log_probs``, ``loss_masks``, ``response_lengths``, ``sample_index``, ...), ``dp_shards``
(the scheduling layout, no per-sample tensors) and whole-batch fields such as ``raw_reward`` at the top; its
context-parallel fields are already restored to full length (``restore_context_parallel_fields_to_cpu``).
"""

from __future__ import annotations

from typing import Any

from rcdiag.runtime.errors import InputError

FORMATS = (1, 2)
"""The ``format_version`` values read (format 1 writes none)."""
ROLE_KEYS = ("log_probs", "rollout_log_probs", "loss_masks")
"""Per-sample keys every sample must hold when one does (the columns rcdiag reads)."""


def is_train_dump(obj: Any) -> bool:
    """Whether ``obj`` is slime's (or Miles') debug train data, of either format."""
    return isinstance(obj, dict) and ("format_version" in obj or isinstance(obj.get("rollout_data"), dict))


def as_rollout_data(obj: dict[str, Any], path: str) -> dict[str, Any]:
    """``obj`` in format 1's shape; a format 2 file's ``samples`` transposed into ``rollout_data`` columns (its
    ``sample_index`` becoming ``sample_indices``, as format 1 names them)."""
    version = obj.get("format_version")
    if version is None:
        return obj
    if isinstance(version, bool) or version not in FORMATS[1:]:
        raise InputError(
            f"holds format_version {version!r} of slime's debug train data; rcdiag reads format 1 ('rollout_data') "
            "and format 2 ('samples')",
            path=path,
        )
    samples = obj.get("samples")
    if not isinstance(samples, list) or not all(isinstance(s, dict) for s in samples):
        raise InputError(
            f"is slime's format_version 2 but its 'samples' is {type(samples).__name__}, expected a list of dicts "
            "(one per sample)",
            path=path,
        )
    if not samples:
        raise InputError("has no samples: there is nothing to analyze", path=path)
    keys = list(dict.fromkeys(key for sample in samples for key in sample))
    data: dict[str, Any] = {}
    for key in keys:
        missing = next((i for i, sample in enumerate(samples) if key not in sample), None)
        if missing is None:
            data[str(key)] = [sample[key] for sample in samples]
        elif key in ROLE_KEYS:
            raise InputError(
                f"holds no '{key}' in sample {missing}, which other samples hold; every sample needs it", path=path
            )
    if "sample_index" in data and all(isinstance(i, int) for i in data["sample_index"]):
        data["sample_indices"] = data.pop("sample_index")
    header = {k: v for k, v in obj.items() if k not in ("samples", "dp_shards") and not isinstance(v, (list, dict))}
    return {**header, "rollout_data": data}
