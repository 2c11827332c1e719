"""Issue 36, what a new user runs into (round three): the sweep's words, the pictures, and docs that must say what
the tool prints today. Every check runs the real CLI in a subprocess (tests/hostile.py ``run_capped``)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
from conftest import ROOT, SAMPLES, block_after, ragged_lists, require, write_dump
from hostile import run_capped

from rcdiag.sweep.recommend import not_config
from rcdiag.sweep.sweep_report import GRID_NOTE

HEALTHY = SAMPLES / "healthy.parquet"
GRID = "0.99_1.01,0.995_1.005,0.999_1.001"


def _sweep(*args: str | Path) -> tuple[str, dict]:
    """The sweep's table and its JSON, for the same arguments."""
    table = run_capped("sweep", *args, "-q")
    assert table.returncode == 0 and table.stderr == "", table.stderr
    done = run_capped("sweep", *args, "-q", "--format", "json")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return table.stdout, json.loads(done.stdout)


def _recommended(report: dict) -> dict[str, dict]:
    return {r["option"]: r for r in report["recommendations"]}


# ---------------------------------------------------------------------------------------------- 1. the sweep's words


def test_an_off_grid_recommendation_says_it_is_exact_and_names_the_nearest_grid_point() -> None:
    out, report = _sweep(HEALTHY, "--rs", "token_k1", "--thresholds", GRID)
    rec = _recommended(report)["token_k1"]
    assert rec["threshold"] == "0.9291488558_1.076253814" and rec["token_reject"] <= 0.01
    shares = {row["threshold"]: row["metrics"]["rollout_corr/rollout_rs_token_k1_masked_fraction"] for row in
              report["sweep"]}  # fmt: skip
    assert rec["on_grid"] is False
    assert rec["nearest_grid_threshold"] == "0.99_1.01"  # 0.589 of the tokens: the grid's share nearest 0.01
    assert rec["nearest_grid_share"] == shares["0.99_1.01"] == min(shares.values())
    assert "nearest grid point" in out and "0.99_1.01 (0.588952)" in out
    assert GRID_NOTE.split(";")[0].split(", not")[0] in " ".join(out.split())  # said in words: an exact value
    # the recommended value put on the grid: it says so
    out, report = _sweep(HEALTHY, "--rs", "token_k1", "--thresholds", GRID + ",0.9291488558_1.076253814")
    rec = _recommended(report)["token_k1"]
    assert (rec["on_grid"], rec["nearest_grid_threshold"]) == (True, "0.9291488558_1.076253814")
    assert "on the grid" in out


def test_a_band_no_one_should_paste_is_marked_and_offered_as_no_yaml() -> None:
    out, report = _sweep(SAMPLES / "topk_offset.parquet", "--rs", "seq_sum_k1,seq_mean_k1")
    widest = _recommended(report)["seq_sum_k1"]
    assert widest["threshold"] == "5.48236e-110_1.82403e+109"
    assert widest["not_config"] == (
        "the band is wider than e^+-20, verl's clamp on any ratio: the dump's mismatch is far beyond correction"
    )
    assert _recommended(report)["seq_mean_k1"]["not_config"] is None
    yaml = out[out.index("verl YAML") : out.index("NOT CONFIG")]
    assert "seq_mean_k1" in yaml and "seq_sum_k1" not in yaml and "e+109" not in yaml
    assert "5.48236e-110_1.82403e+109 (do not paste)" in out
    assert "NOT CONFIG seq_sum_k1 5.48236e-110_1.82403e+109: no YAML offered, do not paste it" in out
    # the other limits: beyond the clamp an IS threshold truncates nothing, a k1 band rejects nothing; a float limit
    assert not_config("is_token", "5e8") == "beyond verl's clamp (e^20): it truncates nothing"
    assert not_config("is_token", "4e8") is None
    assert (
        not_config("token_k1", "1e-9_1e9")
        == "the band is wider than e^+-20, verl's clamp on any ratio: it rejects nothing"
    )
    assert not_config("seq_sum_k1", "5.563e-309_1.7976e+308") is not None and "float limit" in not_config(
        "seq_sum_k1", "5.563e-309_1.7976e+308"
    )
    assert not_config("seq_max_k3", "1e-45") == "the threshold sits at a float32 limit"
    assert not_config("seq_max_k3", "0.05") is None


def test_is_recommendations_read_as_truncation_never_rejection(tmp_path: Path) -> None:
    out, report = _sweep(HEALTHY, "--is", "token,sequence")
    section = out[out.index("Recommended IS thresholds (TIS)") : out.index("The thresholds are exact")]
    assert "rejected" not in section
    assert "closest to 0.01 of the weights truncated, not above it" in section
    assert "0.0099639 of token weights" in section and "0.0078125 of sequence weights" in section
    assert "responses with a truncated weight" in section and "tokens under a truncated weight" in section
    assert _recommended(report)["is_token"]["token_reject"] == 875 / 87_817  # tokens truncated of valid tokens
    page = tmp_path / "s.html"
    done = run_capped("sweep", HEALTHY, "--is", "token,sequence", "-q", "--html", page)
    assert done.returncode == 0, done.stderr
    html = page.read_text()
    recs = html[html.index("Recommended thresholds") : html.index("Every threshold")]
    assert "rejected" not in recs.split("verl presets")[0] and "weights truncated" in recs


# --------------------------------------------------------------------------------------------------- 2. the pictures


def _gaussian_dump(tmp_path: Path, sigma: float = 0.02) -> Path:
    """Unimodal noise: per-token log-ratios N(0, sigma), 400 responses of 200 tokens, no step column."""
    rng = np.random.default_rng(36)
    old = -rng.uniform(0.5, 3.0, (400, 200))
    rollout = old - rng.normal(0.0, sigma, old.shape)
    return write_dump(tmp_path / "gauss.parquet", ragged_lists(old, rollout, np.ones(old.shape, dtype=bool)))


def _drawn_bars(ax: Any) -> tuple[np.ndarray, np.ndarray]:
    (stairs,) = [p for p in ax.patches if type(p).__name__ == "StepPatch"]
    data = stairs.get_data()
    return np.asarray(data.edges), np.asarray(data.values)


def _unimodal(values: np.ndarray) -> bool:
    """Rises (or stays) to one peak, then falls (or stays)."""
    peak = int(np.argmax(values))
    return bool(np.all(np.diff(values[: peak + 1]) >= 0) and np.all(np.diff(values[peak:]) <= 0))


def test_the_png_histogram_of_gaussian_noise_is_one_hump_around_zero(tmp_path: Path) -> None:
    require("matplotlib", "plot")
    import rcdiag
    from rcdiag.render.charts import dashboard

    dump = _gaussian_dump(tmp_path)
    done = run_capped("analyze", dump, "--png", tmp_path / "g.png", "-q")
    assert done.returncode == 0 and (tmp_path / "g.png").stat().st_size > 10_000, done.stderr
    report = rcdiag.analyze(dump)
    fig = dashboard([(None, report)], "title")
    edges, heights = _drawn_bars(fig.subfigs[1].axes[0])
    centres = (edges[:-1] + edges[1:]) / 2
    near = np.abs(centres) < 0.1  # +-5 sigma: every bar of the noise
    assert near.sum() >= 9
    assert _unimodal(heights[near]), heights[near]
    peak = int(np.argmax(heights))
    assert edges[peak] < 0 < edges[peak + 1]  # the hump's top holds 0: no hole there
    assert fig.subfigs[1].axes[0].xaxis.get_transform().linthresh >= 0.02  # the linear part reaches the noise
    # drawn as raw counts per logarithmic bin (the old picture), the same noise reads as two humps
    counts = np.asarray(report.log_ratio.counts, float)
    assert not _unimodal(counts[np.abs(np.asarray([-1e9, *report.log_ratio.edges])) < 0.1])


def test_the_png_headline_wraps_and_is_never_cut(tmp_path: Path) -> None:
    require("matplotlib", "plot")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    import rcdiag
    from rcdiag.render.charts import dashboard

    done = run_capped("analyze", HEALTHY, "--png", tmp_path / "h.png", "-q")
    assert done.returncode == 0, done.stderr
    report = rcdiag.analyze(HEALTHY)
    assert report.verdict is not None and len(report.verdict.headline) > 150  # longer than one line
    fig = dashboard([(None, report)], "title")
    band = fig.subfigs[0]
    headline = band.texts[1]
    assert headline.get_text().count("\n") >= 1  # wrapped
    assert " ".join(headline.get_text().split("\n")) == report.verdict.headline  # every word, none cut
    assert not any("…" in t.get_text() for t in band.texts)
    renderer = FigureCanvasAgg(fig).get_renderer()
    box = headline.get_window_extent(renderer)
    assert box.x1 <= fig.bbox.width  # inside the picture
    below = min(t.get_window_extent(renderer).y1 for t in band.texts[2:3])
    assert below <= box.y0  # the next steps start under the headline's last line


# ------------------------------------------------------------------------------- 3. docs that say what it prints


def _read(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


def test_readme_explain_example_is_what_explain_prints_today() -> None:
    command = "rcdiag analyze sample_data/rollout_temperature_only.parquet --explain"
    shown = block_after(_read("README.md"), command)
    done = run_capped(*command.split()[1:], cwd=ROOT)
    assert done.returncode == 0, done.stderr
    printed = {line.rstrip() for line in done.stdout.splitlines()}
    quoted = [line for line in shown if line != "..."]
    assert len(quoted) >= 8
    assert [line for line in quoted if line.rstrip() not in printed] == []
    for page in ("README.md", "docs/verdict.md"):  # the old evidence is gone
        assert "scaled copy" not in _read(page), page


def test_install_docs_name_the_source_checkout_not_a_package_index() -> None:
    readme, index = _read("README.md"), _read("docs/index.md")
    for text in (readme, index, _read("sample_data/README.md"), _read("docs/report.md")):
        assert not re.search(r"pip install (rcdiag\b|\"rcdiag\[|'rcdiag\[)", text)
    assert "`pip install .`" in readme and "\npip install .\n" in index  # the same command for the tool alone
    assert "is not on a package index" in index
    extras = set(re.findall(r'pip install "\.\[(\w+)\]"', index))
    declared = set(re.findall(r"^(\w+) = \[", _read("pyproject.toml"), re.M))
    assert extras and extras <= declared
    dev = re.search(r'pip install -e "\.\[([\w,]+)\]"', index)
    assert dev is not None and set(dev.group(1).split(",")) <= declared


def test_sample_readme_says_what_quantized_4bit_and_topk_offset_give() -> None:
    samples = _read("sample_data/README.md")
    done = run_capped("analyze", SAMPLES / "quantized_4bit.parquet", "--explain", "--format", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["verdict"]["status"] == "correct"
    assert {f["code"] for f in report["findings"]} == {"seq_is_hopeless"}
    row = next(line for line in samples.splitlines() if line.startswith("| `quantized_4bit.parquet`"))
    assert "`CORRECT`" in row and "`seq_is_hopeless`" in row and "no finding" not in row
    done = run_capped("analyze", SAMPLES / "topk_offset.parquet", "--format", "json")
    assert done.returncode == 0, done.stderr
    (gap,) = [f["message"] for f in json.loads(done.stdout)["findings"] if f["code"] == "kl_k3_disagree"]
    errors = round(float(re.search(r"= [\d.]+, ([\d.]+) standard errors of kl", gap).group(1)))  # type: ignore[union-attr]
    assert errors == 107
    assert f"about {errors} standard errors" in samples
    assert f"gap ≈ {errors} standard errors" in _read("docs/findings.md")


WORDS = {5: "five", 6: "six", 7: "seven"}
ORDINALS = {6: "sixth", 7: "seventh"}


def test_every_page_counts_the_detectors_the_catalogue_has() -> None:
    """Six detectors: every analyze runs five, ``--explain`` adds token_specific (it needs the by-token table)."""
    from rcdiag.catalogue.findings import FINDINGS
    from rcdiag.explain.detectors import DETECTORS

    assert len(DETECTORS) == sum(1 for spec in FINDINGS if spec.explain) == 6
    word, default = WORDS[len(DETECTORS)], WORDS[len(DETECTORS) - 1]
    for page, phrase in (
        ("README.md", "every analyze runs the bias detectors"),
        ("README.md", f"{ORDINALS[len(DETECTORS)]} bias detector, `token_specific`"),
        ("docs/index.md", f"**bias detectors**, on every analyze: {default} findings"),
        ("docs/explain.md", f"{word} findings that tell a bug"),
        ("docs/findings.md", f"Every analyze runs {default} detectors"),
    ):
        assert phrase in _read(page), (page, phrase)
        assert not re.search(r"\b(four|seven) (bias )?detectors", _read(page)), page


def test_input_page_lists_every_synthetic_scenario() -> None:
    from rcdiag.io.synthetic import SCENARIOS

    text = _read("docs/input.md")
    sentence = text[text.index("Its scenarios") :]
    sentence = sentence[: sentence.index(":\n")]
    assert re.findall(r"`(\w+)`", sentence.split(") are", 1)[1]) == list(SCENARIOS)


def test_verdict_page_and_headline_say_the_stop_token_has_probability_one() -> None:
    import pyarrow.parquet as pq

    table = pq.read_table(SAMPLES / "stop_token.parquet").to_pydict()
    stop = [lp for ids, lps in zip(table["token_ids"], table["rollout_log_prob"], strict=True)
            for i, lp in zip(ids, lps, strict=True) if i == 1]  # fmt: skip
    assert stop and set(stop) == {0.0}  # the rollout engine's log-prob of its stop token: probability 1
    done = run_capped("analyze", SAMPLES / "stop_token.parquet", "--explain", "--format", "json")
    assert done.returncode == 0, done.stderr
    verdict = json.loads(done.stdout)["verdict"]
    assert "token_specific" in [c["class"] for c in verdict["causes"]]
    assert "zero probability" not in verdict["headline"] and "mismatch on a few token ids" in verdict["headline"]
    row = next(line for line in _read("docs/verdict.md").splitlines() if line.startswith("| `token_specific` |"))
    assert "probability 1" in row and "`token_specific` (`--explain`" in row


def test_readme_help_time_is_the_latest_measurement() -> None:
    readme = re.search(r"`rcdiag --help` takes \*\*([\d.]+) s\*\*", _read("README.md"))
    latest = re.search(
        r"^\| `rcdiag --help` \| [^|]* \| [^|]* \| \*\*([\d.]+) s\*\*", _read("docs/performance.md"), re.M
    )
    assert readme is not None and latest is not None
    assert readme.group(1) == latest.group(1) == "0.23"


def test_recommendations_at_float_limits_are_no_config_and_still_find_their_grid_neighbour(tmp_path: Path) -> None:
    """Two 1,000-token responses with a log-ratio of 0.8 at every token, half of them allowed out: seq_sum_k1's
    order statistic (800) is beyond any band a spec states, sequence IS's threshold is infinite."""
    old = np.full((2, 1000), -1.0)
    dump = write_dump(tmp_path / "d.parquet", ragged_lists(old, old - 0.8, np.ones(old.shape, dtype=bool)))
    out, report = _sweep(dump, "--target-reject", "0.5")
    recs = _recommended(report)
    assert recs["seq_sum_k1"]["threshold"] == "5.563e-309_1.7976e+308"
    assert "float limit" in recs["seq_sum_k1"]["not_config"]
    assert recs["is_sequence"]["threshold"] == "inf"
    assert recs["is_sequence"]["not_config"] == "beyond verl's clamp (e^20): it truncates nothing"
    assert recs["seq_sum_k2"]["nearest_grid_threshold"] == "10.0"  # next to 1.8e308 in value: no underflow
    assert recs["is_token"]["nearest_grid_threshold"] == "2.5"  # share 0, the nearest in value of those
    yaml = out[out.index("verl YAML") :]
    assert "rollout_is_threshold: inf" not in yaml and "1.7976e+308" not in yaml.split("NOT CONFIG")[0]
