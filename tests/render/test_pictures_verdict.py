"""Pictures that carry the verdict (issue 24, item 8): the HTML report and the PNG dashboard open with the verdict,
dumps without steps show what varies inside them, compare draws A and B apart in every panel, and a sweep's axis
shows its grid whatever the recommendation. Figures are checked through matplotlib's own objects (colours, limits,
texts), pages in a real headless Chromium (DOM order, computed colours)."""

from __future__ import annotations

import dataclasses
import io
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import SAMPLES, run
from page_checks import assert_clean_offline_load, not_blank

import rcdiag
from rcdiag.compare import compare, compare_reports
from rcdiag.records.report import Cause, Effect, PrescribedSetting, Prescription, Report, Verdict
from rcdiag.sweep import sweep
from rcdiag.sweep.grid import build_grid

pytest.importorskip("matplotlib")
import itertools

from matplotlib.colors import to_hex

from rcdiag.render import charts, log_hist
from rcdiag.render.charts import SIDES, dashboard, draw_sweep, figure, histogram_figure, trend_figure
from rcdiag.render.dashboard import render_png
from rcdiag.render.html import render_comparison_html, render_html, render_sweep_html
from rcdiag.render.panels import STATUS_COLOURS, TRENDS, weight_tails
from rcdiag.render.text import BREAKDOWNS

HEALTHY = SAMPLES / "healthy.parquet"
PROBLEM = SAMPLES / "train_forgot_temperature.parquet"
OUTLIERS = SAMPLES / "outliers.parquet"
YAML = "rollout_is: token\nrollout_is_threshold: 1.5\nrollout_rs: token_k1\nrollout_rs_threshold: 0.5_2.0\n"
PRESCRIPTION = Prescription(
    config=PrescribedSetting("token", 1.5, "token_k1", "0.5_2.0"),
    preset="decoupled_token_is",
    yaml=YAML,
    effect=Effect(tokens_rejected=0.0123, responses_rejected=0.25, is_ess=0.87, is_truncated_share=0.0042),
    why="token-level TIS stays stable as responses grow",
)  # fmt: skip
CAUSE = Cause("temperature", ("temperature_mismatch", "kl_high"), "log-probs are a scaled copy <slope 0.6>")


def verdict(status: str, prescribed: bool) -> Verdict:
    """A hand-made verdict of ``status``, with or without a prescription."""
    return Verdict(
        status=status,  # type: ignore[arg-type]
        headline=f"{status}: a hand-made headline & <tag>",
        causes=() if status in ("identical", "healthy") else (CAUSE,),
        recommendation=PRESCRIPTION if prescribed else None,
        next_steps=("set the trainer's temperature to the rollout's", "dump again and re-run analyze"),
    )


@pytest.fixture(scope="module")
def flat(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """outliers.parquet without its step column: one batch, as most real dumps are."""
    path = tmp_path_factory.mktemp("flat") / "flat.parquet"
    pq.write_table(pq.read_table(OUTLIERS).drop_columns(["step"]), path)
    return path


@pytest.fixture(scope="module")
def flat_explained(flat: Path) -> Report:
    return rcdiag.analyze(flat, explain=True)


@pytest.fixture(scope="module")
def stepped() -> Report:
    return rcdiag.analyze(PROBLEM)


# ----------------------------------------------------------------------------------------- the verdict first


@pytest.mark.parametrize("prescribed", [True, False])
@pytest.mark.parametrize("status", ["identical", "healthy", "correct", "fix", "broken"])
def test_html_opens_with_every_field_of_the_verdict(stepped: Report, status: str, prescribed: bool) -> None:
    text = render_html(dataclasses.replace(stepped, verdict=verdict(status, prescribed)))
    verdict_at = text.index('<div class="verdict')
    assert verdict_at < text.index("<h2>Input and configuration") < text.index("<h2>Findings")
    assert f'<span class="badge {status}">{status.upper()}</span>' in text
    assert f".badge.{status}{{background:{STATUS_COLOURS[status]}}}" in text
    assert f"{status}: a hand-made headline &amp; &lt;tag&gt;" in text  # escaped, never raw HTML
    if status not in ("identical", "healthy"):
        assert "temperature_mismatch, kl_high" in text and "scaled copy &lt;slope 0.6&gt;" in text
    assert "set the trainer&#x27;s temperature to the rollout&#x27;s" in text and "dump again" in text
    if prescribed:
        assert "<pre>rollout_is: token\nrollout_is_threshold: 1.5\n" in text and "decoupled_token_is" in text
        for shown in ("0.0123 (1.23%)", "0.25 (25%)", "0.87", "0.0042 (0.42%)", "stays stable as responses grow"):
            assert shown in text, shown
    else:
        assert "None: no setting prescribed for this dump." in text and "<pre>" not in text


def test_a_report_without_a_verdict_says_so(stepped: Report) -> None:
    text = render_html(dataclasses.replace(stepped, verdict=None))
    assert "no verdict in this report" in text and text.index("no verdict") < text.index("Input and configuration")


def test_the_verdict_is_first_on_the_page_in_a_browser(browser: object, stepped: Report, tmp_path: Path) -> None:
    """DOM order and the badge's computed colour, in headless Chromium; the screenshot of the top shows it."""
    page = tmp_path / "fix.html"
    page.write_text(render_html(dataclasses.replace(stepped, verdict=verdict("fix", True))))
    load = browser.open_offline(page, height=900, full_page=False, evaluate={  # type: ignore[attr-defined]
        "sections": "[...document.querySelectorAll('section > h2')].map(h => h.textContent)",
        "first": "document.querySelector('section').querySelector('.verdict .headline').textContent",
        "badge": "getComputedStyle(document.querySelector('.badge')).backgroundColor",
        "top": "document.querySelector('.verdict').getBoundingClientRect().top",
        "yaml": "document.querySelector('.verdict pre').textContent",
    })  # fmt: skip
    assert_clean_offline_load(load, page)
    assert load.values["sections"][:3] == ["Verdict", "Input and configuration", "Findings"]
    assert load.values["first"] == "FIXfix: a hand-made headline & <tag>"
    assert load.values["badge"] == "rgb({}, {}, {})".format(
        *(int(STATUS_COLOURS["fix"][i : i + 2], 16) for i in (1, 3, 5))
    )
    assert load.values["top"] < 200  # in the first screen
    assert load.values["yaml"] == YAML.rstrip()
    shot = np.asarray(__import__("PIL.Image").Image.open(io.BytesIO(load.screenshot)).convert("RGB"))
    assert _pixels_of(shot, STATUS_COLOURS["fix"]) > 500  # the badge and the box's border are drawn


def _pixels_of(pixels: np.ndarray, colour: str) -> int:
    rgb = np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)])
    return int((np.abs(pixels.astype(int) - rgb).sum(axis=2) < 12).sum())


@pytest.mark.parametrize("prescribed", [True, False])
def test_png_opens_with_the_verdict(stepped: Report, prescribed: bool) -> None:
    report = dataclasses.replace(stepped, verdict=verdict("broken", prescribed))
    fig = dashboard([(None, report)], "title")
    band, panels = fig.subfigs
    texts = [t.get_text() for t in band.texts]
    assert texts[:2] == ["BROKEN", "broken: a hand-made headline & <tag>"]
    assert to_hex(band.texts[0].get_bbox_patch().get_facecolor()) == STATUS_COLOURS["broken"]
    assert any("temperature [temperature_mismatch, kl_high]" in t for t in texts)
    assert "1. set the trainer's temperature to the rollout's" in texts
    if prescribed:
        assert "rollout_is_threshold: 1.5" in texts and "verl preset: decoupled_token_is" in texts
        assert any("tokens rejected 0.0123 (1.23%)" in t for t in texts)
    else:
        assert "none: no setting prescribed for this dump" in texts
    assert [ax.get_title(loc="left") for ax in panels.axes] == [p.title for p in TRENDS]  # steps: the trends stay
    assert band.bbox.y0 > panels.bbox.y0  # the verdict above the panels
    pixels = np.asarray(__import__("PIL.Image").Image.open(io.BytesIO(render_png(report))).convert("RGB"))
    assert _pixels_of(pixels[: pixels.shape[0] // 4], STATUS_COLOURS["broken"]) > 300  # the badge, at the top
    assert pixels.shape[1] == 1920


# ------------------------------------------------------------------------------------ dumps without steps


def test_a_dump_without_steps_shows_what_varies_inside_it(flat_explained: Report) -> None:
    report = flat_explained
    assert not report.steps and report.log_ratio is not None
    fig = dashboard([(None, report)], "title")
    titles = [ax.get_title(loc="left") for ax in fig.subfigs[1].axes]
    assert titles == ["Token log-ratio log π_train − log π_rollout", "Token IS weights π_train / π_rollout",
                      *BREAKDOWNS.values()]  # fmt: skip
    assert not set(titles) & {p.title for p in TRENDS}  # no panel of one dot
    histogram = fig.subfigs[1].axes[0]
    (stairs,) = [p for p in histogram.patches if type(p).__name__ == "StepPatch"]
    drawn = stairs.get_data().values
    h = report.log_ratio
    threshold = log_hist.linthresh(h.edges, h.counts)
    bars = log_hist.bars(h.edges, h.counts, threshold)  # tokens per axis unit: a bar's area is its tokens
    np.testing.assert_allclose(drawn, np.maximum(bars.heights, min(x for x in bars.heights if x > 0) / 4))
    widths = np.diff(log_hist.transform(threshold).transform(np.asarray(bars.edges)))
    assert float(np.dot(bars.heights, widths)) == pytest.approx(sum(h.counts))
    text = render_html(report)
    assert "Inside the dump (no step column)" in text and "Trends over steps" not in text
    assert text.count("<svg") == 1 + 1 + 3 + len(report.explain.traces)  # type: ignore[union-attr]
    assert "whole dump</text>" not in text  # no one-dot panel


def test_a_dump_without_steps_png_without_explain(flat: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    png = tmp_path / "flat.png"
    code, _, _ = run(capsys, "analyze", str(flat), "-q", "--png", str(png), "-o", str(tmp_path / "r.txt"))
    assert code == 0
    width, height = not_blank(png.read_bytes())
    assert width == 1920 and height >= 700


def test_weight_tails_are_the_shares_of_tokens_beyond_each_edge(flat_explained: Report, flat: Path) -> None:
    """Exact at the histogram's edges: the share of valid tokens with log-ratio >= edge (< -edge below 1)."""
    table = pq.read_table(flat)
    ratios = []
    for old, rollout, mask in zip(*(table.column(c).to_pylist() for c in
                                    ("old_log_prob", "rollout_log_prob", "response_mask")), strict=True):  # fmt: skip
        ratios += [o - r for o, r, m in zip(np.float32(old), np.float32(rollout), mask, strict=True) if m]
    lr = np.asarray(ratios, np.float32)
    upper, lower = weight_tails(flat_explained.log_ratio)  # type: ignore[arg-type]
    assert upper and lower
    for x, share in upper:
        assert share == pytest.approx(float((lr >= np.float32(math.log(x))).mean()), abs=2 / lr.size), x
    for x, share in lower:
        assert share == pytest.approx(float((lr < np.float32(math.log(x))).mean()), abs=2 / lr.size), x


def test_is_weights_are_drawn_under_the_prescription_else_the_configured_is(flat_explained: Report) -> None:
    prescribed = dataclasses.replace(flat_explained, verdict=verdict("correct", True))
    ax = charts.weights_figure([(None, prescribed)]).axes[0]  # type: ignore[union-attr]
    lines = {line.get_label(): line for line in ax.get_lines()}
    cap = next(label for label in lines if label.startswith("IS caps at 1.5"))
    assert "prescription, 0.42% beyond" in cap and list(lines[cap].get_xdata()) == [1.5, 1.5]
    configured = rcdiag.analyze(flat_explained.input.path, rcdiag.CorrectionConfig(rollout_is="token"))
    ax = charts.weights_figure([(None, dataclasses.replace(configured, verdict=None))]).axes[0]  # type: ignore[union-attr]
    high = configured.metrics["rollout_corr/rollout_is_ratio_fraction_high"]
    assert f"IS caps at 2 (configuration, {100 * high:.3g}% beyond)" in [line.get_label() for line in ax.get_lines()]
    sequence = dataclasses.replace(PRESCRIPTION, config=dataclasses.replace(PRESCRIPTION.config, rollout_is="sequence"))
    seq = dataclasses.replace(
        flat_explained, verdict=dataclasses.replace(verdict("fix", True), recommendation=sequence)
    )
    ax = charts.weights_figure([(None, seq)]).axes[0]  # type: ignore[union-attr]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("sequence-level IS, threshold 1.5, 0.42% beyond of responses, ESS 0.87" in t for t in legend)
    assert not [line for line in ax.get_lines() if line.get_label().startswith("IS caps")]  # not a token cap
    ax = charts.weights_figure([(None, dataclasses.replace(flat_explained, verdict=None))]).axes[0]  # type: ignore[union-attr]
    assert any("no IS configured or prescribed" in t.get_text() for t in ax.get_legend().get_texts())


# ------------------------------------------------------------------------------------------------ compare


def _sides_of(ax: object) -> dict[str, set[tuple[str, str, str]]]:
    """(colour, line style, marker) of each labelled line and step patch, by side ("A: kl" -> A)."""
    out: dict[str, set[tuple[str, str, str]]] = {"A": set(), "B": set()}
    for line in ax.get_lines():  # type: ignore[attr-defined]
        side = line.get_label().split(":")[0]
        if side in out:
            out[side].add((to_hex(line.get_color()), line.get_linestyle(), line.get_marker()))
    for patch in ax.patches:  # type: ignore[attr-defined]
        if patch.get_label() in out:
            out[patch.get_label()].add((to_hex(patch.get_edgecolor()), str(patch.get_linestyle()), ""))
    return out


def _assert_apart(ax: object) -> None:
    sides = _sides_of(ax)
    assert sides["A"] and sides["B"], sides
    for part in range(3):  # colour, line style and marker: each alone tells A from B
        if part == 2 and not all(m for _, _, m in sides["A"] | sides["B"]):
            continue
        assert not {s[part] for s in sides["A"]} & {s[part] for s in sides["B"]}, (part, sides)
    legend = {t.get_text() for t in ax.get_legend().get_texts()}  # type: ignore[attr-defined]
    assert any(t.startswith("A") for t in legend) and any(t.startswith("B") for t in legend)


def test_compare_draws_a_and_b_apart_in_every_panel(stepped: Report) -> None:
    comparison = compare(HEALTHY, PROBLEM, rcdiag.CorrectionConfig(rollout_is="token", rollout_rs="token_k1",
                                                                          rollout_rs_threshold="0.5_2.0"))  # fmt: skip
    sides = [("A", comparison.a), ("B", comparison.b)]
    for panel in TRENDS:
        _assert_apart(trend_figure(panel, sides).axes[0])
    _assert_apart(histogram_figure(sides).axes[0])  # type: ignore[union-attr]
    text = render_comparison_html(comparison)
    assert text.count("<svg") == len(TRENDS) + 1
    colours = [look.colours[0] for look in SIDES.values()]  # A, B and the further dumps of a compare of several
    assert len(set(colours)) == len(SIDES) >= 2 and charts.WARN not in {
        c for look in SIDES.values() for c in look.colours
    }


def test_compare_without_steps_draws_inside_both_dumps_apart(flat: Path, tmp_path: Path) -> None:
    other = tmp_path / "healthy_flat.parquet"
    pq.write_table(pq.read_table(HEALTHY).drop_columns(["step"]), other)
    config = rcdiag.CorrectionConfig(rollout_is="token")
    a, b = rcdiag.analyze(other, config), rcdiag.analyze(flat, config)
    a = dataclasses.replace(a, verdict=verdict("healthy", False))
    comparison = compare_reports(a, b)
    sides = [("A", a), ("B", b)]
    _assert_apart(histogram_figure(sides).axes[0])  # type: ignore[union-attr]
    _assert_apart(charts.weights_figure(sides).axes[0])  # type: ignore[union-attr]
    text = render_comparison_html(comparison)
    assert "Inside the dumps (no step column), A and B overlaid" in text and "Trends over steps" not in text
    assert text.index("Verdict per dump") < text.index("<h2>Dumps")
    assert "Dump A: healthy: a hand-made headline" in text  # each side's own verdict
    assert f"Dump B: {e(b.verdict.headline)}" in text  # type: ignore[union-attr]


def e(text: str) -> str:
    import html

    return html.escape(text, quote=True)


# -------------------------------------------------------------------------------------------------- sweep


K1_GRID = [1.001, 1.002, 1.004, 1.01, 1.02, 1.04, 1.1, 1.25, 1.5, 2.0]
"""token_k1's default grid of upper bounds (0.999_1.001 ... 0.5_2.0): ten points near 10^0."""


def _fraction(ax: object, x: float) -> float:
    """Where data ``x`` sits across the axes (0 left, 1 right)."""
    return float(ax.transAxes.inverted().transform(ax.transData.transform((x, 1e-3)))[0])  # type: ignore[attr-defined]


def test_a_recommendation_beyond_the_grid_is_an_arrow_at_the_edge() -> None:
    """The issue's picture: ten k1 grid points squashed near 10^0 beside a star at 7e14. Now the grid spreads over
    the axis, and the recommendation is an arrow at the right edge with its value."""
    fig = figure(5.6, 3.6)
    ax = fig.subplots()
    shares = [0.9 / (i + 1) ** 2 for i in range(10)]
    draw_sweep(ax, "seq_sum_k1", {"tokens": (K1_GRID, shares)}, (7.26e14, 0.01, "1.37702e-15_7.26205e+14"), 0.01)
    (curve,) = [line for line in ax.get_lines() if line.get_label() == "tokens"]
    where = [_fraction(ax, x) for x in curve.get_xdata()]
    assert 0 < where[0] < 0.1 and 0.9 < where[-1] < 1  # the grid spans the axis
    assert min(b - a for a, b in itertools.pairwise(where)) > 0.02  # no two points on top of each other
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels[0] == "1.001" and labels[-1] == "2" and set(labels) <= {f"{x:g}" for x in K1_GRID}
    assert any(t.get_text() == "recommended 1.37702e-15_7.26205e+14\nabove the grid" for t in ax.texts)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "recommended 1.37702e-15_7.26205e+14 (beyond the grid)" in legend
    (arrow,) = [line for line in ax.get_lines() if line.get_marker() == ">"]
    assert list(arrow.get_xdata()) == [1.0] and list(arrow.get_ydata()) == [0.01]  # at the right edge, its share


def test_a_recommendation_just_off_the_grid_widens_the_axis() -> None:
    fig = figure(5.6, 3.6)
    ax = fig.subplots()
    grid = [1.5, 2.0, 2.5, 3.0, 4.0, 5.0]  # is_token's TIS caps
    draw_sweep(ax, "is_token", {"TIS tokens": (grid, [0.02, 0.01, 0.005, 0.002, 0.001, 0.0])}, (1.3, 0.03, "1.3"),
               0.01)  # fmt: skip
    star = next(line for line in ax.get_lines() if line.get_marker() == "*")
    assert 0 < _fraction(ax, star.get_xdata()[0]) < 0.1 and star.get_label() == "recommended 1.3"
    assert not ax.texts


def test_a_recommendation_inside_the_grid_is_a_star_on_its_curve() -> None:
    fig = figure(5.6, 3.6)
    ax = fig.subplots()
    draw_sweep(ax, "token_k1", {"tokens": ([1.5, 2.0, 5.0], [0.1, 0.01, 0.001])}, (2.0, 0.01, "0.5_2.0"), 0.01)
    star = next(line for line in ax.get_lines() if line.get_marker() == "*")
    assert list(star.get_xdata()) == [math.log(2.0)] and star.get_label() == "recommended 0.5_2.0"  # spaced by ln U
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1.5", "2", "5"]  # labelled with the grid's values


def test_sweep_page_draws_a_far_recommendation_at_the_grids_edge() -> None:
    """The issue's case: a k1 recommendation at 7e14 beside a grid near 1 (set by hand on a real sweep)."""
    report = sweep(OUTLIERS, build_grid(rs_options=["token_k1"]))
    (rec,) = report.recommendations
    assert rec.threshold is not None
    far = dataclasses.replace(rec, threshold="1e-15_7.26205e+14")
    text = render_sweep_html(dataclasses.replace(report, recommendations=(far,)))
    assert "recommended 1e-15_7.26205e+14 (beyond the grid)" in text and "above the grid" in text
    near = render_sweep_html(report)
    assert f"recommended {rec.threshold}<" in near and "beyond the grid" not in near
