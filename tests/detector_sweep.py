"""The detectors' false-alarm and detection rates on generated dumps (the numbers docs/findings.md quotes).

    python tests/detector_sweep.py --seeds 20

Clean dumps: every seed at temperatures 0.6, 0.8, 1.0, 1.2 (the same on both sides) and logit noise 0.01, 0.03,
0.1, 0.3, plus a 4-bit rollout and rare outlier tokens at temperatures 0.6 and 1.0; each must give no detector
finding. Bug dumps: each detector's scenario over the same seeds must give that detector. Prints every false
alarm and miss, and each statistic's largest value on the clean dumps (the margin to its threshold). Too slow for
the suite (tests/findings/test_detectors.py runs 30 smaller dumps over the grid); about 6 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import tempfile
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np

from rcdiag.api import accumulate, build_report
from rcdiag.explain import detectors
from rcdiag.explain.section import ExplainSection
from rcdiag.io import synthetic
from rcdiag.io.synthetic import SCENARIOS, Scenario

BUGS = {
    "rollout_temperature_only": "temperature_mismatch",
    "train_forgot_temperature": "temperature_mismatch",
    "topk_offset": "sampling_truncation",
    "position_drift": "position_drift",
    "step_trend": "mismatch_trend",
}


def run(scenario: Scenario | str, seed: int, scratch: Path) -> tuple[set[str], dict[str, float]]:
    """The detector codes that fire, and the raw statistics behind them."""
    path = scratch / "dump.parquet"
    synthetic.write(synthetic.generate(scenario, rows=384, steps=6, seed=seed), path)
    acc = accumulate(path, sections=[ExplainSection()])
    report = build_report(acc.state, acc.info, "cpu", acc.screen)
    state = acc.state.whole_dump["explain"]
    unlikely, ratio = state.shape.mean("unlikely"), state.shape.mean("ratio")
    moved = state.shape.count("likely_up") + state.shape.count("likely_down")
    n = state.offset.column("n").sum()
    per_group = state.breakdowns.position_sums
    early = per_group[:, list(detectors.EARLY_BUCKETS)].sum(axis=1).sum(axis=0)
    late = per_group[:, detectors.LATE_FROM :].sum(axis=1).sum(axis=0)
    k3 = [(s.step, s.metrics["rollout_corr/k3_kl"]) for s in report.steps]
    x = np.array([s for s, _ in k3], dtype=np.float64)
    slope, _, se = detectors._fit(x, np.log([v for _, v in k3]))
    stats = {
        "temperature_unlikely_z": unlikely.z() if unlikely is not None else -math.inf,
        "temperature_likely_down_share": (  # only where enough likely tokens moved for the flatter test
            state.shape.count("likely_down") / moved if moved >= detectors.FLAT_MIN_MOVED else 0.0
        ),
        "truncation_deficit": -ratio.mean if ratio is not None else -math.inf,
        "offset_gap": abs(1.0 - state.offset.column("capped_ratio").sum() / n),
        "drift_ratio": (detectors._k3(late) or 0.0) / (detectors._k3(early) or math.inf),
        "trend_growth": math.exp(slope * (x[-1] - x[0])),
        "trend_t": slope / se if se > 0 else math.inf,
    }
    return {f.code for f in report.findings if f.code in detectors.DETECTORS}, stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=20)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="rcdiag-sweep-"))
    clean = [
        (Scenario("clean", "", noise=noise, t_rollout=t, t_train=t), f"T={t} noise={noise}")
        for t, noise in itertools.product((0.6, 0.8, 1.0, 1.2), (0.01, 0.03, 0.1, 0.3))
    ]
    clean += [
        (replace(SCENARIOS[name], t_rollout=t, t_train=t), f"{name} T={t}")
        for name, t in itertools.product(("quantized_4bit", "outliers"), (0.6, 1.0))
    ]
    alarms: Counter[str] = Counter()
    largest: dict[str, float] = {}
    for (scenario, label), seed in itertools.product(clean, range(args.seeds)):
        fired, stats = run(scenario, 1000 + seed, scratch)
        for code in fired:
            alarms[code] += 1
            print(f"false alarm: {code} on {label}, seed {1000 + seed}", flush=True)
        for key, value in stats.items():
            largest[key] = max(largest.get(key, value), value)
    print(f"clean dumps: {len(clean) * args.seeds}, false alarms: {dict(alarms) or 0}")
    print("closest to firing on clean dumps: " + ", ".join(f"{k} {v:.4g}" for k, v in largest.items()))
    misses = 0
    for name, code in BUGS.items():
        hits = Counter()
        for seed in range(args.seeds):
            fired, _ = run(name, 3000 + seed, scratch)
            hits.update(fired)
            misses += code not in fired
        print(f"{name}: {dict(hits)} of {args.seeds}")
    sys.exit(1 if alarms or misses else 0)


if __name__ == "__main__":
    main()
