"""rcdiag: offline diagnostics for training-inference mismatch in LLM RL.

It runs verl's rollout correction (IS weights, RS masks and every ``rollout_corr/*`` metric, with verl's names
and the semantics of the release you ran, v0.7.1 to v0.9.1) over saved dumps of per-token log-probs, streaming,
on CPU or GPU.

    >>> import rcdiag
    >>> config = rcdiag.CorrectionConfig(rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0")
    >>> [option.name for option in config.resolve().rs_options]
    ['token_k1']

Public names are imported lazily, so ``rcdiag --help`` does not pay for numpy and pyarrow.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rcdiag._version import __version__

_EXPORTS = {
    "analyze": "rcdiag.api",
    "analyze_chunks": "rcdiag.api",
    "accumulate": "rcdiag.api",
    "merge_states": "rcdiag.api",
    "PRESETS": "rcdiag.settings.correction",
    "CorrectionConfig": "rcdiag.settings.correction",
    "preset": "rcdiag.settings.correction",
    "ConfigError": "rcdiag.runtime.errors",
    "ExitCode": "rcdiag.runtime.errors",
    "ReadOptions": "rcdiag.settings.reading",
    "InputError": "rcdiag.runtime.errors",
    "RcdiagError": "rcdiag.runtime.errors",
    "Chunk": "rcdiag.io",
    "ColumnMap": "rcdiag.io",
    "Finding": "rcdiag.records.report",
    "InputFacts": "rcdiag.records.report",
    "Report": "rcdiag.records.report",
    "StepReport": "rcdiag.records.report",
    "DumpWriter": "rcdiag.io.dump_writer",
    "MicroBatchSettings": "rcdiag.microbatch",
    "VERSIONS": "rcdiag.settings.versions",
}

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:
    from rcdiag.api import accumulate, analyze, analyze_chunks, merge_states  # noqa: F401
    from rcdiag.io import Chunk, ColumnMap  # noqa: F401
    from rcdiag.io.dump_writer import DumpWriter  # noqa: F401
    from rcdiag.microbatch import MicroBatchSettings  # noqa: F401
    from rcdiag.records.report import Finding, InputFacts, Report, StepReport  # noqa: F401
    from rcdiag.runtime.errors import ConfigError, ExitCode, InputError, RcdiagError  # noqa: F401
    from rcdiag.settings.correction import PRESETS, CorrectionConfig, preset  # noqa: F401
    from rcdiag.settings.reading import ReadOptions  # noqa: F401
    from rcdiag.settings.versions import VERSIONS  # noqa: F401


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rcdiag' has no attribute '{name}'")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
