"""One consistent answer (issue 34 items 4 and 5) on the tests' real model: ``outliers`` only when they are sparse,
an RS prescription that rejects tokens in most responses said to be no remedy, no correction urged under ``fix`` or
``broken``, sequence-level IS advised from its ESS measured under that preset, and suggested commands that carry
the dump's real path, shell-quoted."""

from __future__ import annotations

import math
import re
import shlex
import shutil
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import ROOT
from shape_dumps import defect_dump, dump, realmodel

import rcdiag
from rcdiag.catalogue.findings import codes_with
from rcdiag.diagnosis.prescribe import MOST_RESPONSES, effect_of
from rcdiag.records.report import Effect, PrescribedSetting, Prescription

SPIKES = {"spikes_many": (0.05, 16, 256, 512), "spikes_long": (0.008, 192, 256, 256)}
"""Spiky rollouts beyond the table's ``spikes`` (rate 0.002): one token in twenty spiked (a heavy tail over many
tokens, never sparse), and 0.8% of tokens spiked in long responses (sparse, but in most responses): rate, shortest
and longest response, responses."""


def _spiky(name: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    package = realmodel()
    from realmodel.engines import Rollout

    rate, shortest, longest, responses = SPIKES[name]
    path = tmp_path_factory.mktemp(name) / "dump"
    package.SCENARIOS[name] = Rollout(spike_rate=rate, spike_scale=4.0)
    try:
        package.make_dump(name, path, seed=1, n_responses=responses, min_len=shortest, max_len=longest)
    finally:
        del package.SCENARIOS[name]
    return path


def _log_ratios(path: Path) -> list[np.ndarray]:
    """Each response's float32 log-ratios old - rollout, read from the files."""
    rows = []
    for part in sorted(path.rglob("*.parquet")):
        table = pq.read_table(part)
        for old, rollout in zip(*(table.column(c).to_pylist() for c in ("old_log_prob", "rollout_log_prob")),
                                strict=True):  # fmt: skip
            rows.append(np.asarray(old, np.float32) - np.asarray(rollout, np.float32))
    return rows


# ----------------------------------------------------------------------------------------- 4. outliers only sparse


def test_a_heavy_tail_over_many_tokens_is_never_sparse_outliers(tmp_path_factory: pytest.TempPathFactory) -> None:
    path = _spiky("spikes_many", tmp_path_factory)
    beyond = np.concatenate([np.abs(d) >= 1.0 for d in _log_ratios(path)]).mean()
    assert beyond > 0.01  # more than the sparse_outliers definition's 1% of tokens
    report = rcdiag.analyze(path)
    assert report.verdict is not None
    assert (report.verdict.status, [c.cls for c in report.verdict.causes]) == ("fix", ["unexplained"])
    assert report.verdict.recommendation is None
    assert "sparse_outliers" not in {f.code for f in report.findings}


def test_sparse_outliers_stay_outliers() -> None:
    report = rcdiag.analyze(dump("spikes", 1))
    assert report.verdict is not None and [c.cls for c in report.verdict.causes] == ["outliers"]
    assert report.verdict.recommendation is not None and report.verdict.recommendation.config.rollout_rs


def test_rs_rejecting_tokens_in_most_responses_is_said_to_be_no_remedy(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Sparse outliers (under 1% of tokens) in long responses: token_k1 on |log-ratio| <= 1 nat rejects a token in
    most responses (counted from the files); the verdict keeps its class and says the setting is no remedy."""
    path = _spiky("spikes_long", tmp_path_factory)
    rows = _log_ratios(path)
    hit = np.mean([bool((np.abs(d) > 1.0).any()) for d in rows])
    assert hit > MOST_RESPONSES
    verdict = rcdiag.analyze(path).verdict
    assert verdict is not None and [c.cls for c in verdict.causes] == ["outliers"]
    assert verdict.recommendation is not None and verdict.recommendation.effect is not None
    assert verdict.recommendation.effect.responses_rejected == pytest.approx(hit, abs=1 / len(rows))
    assert verdict.headline.endswith("(not a remedy on this dump: see next steps)")
    assert "NOT A REMEDY" in verdict.recommendation.why
    assert verdict.next_steps[0].startswith(f"the prescribed RS rejects tokens in {hit:.0%} of the responses")


@pytest.mark.parametrize(("share", "remedy"), [(MOST_RESPONSES, True), (math.nextafter(MOST_RESPONSES, 1), False)])
def test_no_remedy_from_more_than_half_the_responses(share: float, remedy: bool) -> None:
    report = rcdiag.analyze(dump("spikes", 1))
    metrics = {**report.metrics, "rollout_corr/rollout_rs_seq_masked_fraction": share}
    config = PrescribedSetting("token", 2.0, "token_k1", "0.3679_2.718")
    prescription = Prescription(config, None, "", None, "why")
    measured, _, is_remedy = effect_of(prescription, rcdiag.Report(**{**_fields(report), "metrics": metrics}))
    assert is_remedy is remedy and isinstance(measured.effect, Effect)


def _fields(report: rcdiag.Report) -> dict:
    import dataclasses

    return {f.name: getattr(report, f.name) for f in dataclasses.fields(report)}


# --------------------------------------------------------------------------------- 5. one consistent answer

URGES = ("correct it", "Tighten the IS threshold", "add length-normalised RS", "decoupled_token_is", "token-level TIS")
"""Words that urge a correction: never in the next steps of a fix or broken verdict."""


@pytest.mark.parametrize(
    "make",
    [
        lambda: dump("drift", 1),
        lambda: dump("temperature_0.7", 2),
        lambda: dump("topk_50", 1),
        lambda: defect_dump("alignment", 1),
        lambda: defect_dump("softcap", 2),
        lambda: defect_dump("repetition_penalty", 1),
    ],
    ids=["trend", "temperature", "truncation", "alignment", "softcap", "penalty"],
)
@pytest.mark.parametrize("preset", [None, "decoupled_seq_is"])
def test_no_correction_is_urged_under_fix_or_broken(make: object, preset: str | None) -> None:
    """Neither the verdict's own steps nor those of the configured correction's findings (a sequence-level IS that
    raises is_ess_low) tune a correction when no threshold is the remedy."""
    config = None if preset is None else rcdiag.preset(preset)
    report = rcdiag.analyze(make(), config)  # type: ignore[operator]
    verdict = report.verdict
    assert verdict is not None and verdict.status in ("fix", "broken") and verdict.recommendation is None
    for step in verdict.next_steps:
        assert not any(words in step for words in URGES), step
    raised = [f.code for f in report.findings if f.code in codes_with("configuration")]
    said = [step for step in verdict.next_steps if "no threshold is the remedy" in step]
    assert len(said) == (1 if raised else 0) and all(code in said[0] for code in raised)


def test_sequence_is_advice_is_its_measured_ess() -> None:
    """The offer of sequence-level IS quotes the ESS decoupled_seq_is leaves on the dump: verl's token-weighted ESS
    of each response's weight min(exp(sum of its log-ratios), 2), computed here from the files."""
    path = dump("spikes", 1)
    steps = [s for s in rcdiag.analyze(path).verdict.next_steps if s.startswith("sequence-level IS")]  # type: ignore[union-attr]
    assert len(steps) == 1
    quoted = float(re.search(r"ESS is ([0-9.]+)", steps[0]).group(1))  # type: ignore[union-attr]
    rows = _log_ratios(path)
    weights = np.concatenate([np.full(d.size, min(math.exp(min(float(d.sum(dtype=np.float32)), 20.0)), 2.0))
                              for d in rows])  # fmt: skip
    ess = weights.mean() ** 2 / (weights**2).mean()
    assert quoted == pytest.approx(ess, rel=2e-3)  # quoted to 3 digits
    under = rcdiag.analyze(path, rcdiag.preset("decoupled_seq_is")).metrics["rollout_corr/rollout_is_eff_sample_size"]
    assert f"{under:.3g}" == steps[0].split("ESS is ")[1].split(" ")[0]


def test_suggested_commands_carry_the_dump_path_shell_quoted(tmp_path: Path) -> None:
    odd = tmp_path / "my run's dump $HOME"
    shutil.copytree(dump("bf16", 1), odd)
    verdict = rcdiag.analyze(odd).verdict
    assert verdict is not None
    commands = [c for step in verdict.next_steps for c in re.findall(r"`([^`]*)`", step)]
    assert commands and all("PATH" not in c for c in commands)
    for command in commands:
        argv = shlex.split(command)
        assert argv[:3] == ["rcdiag", "analyze", str(odd)], command


def test_the_quoted_command_runs(tmp_path: Path) -> None:
    """The suggested command, run as a shell would split it, analyzes the same dump."""
    import subprocess

    odd = tmp_path / "a dump; echo x"
    shutil.copytree(dump("bf16", 2), odd)
    verdict = rcdiag.analyze(odd).verdict
    assert verdict is not None
    command = re.findall(r"`([^`]*)`", verdict.next_steps[-1])[0]
    argv = shlex.split(command)
    done = subprocess.run([sys.executable, "-m", "rcdiag", *argv[1:], "--format", "json"], capture_output=True,
                          text=True, timeout=600, env={"PYTHONPATH": str(ROOT),
                                                       "PATH": str(Path(sys.executable).parent)})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert str(odd) in done.stdout
