"""ROLL's own code on the tests' dumps -> tests/harness/expected/roll.json (tests/harness/common.py says why).

    PYTHONPATH=$PWD python tests/harness/roll_expected.py /path/to/ROLL   # a checkout at COMMIT

Runs, from that checkout, ``apply_train_infer_correction_to_batch`` (``roll/utils/train_infer_corrections.py``,
imported whole: it calls ``compute_train_infer_correction``) on each view as one batch padded to its longest row,
with the functions it imports exec'd from their lines into the modules it imports them from (``agg_loss``,
``masked_mean``, ``masked_sum`` of ``roll/utils/functionals.py``; ``compute_segment_masked_mean`` of
``roll/pipeline/agentic/utils.py``; the config dataclasses of ``roll/configs/base_config.py``: those files import
the whole trainer), and the ``@`` tags stripped by ``_strip_metric_tag`` (``roll/utils/tracking.py``) as ROLL
logs them. The batch's ``response_mask`` gets the leading position ROLL's ``[:, 1:]`` drops. Stubbed, as
unrelated: ``roll.utils.logging``.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.common import checkout, lines_of, load_module, package, pinned, run, stub, weights_of

REPOSITORY = "https://github.com/alibaba/ROLL"
COMMIT = "8eb27cc2dc34c4d1310b169d9b86d339004d811a"
CORRECTIONS = "roll/utils/train_infer_corrections.py"
FUNCTIONALS = ("roll/utils/functionals.py", 229, 297)
SEGMENTS = ("roll/pipeline/agentic/utils.py", 336, 388)
CONFIGS = ("roll/configs/base_config.py", 424, 479)
STRIP = ("roll/utils/tracking.py", 15, 37)
TOKEN = {"enabled": True, "agg_type": "token"}
SETTINGS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "weight_token_filter_token": {
        "train_infer_correction.is_weight": {"enabled": True},
        "train_infer_correction.filters": [{**TOKEN, "ratio_low": 0.9, "ratio_high": 1.1}],
    },
    "weight_sequence_filters_geometric_diff": {
        "train_infer_correction.is_weight": {"enabled": True, "weight_type": "sequence", "upper_bound": 1.5},
        "train_infer_correction.filters": [
            {"enabled": True, "agg_type": "geometric", "ratio_low": 0.99, "ratio_high": 1.01},
            {**TOKEN, "ratio_enabled": False, "diff_enabled": True, "diff_low": -0.05, "diff_high": 0.05},
            {"enabled": False, "agg_type": "sequence"},
        ],
    },
    "weight_segment_filters_segment_sequence": {
        "train_infer_correction.is_weight": {"enabled": True, "weight_type": "segment", "upper_bound": None},
        "train_infer_correction.filters": [
            {"enabled": True, "agg_type": "segment", "ratio_low": 0.95, "ratio_high": 1.05, "diff_enabled": True},
            {"enabled": True, "agg_type": "sequence", "ratio_low": 0.5, "ratio_high": 2.0},
            {**TOKEN, "ratio_low": 0.7, "ratio_high": 1.4},
        ],
    },
    "weight_geometric_clip_filters_off": {
        "train_infer_correction.is_weight": {"enabled": True, "weight_type": "geometric", "upper_bound": 1.001},
        "train_infer_correction.filters": [{"enabled": False}],
    },
}


def _load(root: Path) -> tuple[Any, Any, Any]:
    """ROLL's correction module, its config classes and its tag stripper, from the checkout."""
    import torch

    for name in ("roll", "roll.utils", "roll.pipeline", "roll.pipeline.agentic", "roll.configs"):
        package(name, root.joinpath(*name.split(".")))
    stub("roll.utils.logging", get_logger=lambda *a, **k: types.SimpleNamespace(warning=print, info=print))
    imports = {
        "roll.utils.functionals": (FUNCTIONALS, "import torch\nfrom typing import Optional\n"),
        "roll.pipeline.agentic.utils": (SEGMENTS, "import torch\n"),
        "roll.configs.base_config": (
            CONFIGS,
            "from dataclasses import dataclass, field\nfrom typing import List, Literal, Optional\n",
        ),
    }
    for name, (part, header) in imports.items():
        module = types.ModuleType(name)
        sys.modules[name] = module  # before its dataclasses are made: they look their module up
        exec(header, module.__dict__)
        exec(compile(lines_of(root, *part), part[0], "exec"), module.__dict__)
    tracking: dict[str, Any] = {"Dict": dict, "Any": Any, "torch": torch}
    exec(compile(lines_of(root, *STRIP), STRIP[0], "exec"), tracking)
    corrections = load_module("roll.utils.train_infer_corrections", root / CORRECTIONS)
    return corrections, sys.modules["roll.configs.base_config"], tracking["_strip_metric_tag"]


def main() -> None:
    root = checkout(__doc__, COMMIT)
    import torch

    corrections, configs, strip = _load(root)

    def oracle(options: Mapping[str, Any], old: Any, rollout: Any, mask: Any, rows: Any) -> tuple[dict, dict]:
        weight = configs.TrainInferISWeightConfig(**options.get("train_infer_correction.is_weight", {}))
        filters = [configs.TrainInferFilterConfig(**f) for f in options.get("train_infer_correction.filters", [])]
        config = configs.TrainInferCorrectionConfig(is_weight=weight, filters=filters)
        lead = torch.zeros(old.shape[0], 1, dtype=torch.long)
        batch = types.SimpleNamespace(
            batch={
                "old_log_probs": old,
                "infer_logprobs": rollout,
                "response_mask": torch.cat([lead, mask.long()], dim=1),
            }
        )
        pipeline = types.SimpleNamespace(train_infer_correction=config)
        batch, metrics = corrections.apply_train_infer_correction_to_batch(pipeline, batch)
        kept = batch.batch["response_mask"][:, 1:]
        applied = batch.batch["train_infer_is_weight"] * kept
        return strip(metrics), weights_of(applied, mask)

    run(
        "roll",
        repository=REPOSITORY,
        commit=COMMIT,
        ran=[
            pinned(root, CORRECTIONS),
            pinned(root, *FUNCTIONALS),
            pinned(root, *SEGMENTS),
            pinned(root, *CONFIGS),
            pinned(root, *STRIP),
        ],
        settings=SETTINGS,
        oracle=oracle,
        notes=(
            "each view is one batch padded to its longest row as stored (pads: log-prob 0, mask 0), as "
            "apply_train_infer_correction_to_batch takes it",
            "weights: train_infer_is_weight times the response mask it returns",
        ),
    )


if __name__ == "__main__":
    main()
