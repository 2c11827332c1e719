"""No ``--explain`` detector fires on clean dumps: real-model dumps whose only difference between the engines is
numerical (float32 rounding, a bf16 rollout, a 4-bit rollout) over several seeds.

The shape detectors (temperature_mismatch, sampling_truncation) test against a noise model (responses as the
units, false-alarm rate ``SHAPE_FALSE_ALARM_RATE``); these dumps are where a wrong noise model would show. The
synthetic clean grid (24 seeds x temperatures x noise levels, a 4-bit rollout, outliers) and the healthy samples
are in test_detectors.py.
"""

from __future__ import annotations

import pytest
from shape_dumps import detector_findings, dump

CLEAN = ("clean_fp32", "bf16", "int4")
SEEDS = (0, 1, 2)
NOISE_LIKE = ("drift", "spikes", "rope_low_precision")
"""Causes that are not a temperature or a truncation: the shape detectors must not name them."""
SHAPE = {"temperature_mismatch", "sampling_truncation", "logprob_offset"}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("scenario", CLEAN)
def test_no_detector_fires_on_clean_real_dumps(scenario: str, seed: int) -> None:
    assert detector_findings(dump(scenario, seed)) == {}


@pytest.mark.parametrize("seed", [0])
@pytest.mark.parametrize("scenario", NOISE_LIKE)
def test_shape_detectors_do_not_name_other_causes(scenario: str, seed: int) -> None:
    """Weights drifting across steps, sparse spikes, RoPE in low precision: noise to the shape detectors."""
    assert not set(detector_findings(dump(scenario, seed))) & SHAPE
