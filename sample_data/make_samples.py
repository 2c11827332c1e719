"""Regenerate the shipped sample dumps (seeded, so the files are reproducible).

    python sample_data/make_samples.py

Each file is a canonical dump (one row per response; old_log_prob, rollout_log_prob, response_mask, step)
made by ``rcdiag.io.synthetic``; sample_data/README.md lists what ``rcdiag analyze`` should find in each.
"""

from __future__ import annotations

from pathlib import Path

from rcdiag.io import synthetic

HERE = Path(__file__).resolve().parent
SAMPLES = {
    "healthy.parquet": ("healthy", 1),
    "topk_offset.parquet": ("topk_offset", 2),
    "train_forgot_temperature.parquet": ("train_forgot_temperature", 3),
    "healthy_t06.parquet": ("healthy_t06", 4),
    "outliers.parquet": ("outliers", 5),
    "rollout_temperature_only.parquet": ("rollout_temperature_only", 6),
    "position_drift.parquet": ("position_drift", 7),
    "step_trend.parquet": ("step_trend", 8),
    "quantized_4bit.parquet": ("quantized_4bit", 9),
}


def main() -> None:
    for filename, (scenario, seed) in SAMPLES.items():
        table = synthetic.generate(scenario, rows=384, steps=6, seed=seed)
        synthetic.write(table, HERE / filename)
        print(f"wrote {filename}: {table.num_rows} rows, scenario {scenario!r}")


if __name__ == "__main__":
    main()
