"""The sweep's header verdict is analyze's on the same dump (issue 34, items 1 and 5), and its advice agrees with
it: ``fix``/``broken`` say no threshold is the remedy and urge none; ``correct`` puts the verdict's prescription
first; ``healthy`` says no correction is needed. Real-model dumps (tests/shape_dumps.py), several seeds, through
the CLI, in JSON and on the terminal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import run
from shape_dumps import defect_dump, dump

from rcdiag.records.report import PrescribedSetting, Prescription, Verdict
from rcdiag.sweep.advice import advise
from rcdiag.sweep.sweep_report import NO_THRESHOLD_REMEDY, NOT_URGED, PresetRank

SEEDS = (0, 1, 2)
SWEEP = ("--rs", "token_k1,seq_mean_k1", "--is", "token")
"""A grid holding the token IS rows (decoupled_token_is's) and two RS options: the presets over them are ranked."""


def _json(capsys: pytest.CaptureFixture, command: str, path: Path, *args: str) -> dict[str, Any]:
    code, out, err = run(capsys, command, str(path), "--format", "json", *args)
    assert code == 0, err
    return json.loads(out)


def _classes(verdict: dict[str, Any]) -> list[str]:
    return [cause["class"] for cause in verdict["causes"]]


@pytest.mark.parametrize(
    "path",
    [
        *(lambda s=s: dump("bf16", s) for s in SEEDS),
        lambda: dump("clean_fp32", 0),
        lambda: dump("fp16", 0),
        lambda: defect_dump("kv_fp8", 0),
        lambda: defect_dump("stale", 0),
    ],
    ids=["bf16_s0", "bf16_s1", "bf16_s2", "fp32", "fp16", "kv_fp8", "stale"],
)
def test_a_clean_dump_sweep_gives_analyze_verdict(capsys: pytest.CaptureFixture, path: Any) -> None:
    dumped = path()
    analyzed, swept = _json(capsys, "analyze", dumped), _json(capsys, "sweep", dumped, *SWEEP)
    assert swept["verdict"]["status"] == analyzed["verdict"]["status"] in ("identical", "healthy", "correct")
    assert _classes(swept["verdict"]) == _classes(analyzed["verdict"]) in ([], ["noise"])
    assert swept["verdict"] == analyzed["verdict"]  # the same verdict, from the same facts, word for word
    advice = swept["advice"]
    if analyzed["verdict"]["status"] == "correct":
        assert advice["correction"] == "prescribed"
        assert advice["first"] == analyzed["verdict"]["recommendation"]
    else:
        assert advice["correction"] in ("optional", "none") and advice["first"] is None
        assert advice["says"].startswith("no correction is needed")


@pytest.mark.parametrize("name", ["alignment", "offset", "prompt_in_mask"])
@pytest.mark.parametrize("seed", SEEDS)
def test_a_planted_bug_makes_the_sweep_urge_no_threshold(capsys: pytest.CaptureFixture, name: str, seed: int) -> None:
    dumped = defect_dump(name, seed)
    analyzed, swept = _json(capsys, "analyze", dumped), _json(capsys, "sweep", dumped, *SWEEP)
    status = analyzed["verdict"]["status"]
    assert status in ("fix", "broken")
    assert swept["verdict"]["status"] == status and _classes(swept["verdict"]) == _classes(analyzed["verdict"])
    expected = {"alignment": "alignment", "offset": "offset", "prompt_in_mask": "mask"}[name]
    assert expected in _classes(swept["verdict"])
    assert swept["verdict"]["recommendation"] is None
    assert swept["advice"] == {
        "status": status,
        "correction": "not_a_remedy",
        "says": f"{status}: {NO_THRESHOLD_REMEDY}",
        "first": None,
        "differs": None,
    }
    assert swept["recommendations"]  # still listed: what each threshold would do
    code, out, _ = run(capsys, "sweep", str(dumped), *SWEEP)
    assert code == 0
    text = " ".join(out.split())  # the terminal wraps long lines
    first_table = text.index("token_k1: share rejected by threshold")
    assert text.index(f"verdict {status.upper()}") < text.index(NO_THRESHOLD_REMEDY) < first_table  # first
    assert "Recommended" not in text and "to paste" not in text  # nothing urged
    assert f"RS thresholds ({NOT_URGED})" in text and f"verl presets on this dump ({NOT_URGED})" in text


def test_an_inverted_mask_sweeps_to_a_broken_verdict_and_a_k1_band_it_can_write(capsys: pytest.CaptureFixture) -> None:
    """Every valid token's log-ratio is exactly 0 (padding read as response): the k1 threshold that rejects the
    target share is below float32's step at 1, so no short decimal band parses back to it; the sweep writes the
    17-digit band (it crashed with an AssertionError before) and says the verdict first."""
    swept = _json(capsys, "sweep", defect_dump("inverted_mask", 0), *SWEEP)
    assert swept["verdict"]["status"] == "broken" and "mask" in _classes(swept["verdict"])
    k1 = next(r for r in swept["recommendations"] if r["option"] == "token_k1")
    low, high = (float(x) for x in k1["threshold"].split("_"))
    assert low <= 1.0 <= high and high - low < 1e-6


@pytest.mark.parametrize(
    ("scenario", "seed"), [("int4", 0), ("int4", 1), ("int4", 2), ("spikes", 0), ("spikes", 1)]
)  # spikes at seed 2 is fix (mismatch_trend fires there too): analyze's verdict, which the sweep's follows
def test_a_correct_verdict_leads_the_sweep(capsys: pytest.CaptureFixture, scenario: str, seed: int) -> None:
    dumped = dump(scenario, seed)
    analyzed, swept = _json(capsys, "analyze", dumped), _json(capsys, "sweep", dumped, *SWEEP)
    verdict = analyzed["verdict"]
    assert verdict["status"] == swept["verdict"]["status"] == "correct"
    assert swept["verdict"] == verdict
    prescription = verdict["recommendation"]
    advice = swept["advice"]
    assert advice["correction"] == "prescribed" and advice["first"] == prescription  # its effect measured too
    assert prescription["effect"] is not None
    said = "--target-reject 0.01"  # the per-option thresholds aim at the user's share: said plainly
    if prescription["preset"] is None:  # token_k1 on the outlier band: no preset
        assert advice["differs"].startswith("the prescription is no verl preset") and said in advice["differs"]
    else:
        ranked = next(p for p in swept["presets"] if p["name"] == prescription["preset"])
        if ranked["tier"] == 0:
            assert swept["presets"][0]["name"] == prescription["preset"]
            assert swept["presets"][0]["note"] == "the verdict's prescription"
        else:
            assert advice["differs"].startswith(f"{prescription['preset']} raises")
    code, out, _ = run(capsys, "sweep", str(dumped), *SWEEP)
    text = " ".join(out.split())
    assert code == 0 and text.index("verdict CORRECT") < text.index("the first recommendation is the verdict's")
    assert "Recommended RS thresholds" in text and NO_THRESHOLD_REMEDY not in text


def test_a_merged_sweep_state_keeps_the_verdict(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The saved sweep state carries analyze's accumulators and the sections: merge gives the same verdict."""
    dumped = defect_dump("offset", 0)
    state = tmp_path / "s.json"
    swept = _json(capsys, "sweep", dumped, *SWEEP, "--save-state", str(state))
    code, out, err = run(capsys, "merge", str(state), "--format", "json")
    assert code == 0, err
    merged = json.loads(out)
    assert merged["verdict"]["status"] == swept["verdict"]["status"] == "fix"
    assert _classes(merged["verdict"]) == _classes(swept["verdict"]) == ["offset"]
    assert merged["advice"]["correction"] == "not_a_remedy"


def test_the_html_sweep_shows_the_verdict_first(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("matplotlib")
    page = tmp_path / "sweep.html"
    code, _, err = run(capsys, "sweep", str(defect_dump("alignment", 0)), *SWEEP, "--html", str(page), "-q")
    assert code == 0, err
    html = page.read_text()
    assert html.index("<h2>Verdict</h2>") < html.index("<h2>Findings</h2>") < html.index(f"({NOT_URGED})</h2>")
    assert "BROKEN" in html and NO_THRESHOLD_REMEDY in html


# The rule, on hand-built verdicts: each status, and each reason the ranking and the prescription differ.
TOKEN_IS = PrescribedSetting("token", 2.0)


def _rank(name: str, tier: int = 0, note: str = "") -> PresetRank:
    return PresetRank(name, 0.0, 0.0, 0.9, True, 0.01, tier, note)


def _correct(preset: str | None) -> Verdict:
    return Verdict("correct", "correct: ...", recommendation=Prescription(TOKEN_IS, preset, "yaml", None, "why"))


def test_each_status_gets_its_advice() -> None:
    presets = (_rank("decoupled_token_icepop"), _rank("decoupled_token_is"))
    for status in ("fix", "broken"):
        advice, shown = advise(Verdict(status, "..."), presets, 0.01)
        assert (advice.correction, advice.urges, advice.first, shown) == ("not_a_remedy", False, None, presets)
    for status, correction in (("healthy", "optional"), ("identical", "none")):
        advice, shown = advise(Verdict(status, "..."), presets, 0.01)
        assert (advice.correction, advice.urges, advice.first, shown) == (correction, True, None, presets)
        assert advice.says.startswith("no correction is needed")
    advice, shown = advise(_correct("decoupled_token_is"), presets, None)  # no target: nothing differs
    assert [p.name for p in shown] == ["decoupled_token_is", "decoupled_token_icepop"] and advice.differs is None
    assert advice.first is not None and advice.first.config == TOKEN_IS


def test_the_sweep_says_why_its_ranking_differs_from_the_prescription() -> None:
    flagged = (_rank("decoupled_token_icepop"), _rank("decoupled_token_is", 2, "raises is_ess_low (ESS 0.2 < 0.3)"))
    advice, shown = advise(_correct("decoupled_token_is"), flagged, None)
    assert shown == flagged  # a preset raising a finding is not moved up
    assert advice.differs == "decoupled_token_is raises is_ess_low (ESS 0.2 < 0.3) on this dump: ranked with those "\
        "raising a finding"  # fmt: skip
    advice, _ = advise(_correct("decoupled_token_is"), (_rank("decoupled_geo_rs"),), None)
    assert (
        advice.differs == "decoupled_token_is is not among the presets this sweep computed (its options were not swept)"
    )
    advice, _ = advise(_correct(None), flagged, 0.02)
    assert advice.differs is not None and advice.differs.startswith("the prescription is no verl preset")
    assert "--target-reject 0.02" in advice.differs


def test_sweep_chunks_gives_analyze_chunks_verdict() -> None:
    """The library's in-memory sweep judges as ``analyze_chunks`` does (no dump to re-read: no prescription
    measured by either)."""
    import numpy as np

    import rcdiag
    from rcdiag.io import Chunk
    from rcdiag.sweep import sweep_chunks

    rng = np.random.default_rng(3)
    lengths = rng.integers(20, 60, size=300)
    old = -rng.exponential(2.0, lengths.sum()).astype(np.float32) - 0.5
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    for noise in (0.001, 0.3):  # healthy, then a large mismatch clipped at 0 (fix: not noise-like)
        rollout = np.minimum(old + rng.normal(0.0, noise, old.size), 0.0).astype(np.float32)
        chunks = [Chunk(old, rollout, offsets)]
        analyzed, swept = rcdiag.analyze_chunks(chunks), sweep_chunks(chunks)
        assert swept.verdict == analyzed.verdict is not None
        assert swept.advice is not None and swept.advice.status == analyzed.verdict.status


def test_the_verdict_pass_runs_no_debug_metrics_and_keeps_verl_0_7_1s_empty_batch_crash() -> None:
    """The sweep's verdict pass leaves out verl's ``training/*`` debug metrics (no rule reads them; they cost a fifth
    of what heading the sweep with a verdict adds), yet says what verl 0.7.1 does with a step without a valid token
    (``calculate_debug_metrics`` raises first, in decoupled mode), as analyze does: the same verdict, word for word."""
    import numpy as np

    import rcdiag
    from rcdiag.io import Chunk
    from rcdiag.metrics.debug import DebugMetrics
    from rcdiag.sweep import sweep_chunks
    from rcdiag.sweep.cells import Passes
    from rcdiag.sweep.grid import build_grid
    from rcdiag.sweep.state import SweepBatch

    rng = np.random.default_rng(5)
    lengths = rng.integers(20, 60, size=200)
    old = -rng.exponential(2.0, lengths.sum()).astype(np.float32) - 0.5
    rollout = (old + rng.normal(0.0, 0.05, old.size)).astype(np.float32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    steps = np.repeat([0, 1], 100).astype(np.int64)
    mask = np.ones(old.size, dtype=np.float32)
    mask[offsets[100] :] = 0.0  # step 1: no valid token
    chunks = [Chunk(old, rollout, offsets, mask=mask, steps=steps)]
    grid = build_grid(rs_options=["token_k1"], version="0.7.1")
    analyzed = rcdiag.analyze_chunks(chunks, rcdiag.CorrectionConfig(verl_version="0.7.1"))
    swept = sweep_chunks(chunks, grid)
    assert any(key.startswith("training/") for key in analyzed.steps[0].metrics)
    assert any("calculate_debug_metrics" in finding.message for finding in analyzed.findings)
    assert swept.verdict == analyzed.verdict is not None
    assert "calculate_debug_metrics" in json.dumps(swept.verdict.to_dict())
    batch = SweepBatch(grid, Passes())
    assert not any(isinstance(group, DebugMetrics) for group in batch.groups())
    assert batch.analysis.debug_raises_on_empty
