"""Pictures (issue 11): ``--html`` opened in headless Chromium with the network cut, the ``--png`` dashboard, the
sparklines, the size bound, the missing plotting extra and the start-up imports."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, SAMPLES, run
from hypothesis import given, settings
from hypothesis import strategies as st
from page_checks import not_blank, opened

from rcdiag.catalogue import metric
from rcdiag.render.panels import MAX_POINTS, TRENDS, sparkline, thinned

pytest.importorskip("matplotlib")
pytest.importorskip("PIL.Image")  # matplotlib's own dependency (page_checks.not_blank reads the pictures with it)

PROBLEM = str(SAMPLES / "train_forgot_temperature.parquet")
HEALTHY = str(SAMPLES / "healthy.parquet")
ENGINE = ("--is", "token", "--rs", "token_k1,seq_mean_k3", "--rs-threshold", "0.5_2.0,0.01")
MAIN_METRICS = ("kl", "k3_kl", "chi2_token", "chi2_seq", "ppl_ratio", "rollout_is_mean", "rollout_is_eff_sample_size",
                "rollout_rs_masked_fraction")  # fmt: skip


# ------------------------------------------------------------------------------------------- the browser


def test_the_harness_sees_remote_requests_and_console_errors(browser: object, tmp_path: Path) -> None:
    """The checks below can fail: a page with a CDN script, a web font, a remote image and a console error."""
    page = tmp_path / "bad.html"
    page.write_text(
        '<!DOCTYPE html><html><head><script src="https://cdn.example.com/x.js"></script>'
        '<link rel="stylesheet" href="https://fonts.example.com/f.css"></head>'
        '<body><p>hello</p><img src="http://example.com/i.png"><script>console.error("boom")</script></body></html>'
    )
    load = browser.open_offline(page)  # type: ignore[attr-defined]
    assert len(load.requests) == 4 and len(load.failed) == 3
    assert any("boom" in line for line in load.console_errors)
    assert "hello" in load.text


def test_analyze_html_opens_offline_with_every_finding_and_metric(
    browser: object, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    _, load, report = opened(browser, capsys, tmp_path, "analyze", PROBLEM, *ENGINE)
    codes = {f["code"] for f in report["findings"]}
    assert {"kl_high", "chi2_token_high", "rs_rejects_all_tokens"} <= codes  # T=0.6 vs 1.0; k3 bound 0.01
    for finding in report["findings"]:
        assert finding["code"] in load.text and finding["message"] in load.text
    for name in MAIN_METRICS:
        assert re.search(rf"\brollout_corr/{name}\b", load.text), name
    for panel in TRENDS:
        assert panel.title in load.text  # the SVG text is text, not glyph outlines
    assert "verl warns: rollout_is_mean in [0.5, 2]" in load.text


def test_compare_html_overlays_both_dumps_offline(
    browser: object, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    _, load, comparison = opened(browser, capsys, tmp_path, "compare", HEALTHY, PROBLEM, "--is", "token")
    assert comparison["findings"]
    for finding in comparison["findings"]:
        assert finding["code"] in load.text
    for name in MAIN_METRICS[:5]:
        assert f"A: {name}" in load.text and f"B: {name}" in load.text  # both dumps in every trend legend
    assert HEALTHY in load.text and PROBLEM in load.text


def test_html_needs_no_script_and_fetches_nothing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    page = tmp_path / "r.html"
    assert run(capsys, "analyze", PROBLEM, "-q", "--html", str(page), "-o", str(tmp_path / "r.txt"))[0] == 0
    text = page.read_text()
    assert "<script" not in text.lower()  # tables and charts need no JavaScript
    assert not re.findall(r"""(?:src|href)\s*=\s*["'](?!#)""", text)  # only in-page references (SVG ids)
    assert "@import" not in text and not re.findall(r"url\((?!#)", text)  # clip paths are url(#id)
    assert text.count("<svg") == len(TRENDS) + 1  # six trends and the log-ratio histogram


# ----------------------------------------------------------------------------------------------- the PNG


def test_png_dashboard_is_large_and_not_blank(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    png = tmp_path / "dash.png"
    code, _, err = run(capsys, "analyze", PROBLEM, *ENGINE, "-q", "--png", str(png), "-o", str(tmp_path / "r.txt"))
    assert code == 0 and f"wrote {png}" in err
    width, height = not_blank(png.read_bytes())
    assert width >= 1500 and height >= 1000


def test_merge_draws_the_merged_report(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    states = [str(tmp_path / f"{name}.json") for name in ("a", "b")]
    for sample, state in zip((HEALTHY, str(SAMPLES / "healthy_t06.parquet")), states, strict=True):
        assert run(capsys, "analyze", sample, "-q", "--save-state", state, "-o", str(tmp_path / "x.txt"))[0] == 0
    page, png = tmp_path / "merged.html", tmp_path / "merged.png"
    code, _, _ = run(capsys, "merge", *states, "--html", str(page), "--png", str(png), "-o", str(tmp_path / "m.txt"))
    assert code == 0 and "rcdiag report" in page.read_text()
    assert not_blank(png.read_bytes())[0] >= 1500


def test_png_is_refused_by_compare(capsys: pytest.CaptureFixture) -> None:
    code, _, err = run(capsys, "compare", HEALTHY, HEALTHY, "--png", "x.png")
    assert code == 2 and "--png" in err


def test_a_picture_path_is_checked_before_the_dump_is_read(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code, _, err = run(capsys, "analyze", "no-such-dump.parquet", "--html", str(tmp_path / "nowhere" / "r.html"))
    assert code == 2 and "--html" in err and "does not exist" in err


# ------------------------------------------------------------------------------------- warning lines, size


def test_warning_lines_are_the_catalogues_thresholds() -> None:
    for panel in TRENDS:
        expected = set()
        for key in panel.keys:
            for threshold in metric(key).thresholds:  # type: ignore[union-attr]
                if threshold.finding is not None:
                    bound = threshold.bound if isinstance(threshold.bound, tuple) else (threshold.bound,)
                    expected |= set(bound) | ({-threshold.bound} if threshold.kind == "max_abs" else set())
        assert {w.value for w in panel.warnings()} == expected
    by_title = {p.title: {w.value for w in p.warnings()} for p in TRENDS}
    assert by_title["IS weight mean"] == {0.5, 2.0} and by_title["Effective sample size"] == {0.3}
    assert by_title["Chi-square divergence"] == {1.0}  # the seed's chi2 warning line


def test_warning_lines_name_whose_threshold_they_draw() -> None:
    """verl documents no bound on the RS rejected share: that line is rcdiag's own (rs_rejects_most_tokens)."""
    sources = {(p.title, w.value): w.source for p in TRENDS for w in p.warnings()}
    assert sources[("IS weight mean", 2.0)] == "verl" and sources[("Effective sample size", 0.3)] == "verl"
    assert sources[("RS rejected share of tokens", 0.2)] == "rcdiag"


def test_a_long_run_stays_small(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """3,000 steps: every chart thinned to MAX_POINTS per line, the step table cut; the page stays far below 5 MB."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    steps, rng = 3000, np.random.default_rng(0)
    lengths = rng.integers(4, 12, 2 * steps)
    old = [(-rng.random(n) * 3).astype(np.float32) for n in lengths]
    rollout = [o + rng.normal(0, 0.05, o.size).astype(np.float32) for o in old]
    table = pa.table({
        "old_log_prob": pa.array([o.tolist() for o in old], pa.list_(pa.float32())),
        "rollout_log_prob": pa.array([np.minimum(r, 0).tolist() for r in rollout], pa.list_(pa.float32())),
        "step": pa.array(np.repeat(np.arange(steps), 2)),
    })  # fmt: skip
    pq.write_table(table, tmp_path / "long.parquet")
    page, png = tmp_path / "long.html", tmp_path / "long.png"
    code, _, _ = run(capsys, "analyze", str(tmp_path / "long.parquet"), *ENGINE, "-q", "--html", str(page),
                     "--png", str(png), "-o", str(tmp_path / "r.txt"))  # fmt: skip
    assert code == 0
    size = page.stat().st_size
    assert size < 5_000_000, size
    polylines = re.findall(r'<path d="M ([^"]*)"', page.read_text())
    assert max(p.count(" L ") + 1 for p in polylines) <= MAX_POINTS
    assert "400 of 3000 steps, evenly spaced" in page.read_text()


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.one_of(st.none(), st.floats(-1e6, 1e6)), min_size=1, max_size=300), most=st.integers(2, 40))
def test_thinning_keeps_every_runs_extremes_in_order(values: list[float | None], most: int) -> None:
    steps = [float(i) for i in range(len(values))]
    kept_steps, kept = thinned(steps, values, most)
    assert len(kept) <= max(most, 2 * (most // 2)) and kept_steps == sorted(kept_steps)
    present = [v for v in values if v is not None]
    if present:
        assert max(present) in kept and min(present) in kept  # no spike is lost


def test_sparkline_by_hand() -> None:
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == "▁▂▃▄▅▆▇█"
    assert sparkline([5.0, 5.0, 5.0]) == "▁▁▁"
    assert sparkline([0.0, None, 1.0]) == "▁ █"
    assert sparkline([None, None]) == ""
    assert sparkline([0, 0, 10, 10], width=2) == "▁█"  # each character is the mean of its run
    assert sparkline([0, 2, 4, 6], width=2) == "▂▇"  # means 1 and 5 on [0, 6]: bars int(1/6*8) = 1 and int(5/6*8) = 6
    assert sparkline([float("nan"), 1.0, 2.0]) == " ▁█"
    assert sparkline([0.5, 0.75, 1.0], floor=0.0) == "▅▇█"  # shares from 0: int(0.5*8) = 4, int(0.75*8) = 6


def test_analyze_table_has_a_trend_row_of_every_step(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = run(capsys, "analyze", PROBLEM, "--format", "json")
    kl = [s["metrics"]["rollout_corr/kl"] for s in json.loads(out)["steps"]]
    code, out, _ = run(capsys, "analyze", PROBLEM, "--details")
    trend = next(line for line in out.splitlines() if line.startswith("trend"))
    assert code == 0 and sparkline(kl, 12) in trend
    low, high = kl.index(min(kl)), kl.index(max(kl))
    assert sparkline(kl, 12)[low] == "▁" and sparkline(kl, 12)[high] == "█"  # 6 steps: one character each


def test_compare_table_has_a_trend_row_for_a_b_and_the_difference(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = run(capsys, "compare", HEALTHY, PROBLEM, "--format", "json")
    steps = json.loads(out)["steps"]
    kl = [next(m for m in s["metrics"] if m["key"] == "rollout_corr/kl") for s in steps]
    expected = [sparkline([m[side] for m in kl]) for side in ("a", "b", "difference")]
    code, out, _ = run(capsys, "compare", HEALTHY, PROBLEM)
    trend = next(line for line in out.splitlines() if line.startswith("trend"))
    assert code == 0 and [cell.strip() for cell in trend.split("│")[1:4]] == expected


# ---------------------------------------------------------------------------- the extra and start-up cost


def test_without_matplotlib_html_and_png_exit_2_naming_the_extra() -> None:
    for flag in ("--html", "--png"):
        code = (
            "import sys; sys.modules['matplotlib'] = None; from rcdiag.cli import main; "
            f"main(['analyze', 'no-such-dump.parquet', '{flag}', 'x'])"
        )
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip() == (
            f'rcdiag: error: {flag} needs matplotlib, which is not installed: pip install "rcdiag[plot]".'
        )


@pytest.mark.parametrize("args", [["--help"], ["analyze", "--help"], ["compare", "--help"]])
def test_help_imports_no_plotting_library(args: list[str]) -> None:
    code = (
        f"import sys\nfrom rcdiag.cli import main\ntry:\n    main({args!r})\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('matplotlib', 'numpy', 'pyarrow') if m in sys.modules), file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.stderr.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize(("ci", "outcome"), [("true", "1 error"), ("", "1 skipped")])
def test_a_missing_browser_fails_in_ci_and_skips_elsewhere(ci: str, outcome: str) -> None:
    env = {"PATH": str(Path(sys.executable).parent), "CI": ci, "RCDIAG_CHROMIUM": "/nonexistent/chromium"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfs", "tests/render/test_pictures.py",
         "-k", "harness_sees"], capture_output=True, text=True, cwd=ROOT, env=env,
    )  # fmt: skip
    assert outcome in done.stdout and (done.returncode != 0) == bool(ci), done.stdout
    assert "missing component: chromium" in done.stdout and "apt-get install chromium" in done.stdout


# ------------------------------------------------------------------------------------------------- docs


def test_docs_pictures_exist_and_are_pictures() -> None:
    page = (ROOT / "docs" / "report.md").read_text()
    for name, least in (("report.png", (1200, 1500)), ("dashboard.png", (1500, 1000)),
                        ("dashboard_one_batch.png", (1500, 900))):  # fmt: skip
        assert f"(img/{name})" in page
        width, height = not_blank((ROOT / "docs" / "img" / name).read_bytes())
        assert width >= least[0] and height >= least[1], name
    script = (ROOT / "docs" / "make_pictures.py").read_text()
    assert "python docs/make_pictures.py" in page and "--png" in script and "--html" in script


def test_an_empty_panel_says_why() -> None:
    import dataclasses

    import rcdiag
    from rcdiag.render.html import render_html

    report = rcdiag.analyze(HEALTHY)  # no IS, no RS
    steps = tuple(dataclasses.replace(s, metrics={**s.metrics, "rollout_corr/ppl_ratio": None}) for s in report.steps)
    text = render_html(dataclasses.replace(report, steps=steps))
    assert text.count("no finite value at any step") == 1  # ppl_ratio
    assert text.count("IS metrics need --is token|sequence") == 2  # IS mean and ESS
    assert text.count("RS metrics need --rs and --rs-threshold") == 1
