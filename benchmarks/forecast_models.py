"""Which crossing forecast is right for per-step k3_kl? The linear and the log-scale fit of ``rcdiag.core.forecast``
(on the last 10 steps, or on every step), scored on runs whose later steps are known.

Three kinds of run, several seeds each: the real tiny model whose rollout weights drift further every step
(tests/realmodel ``drift``, 24 steps: k3_kl grows as the step squared); the planted run of tests/watch/test_watch.py
(flat, then a logit noise whose variance grows linearly: k3_kl linear in the step); the synthetic ``step_trend``
(logit noise 1.5x per step: k3_kl exponential, the sample_data dump's scenario). For every cut (the first ``m``
steps seen, ``m >= 5``) and every later step ``m + h`` (``h`` = 2..8), the limit is the value at that step, and
the true crossing the first step after the cut that reaches it. Printed per model and kind of run: how many
cuts it forecast, the median |expected - true| in steps, how often the interval held the true step, and how
often it warned late (expected after the true step).

    python benchmarks/forecast_models.py          # builds the real-model dumps once (torch; about a minute each)
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import rcdiag  # noqa: E402
from rcdiag.core.forecast import Scale, forecast  # noqa: E402
from rcdiag.io import synthetic  # noqa: E402

K3 = "rollout_corr/k3_kl"
SEEDS = (0, 1, 2)
MODELS: dict[str, tuple[Scale, int | None]] = {
    "linear, last 10 (watch)": ("linear", 10),
    "linear, every step": ("linear", None),
    "log, last 10": ("log", 10),
    "log, every step (mismatch_trend)": ("log", None),
}
CACHE = Path(tempfile.gettempdir()) / "rcdiag-forecast-models"


def per_step(path: Path) -> list[float]:
    return [float(s.metrics[K3]) for s in rcdiag.analyze(str(path)).steps]


def drift_run(seed: int) -> list[float]:
    from realmodel import make_dump

    path = CACHE / f"drift24_s{seed}"
    if not path.exists():
        make_dump("drift", path, seed=seed, n_responses=24 * 48, steps=24)
    return per_step(path)[1:]  # step 0: identical weights, k3_kl at float rounding (mismatch_trend's floor)


def synthetic_run(name: str, seed: int, steps: int) -> list[float]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = CACHE / f"{name}_s{seed}.parquet"
    if not path.exists():
        tables = []
        for step in range(steps):
            if name == "planted":  # tests/watch/test_watch.py's STEPS_SCRIPT
                noise = 0.02 * (np.sqrt(1 + 0.5 * (step - 5)) if step >= 6 else 1.0)
                scenario = synthetic.with_overrides("healthy", noise=noise)
            else:
                scenario = synthetic.with_overrides("step_trend", noise=0.02 * 1.5**step, step_growth=1.0)
            table = synthetic.generate(scenario, rows=32, steps=1, seed=100 * seed + step, median_length=60,
                                       max_length=200, empty_rows=0)  # fmt: skip
            index = table.schema.get_field_index("step")
            tables.append(table.set_column(index, "step", pa.array(np.full(table.num_rows, step, np.int64))))
        CACHE.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.concat_tables(tables), path)
    values = per_step(path)
    return values[6:] if name == "planted" else values  # the watch fits the climb after its level change


def cuts(values: list[float]) -> Iterator[tuple[list[float], float, int]]:
    """(steps seen, the limit, the true crossing step) for every cut and look-ahead."""
    for m in range(5, len(values) - 2):
        for h in range(2, 9):
            if m + h >= len(values):
                break
            limit = values[m + h]
            if limit <= max(values[:m]):
                continue
            true = next(i for i in range(m, len(values)) if values[i] >= limit)
            yield values[:m], limit, true


def score(runs: list[list[float]], scale: Scale, window: int | None) -> str:
    errors, held, late, total = [], 0, 0, 0
    for values in runs:
        for seen, limit, true in cuts(values):
            total += 1
            xs = list(range(len(seen)))[-(window or len(seen)) :]
            made = forecast(xs, seen[-len(xs) :], limit, scale=scale)
            if made is None:
                continue
            errors.append(abs(made.expected - true))
            held += made.earliest <= true <= made.latest
            late += made.expected > true
    if not errors:
        return f"forecast 0 of {total}"
    return (
        f"forecast {len(errors):3d}/{total:3d}  median |error| {statistics.median(errors):5.2f} steps  "
        f"interval held {held / len(errors):5.1%}  late {late / len(errors):5.1%}"
    )


def main() -> None:
    kinds = {
        "real model, drifting weights (k3 ~ step^2)": [drift_run(s) for s in SEEDS],
        "watch's planted run (k3 linear)": [synthetic_run("planted", s, 30) for s in SEEDS],
        "step_trend (k3 exponential)": [synthetic_run("step_trend", s, 11) for s in SEEDS],
    }
    for kind, runs in kinds.items():
        print(kind)
        for name, (scale, window) in MODELS.items():
            print(f"  {name:34s} {score(runs, scale, window)}")


if __name__ == "__main__":
    main()
