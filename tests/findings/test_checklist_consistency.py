"""The checklist and the metric readings never contradict each other or the findings (issue 24, item 5).

Every pair of statements a report makes is checked against an explicit contradiction relation:

* checklist row vs finding: a ✓ or "–" row's code is not among the findings; a ✗ row's code is.
* checklist row vs checklist row: a claim (``CLAIMS``) is made by one row only, so a ✓ row and a ✗ row can never
  assert and deny the same fact (``✗ kl agrees with k3_kl (no systematic shift)`` next to ``✓ no systematic
  shift ...`` did).
* reading vs finding: ``EXCLUDES`` lists, for each reading phrase, the findings it cannot stand next to (or
  needs); a reading that says a threshold "fails" needs that threshold's finding.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import SAMPLES
from dumps24 import long_biased, short_without_steps, swapped, uniform_spikes, write_padded

import rcdiag
from rcdiag.catalogue import reading
from rcdiag.catalogue.metrics import METRICS
from rcdiag.io import synthetic
from rcdiag.render.text import reading_context

P = "rollout_corr/"
CLAIMS = (
    "systematic shift",
    "same temperature",
    "mean IS ratio",
    "grow along",
    "across training steps",
    "outlier tokens",
)
"""Facts a checklist label may assert; each may be asserted by one row only."""

Rule = tuple[str, str, Callable[[float], bool], set[str], set[str]]
EXCLUDES: list[Rule] = [
    # (metric key, phrase in its reading, condition on the value, findings it cannot stand next to, findings it needs)
    (P + "kl", "typical of", lambda v: True, {"kl_negative", "sparse_outliers"}, set()),
    (P + "kl", "within noise", lambda v: True, {"kl_negative", "kl_high"}, set()),
    (P + "kl", "beyond noise", lambda v: True, set(), {"kl_negative"}),
    (P + "chi2_token", "within noise", lambda v: True, {"kl_k3_disagree", "logprob_offset", "sampling_truncation"}, set()),
    (P + "chi2_token", "systematic shift", lambda v: v < 0, set(), set()),  # needs one of SHIFT (below)
    (P + "chi2_seq", "systematic shift", lambda v: v < 0, set(), set()),
    (P + "rollout_is_eff_sample_size", "healthy", lambda v: True, {"is_saturated", "is_ess_low"}, set()),
]
SHIFT = {"kl_k3_disagree", "logprob_offset", "sampling_truncation"}


def tiny_noise(path: Path, seed: int) -> Path:
    """40 responses of 100 tokens with log-ratio noise of std 0.004: seed 1 gives a chi2_token of -7.5e-5 and
    seed 2 a kl of -1.8e-4 (2.7 standard errors), both within noise of 0."""
    rng = np.random.default_rng(seed)
    rollout = rng.uniform(-3.0, -0.5, (40, 100))
    return write_padded(path, np.minimum(rollout + rng.normal(0.0, 0.004, (40, 100)), 0.0), rollout)


def dumps(tmp: Path) -> list[tuple[str, Path, rcdiag.CorrectionConfig | None]]:
    out: list[tuple[str, Path, rcdiag.CorrectionConfig | None]] = [
        (p.stem, p, None) for p in sorted(SAMPLES.glob("*.parquet"))
    ]
    out += [
        ("outliers seq IS", SAMPLES / "outliers.parquet", rcdiag.preset("decoupled_seq_is")),
        ("healthy token IS 0.5", SAMPLES / "healthy.parquet", rcdiag.CorrectionConfig("token", 0.5)),
        ("long biased seq IS", long_biased(tmp / "lb.parquet"), rcdiag.preset("decoupled_seq_is")),
        ("swapped", swapped(tmp / "sw.parquet", SAMPLES / "rollout_temperature_only.parquet"), None),
        ("uniform spikes", uniform_spikes(tmp / "u.parquet", seed=1), None),
        ("short, no steps", short_without_steps(tmp / "short.parquet"), None),
        ("tiny noise chi2 < 0", tiny_noise(tmp / "t1.parquet", 1), None),
        ("tiny noise kl < 0", tiny_noise(tmp / "t2.parquet", 2), None),
    ]
    for seed in (21, 22):
        path = tmp / f"h{seed}.parquet"
        synthetic.write(synthetic.generate("healthy", seed=seed), path)
        out.append((f"synthetic healthy {seed}", path, rcdiag.preset("decoupled_token_is")))
    return out


def contradictions(report: rcdiag.Report) -> list[str]:
    """Every contradictory pair of statements in ``report`` (empty when it is consistent)."""
    fired = {f.code for f in report.findings}
    rows = report.checklist
    bad = [  # row vs finding
        f"row {row.status} {row.code} vs findings {sorted(fired)}"
        for row in rows
        if (row.status in ("ok", "not_computed")) == (row.code in fired)
    ]
    for a, b in itertools.combinations(rows, 2):  # row vs row
        shared = [c for c in CLAIMS if c in a.check and c in b.check]
        if shared:
            bad.append(f"rows {a.code} ({a.status}) and {b.code} ({b.status}) both claim {shared}")
    context = reading_context(report)
    values = {**report.metrics, **report.extras}
    for key, phrase, when, excluded, needed in EXCLUDES:  # reading vs finding
        value = values.get(key)
        if value is None or phrase not in (text := reading(key, value, context)) or not when(value):
            continue
        if excluded & fired or not needed <= fired or (phrase == "systematic shift" and not SHIFT & fired):
            bad.append(f"{key} = {value:.3g} reads {text!r} next to findings {sorted(fired)}")
    for spec in METRICS:  # a reading that says a threshold fails needs its finding
        value = values.get(spec.name)
        if value is not None and "(fails " in reading(spec.name, value, context):
            codes = {t.finding for t in spec.thresholds if t.finding is not None and not t.holds(value)}
            if not codes & fired:
                bad.append(f"{spec.name} reads 'fails' without {sorted(codes)}")
    return bad


def test_no_checklist_or_reading_contradicts_another(tmp_path: Path) -> None:
    found = {}
    for name, path, config in dumps(tmp_path):
        report = rcdiag.analyze(path, config, explain=True)
        if bad := contradictions(report):
            found[name] = bad
    assert found == {}


def test_the_relation_catches_the_contradictions_of_issue_24(tmp_path: Path) -> None:
    """The relation is not vacuous: readings as they were (no noise context) and the old labels contradict."""
    report = rcdiag.analyze(tiny_noise(tmp_path / "t.parquet", 1), explain=True)
    chi2 = report.metrics[P + "chi2_token"]
    assert chi2 < 0 and "kl_k3_disagree" not in {f.code for f in report.findings}
    assert "systematic shift" in reading(P + "chi2_token", chi2)  # the context-free reading: the old contradiction
    assert "within noise of 0" in reading(P + "chi2_token", chi2, reading_context(report))
    labels = ["kl agrees with k3_kl within noise (no systematic shift)", "no systematic shift between the engines"]
    assert [c for c in CLAIMS if all(c in label for label in labels)] == ["systematic shift"]


if __name__ == "__main__":  # print the statements of one dump: python tests/findings/test_checklist_consistency.py DUMP
    print(contradictions(rcdiag.analyze(sys.argv[1], explain=True)))
    pytest.main([__file__])
