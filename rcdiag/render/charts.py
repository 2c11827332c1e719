"""Charts drawn with matplotlib (the ``plot`` extra), on its Agg and SVG canvases (never pyplot: no GUI backend, no
global figure state). Each ``draw_*`` function draws one chart on given axes, so the PNG dashboard and the HTML
report draw the same charts; ``svg`` and ``png`` turn a figure into inline SVG text or PNG bytes.

Everything drawn is an aggregate (per-step metrics, bin counts), so a chart's size does not grow with the dump.
"""

from __future__ import annotations

import io
import math
import re
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import matplotlib
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg
from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.figure import Figure, SubFigure
from matplotlib.ticker import MaxNLocator

from rcdiag.catalogue import short_key
from rcdiag.records.report import BucketRow, Histogram, Report, Verdict
from rcdiag.render import log_hist
from rcdiag.render.panels import (
    STATUS_COLOURS,
    TRENDS,
    Panel,
    Series,
    WeightSetting,
    framework_effect_facts,
    panel_keys,
    series,
    weight_setting,
    weight_tails,
)
from rcdiag.render.text import BREAKDOWNS, bucket_label, fmt
from rcdiag.render.verdict_text import effect_text
from rcdiag.settings.correction import SAFETY_BOUND

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")


@dataclass(frozen=True)
class Side:
    """compare: how one dump is drawn in every panel. A and B share no colour, line style or marker, so either
    tells them apart (in print, for colour-blind readers); a panel's several metrics take a dump's colours in turn.
    Neither uses the warning lines' red and dashes."""

    colours: tuple[str, ...]
    style: str
    marker: str


SIDES = {
    "A": Side(("#1f77b4", "#17becf", "#9467bd"), "-", "o"),
    "B": Side(("#ff7f0e", "#8c564b", "#e377c2"), "-.", "s"),
    "C": Side(("#2ca02c", "#bcbd22", "#7f7f7f"), ":", "^"),
    "D": Side(("#9467bd", "#e377c2", "#17becf"), "-", "D"),
    "E": Side(("#8c564b", "#7f7f7f", "#bcbd22"), "-.", "v"),
}
WARN = "#d62728"


def side_look(label: str) -> Side:
    """How dump ``label`` is drawn; past E (compare with many dumps) the looks repeat in turn."""
    if label in SIDES:
        return SIDES[label]
    looks = list(SIDES.values())
    return looks[sum(map(ord, label)) % len(looks)]


STYLE: dict[RcKeyType, Any] = {
    "font.size": 11,
    "axes.titlesize": 13,
    "axes.titleweight": "bold",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.fontsize": 9,
    "legend.framealpha": 0.8,
    "axes.formatter.useoffset": False,
    "svg.fonttype": "none",  # text stays text: searchable, and far smaller than glyph paths
}
LOG_TICKS = {-100: "−100", -1: "−1", -1e-2: "−10⁻²", -1e-4: "−10⁻⁴", 0: "0", 1e-4: "10⁻⁴", 1e-2: "10⁻²", 1: "1",
             100: "100"}  # fmt: skip
REACH = 4.0
"""A warning line is drawn when it lies within REACH times the data's magnitude of the data; a line further
away would flatten the data to a line, so the panel says where it is instead."""


@dataclass(frozen=True)
class Line:
    """A series to draw, with its colour and line style."""

    series: Series
    color: str
    style: str = "-"
    marker: str = "o"


@dataclass(frozen=True)
class Drawn:
    """A histogram to draw (one dump's, or one side's of a compare), with its label, colour, line style and
    marker."""

    label: str
    histogram: Histogram
    colour: str
    style: str = "-"
    marker: str = "o"


def drawn_sides(reports: Sequence[tuple[str | None, Report]]) -> list[Drawn]:
    """Each report's log-ratio histogram with its side's colour and style (one report: "all tokens")."""
    out = []
    for side, report in reports:
        if report.log_ratio is None:
            continue
        if side is None:
            out.append(Drawn("all tokens", report.log_ratio, PALETTE[0]))
        else:
            look = side_look(side)
            out.append(Drawn(side, report.log_ratio, look.colours[0], look.style, look.marker))
    return out


def figure(width: float, height: float, dpi: int = 100) -> Figure:
    """A figure with rcdiag's style (``matplotlib.rc_context`` only holds while drawing, so it is applied here)."""
    with matplotlib.rc_context(STYLE):
        return Figure(figsize=(width, height), dpi=dpi, layout="constrained")


def trend_lines(report: Report, panel: Panel, side: str | None = None) -> list[Line]:
    """The panel's series for one report; with ``side`` (compare), labelled and styled as that dump's."""
    out = []
    for i, key in enumerate(panel_keys(panel, report)):
        if side is None:
            out.append(Line(series(report, key, short_key(key)), PALETTE[i % len(PALETTE)]))
        else:
            drawn = side_look(side)
            colour = drawn.colours[i % len(drawn.colours)]
            out.append(Line(series(report, key, f"{side}: {short_key(key)}"), colour, drawn.style, drawn.marker))
    return out


def dashboard(reports: Sequence[tuple[str | None, Report]], title: str) -> Figure:
    """The PNG: the verdict first (one report), then the six trend panels of ``TRENDS`` in 2x3 (the seed guide's
    figure) for a dump with steps, or what varies inside a dump without steps (the log-ratio distribution, the IS
    weights under the prescription, explain's breakdowns)."""
    report = reports[0][1]
    verdict = report.verdict if len(reports) == 1 else None
    rows = verdict_rows(verdict) if verdict is not None else ([], [])
    width, dpi = 16, 120
    band = 0.0
    if verdict is not None:
        headline = (len(headline_lines(verdict, width * dpi, dpi)) - 1) * HEADLINE_LINE
        band = VERDICT_TOP + headline + VERDICT_LINE * max(len(rows[0]), len(rows[1]))
    has_steps = any(r.steps for _, r in reports)
    explained = report.explain is not None and len(reports) == 1
    panels = 10.0 if has_steps else (9.0 if explained else 4.6)
    fig = figure(width, band + panels + 0.6, dpi=dpi)
    with matplotlib.rc_context(STYLE):
        fig.suptitle(title, x=0.01, ha="left", fontsize=13)
        if verdict is not None:
            # the title row goes with the panels
            top, bottom = fig.subfigures(2, 1, squeeze=False, height_ratios=[band, panels + 0.6])[:, 0]
            draw_verdict(top, verdict, rows)
        else:
            bottom = fig
        if has_steps:
            for ax, panel in zip(bottom.subplots(2, 3).flat, TRENDS, strict=True):
                draw_trend(ax, panel, panel_lines(panel, reports))
            return fig
        grid = bottom.add_gridspec(2 if explained else 1, 3)
        histograms = drawn_sides(reports)
        if histograms:
            draw_histogram(bottom.add_subplot(grid[0, :2]), histograms, share=len(reports) > 1)
        draw_weights(bottom.add_subplot(grid[0, 2]), histograms, weight_settings(reports))
        if explained and report.explain is not None:
            for i, (name, buckets) in enumerate(report.explain.breakdowns.bucketed()):
                draw_explained(bottom.add_subplot(grid[1, i]), BREAKDOWNS[name], buckets)
    return fig


VERDICT_TOP = 0.55
"""The verdict band's top margin and its badge line, in inches."""
VERDICT_LINE = 0.25
"""One line of the verdict band, in inches (11-point text)."""
VERDICT_WRAP = (118, 70)
"""Characters per line in the verdict band's left (status, causes, next steps) and right (prescription) columns."""
EVIDENCE_LINES = 4
"""At most this many lines of one cause's evidence in the PNG (the HTML and the terminal show all of it)."""


def verdict_rows(verdict: Verdict) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The verdict band's lines below the badge, as (kind, text): kind ``title``, ``text`` or ``code``; the left
    column holds the causes and next steps, the right one the prescription."""
    left: list[tuple[str, str]] = []
    width, right_width = VERDICT_WRAP
    if verdict.causes:
        left.append(("title", "Causes"))
        for cause in verdict.causes:
            text = f"• {cause.cls.replace('_', ' ')} [{', '.join(cause.codes)}]: {cause.evidence}"
            lines = textwrap.wrap(text, width, subsequent_indent="   ")
            if len(lines) > EVIDENCE_LINES:
                lines = [
                    *lines[: EVIDENCE_LINES - 1],
                    lines[EVIDENCE_LINES - 1][: width - 30] + " … (full text: --html)",
                ]
            left += [("text", line) for line in lines]
    if verdict.next_steps:
        left.append(("title", "Next steps"))
        for i, step in enumerate(verdict.next_steps, 1):
            left += [("text", line) for line in textwrap.wrap(f"{i}. {step}", width, subsequent_indent="   ")]
    right: list[tuple[str, str]] = [("title", "Prescription")]
    rec = verdict.recommendation
    if rec is None:
        right.append(("text", "none: no setting prescribed for this dump"))
        return left, right
    spoken = rec.framework
    if spoken is not None:  # --as NAME: its own setting first, then verl's
        match = spoken.match.replace("_", " ")
        right.append(("text", f"in {spoken.release} ({match} as verl's):"))
        right += [("code", line) for line in spoken.paste.rstrip().splitlines()]
        if spoken.effect is not None:
            facts = ", ".join(f"{what} {value}" for what, value in framework_effect_facts(spoken.effect))
            right += [
                ("text", line) for line in textwrap.wrap(f"measured: {facts}", right_width, subsequent_indent="   ")
            ]
        right.append(("text", "verl's setting:"))
    if rec.preset:
        right.append(("text", f"verl preset: {rec.preset}"))
    right += [("code", line) for line in rec.yaml.rstrip().splitlines()]
    if rec.effect is not None:
        right.append(("text", effect_text(rec.effect)))
        right[-1:] = [("text", line) for line in textwrap.wrap(right[-1][1], right_width, subsequent_indent="   ")]
    if rec.why:
        right += [("text", line) for line in textwrap.wrap(f"why: {rec.why}", right_width, subsequent_indent="   ")]
    return left, right


HEADLINE_POINTS = 14.0
"""The headline's font size (bold)."""
HEADLINE_LINE = HEADLINE_POINTS * 1.25 / 72
"""One headline line, in inches (its font size at a line spacing of 1.25)."""


def _badge_end(verdict: Verdict) -> float:
    """Where the headline starts, as a share of the band's width: past the badge (bold capitals, about 0.0105 of
    the width each)."""
    return 0.032 + 0.0105 * len(verdict.status)


def headline_lines(verdict: Verdict, width_px: float, dpi: float) -> list[str]:
    """The headline wrapped, word by word, to the band's width right of the badge (``width_px`` the band's, in
    pixels at ``dpi``), each line measured as the PNG draws it: never cut (the HTML report and the terminal show
    the same words)."""
    from matplotlib.font_manager import FontProperties

    renderer = RendererAgg(1, 1, dpi)
    font = FontProperties(size=HEADLINE_POINTS, weight="bold")
    room = (1 - _badge_end(verdict) - 0.008) * width_px
    lines: list[str] = []
    for word in verdict.headline.split():
        trial = f"{lines[-1]} {word}" if lines else word
        if lines and renderer.get_text_width_height_descent(trial, font, ismath=False)[0] <= room:
            lines[-1] = trial
        else:
            lines.append(word)
    return lines or [""]


def draw_verdict(
    fig: Figure | SubFigure, verdict: Verdict, rows: tuple[list[tuple[str, str]], list[tuple[str, str]]]
) -> None:
    """The verdict band of the PNG: a coloured status badge and the headline, the causes and next steps on the
    left, the prescription (its YAML and measured effect) on the right."""
    height = fig.get_figheight() if isinstance(fig, Figure) else fig.bbox.height / fig.dpi
    colour = STATUS_COLOURS.get(verdict.status, "#57606a")
    fig.patch.set_facecolor("#f6f8fa")
    fig.text(0.012, 1 - 0.3 / height, verdict.status.upper(), color="white", fontsize=16, fontweight="bold",
             va="center", bbox={"boxstyle": "round,pad=0.4", "facecolor": colour, "edgecolor": colour})  # fmt: skip
    after = _badge_end(verdict)
    lines = headline_lines(verdict, fig.bbox.width, fig.dpi)
    fig.text(after, 1 - (0.3 - HEADLINE_LINE / 2) / height, "\n".join(lines), fontsize=HEADLINE_POINTS,
             fontweight="bold", va="top", linespacing=1.25, color="#1d2329")  # fmt: skip
    below = (len(lines) - 1) * HEADLINE_LINE  # the band's rows start under the headline's last line
    for x, rows_ in ((0.008, rows[0]), (0.62, rows[1])):
        for i, (kind, text) in enumerate(rows_):
            y = 1 - (VERDICT_TOP + below + (i + 0.5) * VERDICT_LINE) / height
            styles: dict[str, dict[str, Any]] = {"title": {"fontweight": "bold", "fontsize": 12},
                                                 "code": {"family": "monospace", "fontsize": 11},
                                                 "text": {"fontsize": 11}}  # fmt: skip
            style = styles[kind]
            fig.text(x, y, text, va="center", color="#1d2329", **style)


def trend_figure(panel: Panel, reports: Sequence[tuple[str | None, Report]]) -> Figure:
    """One trend panel as its own figure (the HTML report's grid)."""
    fig = figure(5.6, 3.6)
    draw_trend(fig.subplots(), panel, panel_lines(panel, reports))
    return fig


def histogram_figure(reports: Sequence[tuple[str | None, Report]]) -> Figure | None:
    """The log-ratio distribution of one report, or of both sides overlaid (as shares); ``None`` without one."""
    histograms = drawn_sides(reports)
    if not histograms:
        return None
    fig = figure(11, 4.2)
    draw_histogram(fig.subplots(), histograms, share=len(reports) > 1)
    return fig


def weights_figure(reports: Sequence[tuple[str | None, Report]]) -> Figure | None:
    """The token IS weights of one report, or of both sides overlaid; ``None`` without a histogram."""
    histograms = drawn_sides(reports)
    if not histograms:
        return None
    fig = figure(5.6, 3.6)
    draw_weights(fig.subplots(), histograms, weight_settings(reports))
    return fig


def panel_lines(panel: Panel, reports: Sequence[tuple[str | None, Report]]) -> list[Line]:
    """Every report's lines for the panel (compare: both sides)."""
    return [line for side, report in reports for line in trend_lines(report, panel, side)]


def draw_trend(ax: Axes, panel: Panel, lines: Sequence[Line]) -> None:
    """One trend panel: its series over steps, verl's warning lines near the data, the ideal value."""
    with matplotlib.rc_context(STYLE):
        ax.set_title(panel.title, loc="left")
        ax.set_xlabel("step")
        drawn = [line for line in lines if line.series.present]
        if not drawn:
            ax.set_axis_off()
            why = "no finite value at any step" if lines else f"not computed for this configuration:\n{panel.needs()}"
            ax.text(0.5, 0.5, why, ha="center", va="center",
                    transform=ax.transAxes, color="#555555",
                    bbox={"boxstyle": "round,pad=0.8", "facecolor": "#f3f3f3", "edgecolor": "#cccccc"})  # fmt: skip
            return
        values: list[float] = []
        for line in drawn:
            ys = [math.nan if v is None else v for v in line.series.values]
            values += [v for v in ys if math.isfinite(v)]
            few = len(ys) <= 40
            ax.plot(line.series.steps, ys, line.style, color=line.color, label=line.series.label,
                    marker=line.marker if few else None, markersize=4 if len(ys) > 1 else 8, linewidth=1.6)  # fmt: skip
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if all(len(line.series.steps) == 1 for line in drawn):  # no step column: the whole dump is one point
            ax.set_xticks([drawn[0].series.steps[0]], ["whole dump"])
            ax.set_xlabel("")
        lo, hi = min(values), max(values)
        magnitude = max(abs(lo), abs(hi))
        reach = REACH * magnitude if magnitude > 0 else math.inf  # all zero: every line shows how far away it is
        for warn in panel.warnings():
            if warn.value < 0 <= lo:  # the negative side of a |x| bound, where the data never goes
                continue
            label = f"{warn.source} warns: {warn.label}"
            if lo - reach <= warn.value <= hi + reach:
                ax.axhline(warn.value, color=WARN, linestyle="--", linewidth=1.2, label=label)
            else:  # a legend entry only: drawing it would flatten the data
                ax.plot([], [], "--", color=WARN, linewidth=1.2, label=f"{label} (off scale)")
        if panel.ideal is not None and lo - reach <= panel.ideal <= hi + reach:
            ax.axhline(panel.ideal, color="#2ca02c", linestyle=":", linewidth=1.2, label=f"ideal {fmt(panel.ideal)}")
        _dedupe_legend(ax)


def _dedupe_legend(ax: Axes) -> None:
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    ax.legend(unique.values(), unique.keys(), loc="best")


def draw_histogram(ax: Axes, histograms: Sequence[Drawn], share: bool = False) -> None:
    """The log-ratio distribution on a symmetric-log axis whose linear part holds the bulk of the tokens, each bar
    its tokens (or, with ``share``, shares of tokens) per unit of the drawn axis, so a bar's area is its tokens and
    unimodal noise reads as one hump (``rcdiag.render.log_hist``); a logarithmic height axis; the region where
    verl's clamps bite is shaded."""
    scaled = [_scaled(drawn.histogram, share) for drawn in histograms]
    pooled = [sum(column) for column in zip(*scaled, strict=True)]
    threshold = log_hist.linthresh(histograms[0].histogram.edges, pooled)
    drawn_bars = [log_hist.bars(d.histogram.edges, counts, threshold) for d, counts in zip(histograms, scaled,
                                                                                            strict=True)]  # fmt: skip
    positive = [h for b in drawn_bars for h in b.heights if h > 0]
    floor = min(positive) / 4 if positive else 0.5
    with matplotlib.rc_context(STYLE):
        ax.set_title("Token log-ratio log π_train − log π_rollout", loc="left")
        ax.set_xscale("symlog", **log_hist.axis_kwargs(threshold))
        ax.set_yscale("log")
        ax.set_xlabel(f"log-ratio (linear within ±{threshold:.3g}, logarithmic beyond; outer bins hold everything "
                      "beyond ±100)")  # fmt: skip
        ax.set_ylabel(("share of tokens" if share else "tokens") + " per axis unit (bar area ∝ tokens)")
        for drawn, b in zip(histograms, drawn_bars, strict=True):
            ax.stairs([max(h, floor) for h in b.heights], b.edges, baseline=floor, fill=len(histograms) == 1,
                      color=drawn.colour, linestyle=drawn.style, alpha=0.55 if len(histograms) == 1 else 0.9,
                      label=drawn.label, linewidth=1.5)  # fmt: skip
        outer = drawn_bars[0].edges
        ax.axvspan(SAFETY_BOUND, outer[-1], color=WARN, alpha=0.07)
        ax.axvspan(outer[0], -SAFETY_BOUND, color=WARN, alpha=0.07,
                   label=f"|log-ratio| > {SAFETY_BOUND:g}: verl clamps")  # fmt: skip
        ticks = {0.0: "0", threshold: f"{threshold:.2g}", -threshold: f"−{threshold:.2g}"}
        ticks.update({t: label for t, label in LOG_TICKS.items() if abs(t) >= 2 * threshold})
        ax.set_xticks(list(ticks), list(ticks.values()))
        ax.set_xticks([], minor=True)
        ax.legend(loc="upper left")


def _scaled(histogram: Histogram, share: bool) -> list[float]:
    total = max(sum(histogram.counts), 1)
    return [c / total if share else float(c) for c in histogram.counts]


def weight_settings(reports: Sequence[tuple[str | None, Report]]) -> list[tuple[str, WeightSetting | None]]:
    """Each report's IS setting to draw (``weight_setting``), labelled with its side ("" for one report)."""
    return [(side or "", weight_setting(report)) for side, report in reports]


def draw_weights(ax: Axes, histograms: Sequence[Drawn], settings: Sequence[tuple[str, WeightSetting | None]]) -> None:
    """Token IS weights π_train / π_rollout from the log-ratio histogram, as tails (share of tokens with a weight
    beyond x, on both sides of 1), with the IS threshold of the prescription (else of ``--is``) and the measured
    share beyond it; a sequence-level setting is said in words (its weights are per response, not per token)."""
    with matplotlib.rc_context(STYLE):
        ax.set_title("Token IS weights π_train / π_rollout", loc="left")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("IS weight x (before truncation)")
        ax.set_ylabel("share of tokens beyond x")
        xs_seen: list[float] = []
        for drawn in histograms:
            upper, lower = weight_tails(drawn.histogram)
            points = [(x, y) for x, y in lower if y > 0] + [(1.0, math.nan)] + [(x, y) for x, y in upper if y > 0]
            xs_seen += [x for x, y in points if math.isfinite(y)]
            ax.plot([x for x, _ in points], [y for _, y in points], drawn.style, color=drawn.colour,
                    marker=drawn.marker, markersize=3, linewidth=1.6,
                    label=f"{drawn.label}: w < x (left of 1), w ≥ x (right)")  # fmt: skip
        notes = []
        lines: dict[tuple[float, float | None], list[str]] = {}  # one line per threshold, naming every side on it
        for side, setting in settings:
            who = f"{side}: " if side else ""
            if setting is None:
                continue
            beyond = "" if setting.beyond is None else f", {100 * setting.beyond:.3g}% beyond"
            if setting.level == "sequence":
                ess = "" if setting.ess is None else f", ESS {setting.ess:.3g}"
                notes.append(f"{who}{setting.source}: sequence-level IS, threshold {setting.upper:g}{beyond} of "
                             f"responses{ess}\n(per-response weights: not these per-token tails)")  # fmt: skip
                continue
            lines.setdefault((setting.upper, setting.lower), []).append(f"{who}{setting.source}{beyond}")
        for (cap, floor), whose in lines.items():
            kind = f"IS zeroes weights outside [{floor:g}, {cap:g}]" if floor is not None else f"IS caps at {cap:g}"
            ax.axvline(cap, color=WARN, linestyle="--", linewidth=1.4, label=f"{kind} ({'; '.join(whose)})")
            xs_seen.append(cap)
            if floor is not None:
                ax.axvline(floor, color=WARN, linestyle="--", linewidth=1.4)
                xs_seen.append(floor)
        if all(setting is None for _, setting in settings):
            notes.append("no IS configured or prescribed: the weights IS would apply")
        for note in notes:  # a legend entry without a mark: the legend finds room away from the curves
            ax.plot([], [], " ", label=note)
        if xs_seen:
            lo, hi = min(min(xs_seen), 1 / max(xs_seen)), max(max(xs_seen), 1 / min(xs_seen))
            ax.set_xlim(max(lo / 1.6, math.exp(-SAFETY_BOUND)), min(hi * 1.6, math.exp(SAFETY_BOUND)))
        handles, _ = ax.get_legend_handles_labels()
        if handles:
            ax.legend(loc="best", fontsize=8)


CHARTED = ("kl", "k3_kl")
"""The breakdown metrics drawn as bars (the tables show every one)."""


def draw_explained(ax: Axes, title: str, entries: Sequence[BucketRow]) -> None:
    """One of explain's breakdowns (position, rollout probability, length) as bars of ``CHARTED`` per bucket."""
    labels = [bucket_label(entry) for entry in entries]
    draw_breakdown(ax, title, labels, {key: [getattr(entry, key) for entry in entries] for key in CHARTED})


def draw_breakdown(ax: Axes, title: str, labels: Sequence[str], series: dict[str, Sequence[float | None]]) -> None:
    """Grouped bars: one group per bucket (explain's breakdowns), one bar per metric."""
    with matplotlib.rc_context(STYLE):
        ax.set_title(title, loc="left", fontsize=11)
        width = 0.8 / max(len(series), 1)
        for i, (name, values) in enumerate(series.items()):
            heights = [math.nan if v is None else v for v in values]
            offsets = [x + (i - (len(series) - 1) / 2) * width for x in range(len(labels))]
            ax.bar(offsets, heights, width, color=PALETTE[i % len(PALETTE)], label=name)
        ax.axhline(0, color="#555555", linewidth=0.8)
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=9)
        ax.legend(loc="best")


def draw_trace(ax: Axes, title: str, positions: Sequence[int], log_ratios: Sequence[float], peak: int | None) -> None:
    """One response's log-ratio at each valid token, the largest |log-ratio| marked."""
    with matplotlib.rc_context(STYLE):
        ax.set_title(title, loc="left", fontsize=11)
        ax.plot(positions, log_ratios, color=PALETTE[0], linewidth=1.0)
        ax.axhline(0, color="#555555", linewidth=0.8)
        if peak is not None and peak in positions:
            at = positions.index(peak)
            ax.plot([peak], [log_ratios[at]], "o", color=WARN, markersize=7, label=f"max |log-ratio| at {peak}")
            ax.legend(loc="best")
        ax.set_xlabel("token position in the response")
        ax.set_ylabel("log π_train − log π_rollout")


def draw_sweep(
    ax: Axes,
    option: str,
    curves: Mapping[str, tuple[Sequence[float], Sequence[float | None]]],
    recommended: tuple[float, float, str] | None,
    target: float | None,
) -> None:
    """Rejected share against a threshold's upper bound, one line per curve (tokens, responses; TIS and IcePop
    apart), the target share and the recommended threshold marked.

    The x axis shows the grid: a narrow grid above 1 (IS caps, k1 ratio bounds such as 1.001 ... 2) is spaced by
    ``ln U`` so its points spread out, and is labelled with its own values; a recommendation near the grid widens
    the axis to hold it, one far beyond is an arrow at the edge it lies past with its value written, never a point
    that squashes the grid to one spot."""
    grid = sorted({x for _, (xs, _) in curves.items() for x in xs if x > 0 and math.isfinite(x)})
    narrow = bool(grid) and grid[0] > 1 and grid[-1] / grid[0] < 100
    at = math.log if narrow else float  # where a threshold sits on the x axis

    with matplotlib.rc_context(STYLE):
        ax.set_title(option, loc="left", fontsize=12)
        ax.set_xscale("log")
        ax.set_yscale("symlog", linthresh=1e-4)
        ax.set_xlabel("threshold's upper bound U" + (" (spaced by ln U)" if narrow else ""))
        ax.set_ylabel("share beyond the bounds (truncated)" if option.startswith("is_") else "share rejected")
        for i, (label, (xs, ys)) in enumerate(curves.items()):
            style = "--" if "responses" in label else "-"
            values = [math.nan if y is None else y for y in ys]
            ax.plot([at(x) for x in xs], values, style, marker="o", markersize=4, color=PALETTE[i // 2 % len(PALETTE)],
                    label=label)  # fmt: skip
        if target is not None:
            ax.axhline(target, color="#2ca02c", linestyle=":", linewidth=1.2, label=f"target {fmt(target)}")
        ax.set_ylim(bottom=0)
        x = recommended[0] if recommended is not None else None
        inside = x is not None and x > 0 and (not narrow or x > 1) and grid and _near(at(x), at(grid[0]), at(grid[-1]))
        if grid:
            lo, hi = at(grid[0]), at(grid[-1])
            if inside and x is not None:
                lo, hi = min(lo, at(x)), max(hi, at(x))
            ax.set_xlim(*sweep_limits(lo, hi))
            if narrow or grid[-1] / grid[0] < 100:  # decade ticks would label one point at most: label the grid
                ticks = _spread(grid, at)
                ax.set_xticks([at(t) for t in ticks], [f"{t:g}" for t in ticks])
                ax.set_xticks([], minor=True)
        if recommended is not None:
            _, y, label = recommended
            if inside or not grid:
                ax.plot([at(recommended[0])], [y], "*", color=WARN, markersize=15, label=f"recommended {label}",
                        zorder=5)  # fmt: skip
            else:
                _beyond(ax, recommended[0] > grid[-1], y, label)
        ax.legend(loc="best", fontsize=8)


def _near(x: float, lo: float, hi: float) -> bool:
    """Whether a recommendation at ``x`` is close enough to the grid [lo, hi] (in axis units, logarithmic) to widen
    the axis for it: at most half the grid's span, or a factor 2, beyond its edge."""
    reach = max((hi / lo) ** 0.5, 2.0)
    return lo / reach <= x <= hi * reach


def _spread(grid: Sequence[float], at: Callable[[float], float]) -> list[float]:
    """At most seven grid values to label, at least a tenth of the axis apart (logarithmic), the ends kept."""
    span = math.log(at(grid[-1]) / at(grid[0])) or 1.0
    kept = [grid[0]]
    for value in grid[1:]:
        if math.log(at(value) / at(kept[-1])) >= span / 7:
            kept.append(value)
    if kept[-1] != grid[-1]:
        kept[-1] = grid[-1]
    return kept


def _beyond(ax: Axes, above: bool, y: float, label: str) -> None:
    """A recommendation past the grid: an arrow at that edge of the axis, at its share, and its value written."""
    ax.plot([1.0 if above else 0.0], [y], ">" if above else "<", color=WARN, markersize=11, clip_on=False, zorder=5,
            transform=ax.get_yaxis_transform(), label=f"recommended {label} (beyond the grid)")  # fmt: skip
    height = ax.transAxes.inverted().transform(ax.transData.transform((1.0, y)))[1] if y > 0 else 0.0
    ax.annotate(f"recommended {label}\n{'above' if above else 'below'} the grid", xy=(1.0 if above else 0.0, y),
                xycoords=("axes fraction", "data"), xytext=(-8 if above else 8, -30 if height > 0.6 else 14),
                textcoords="offset points", ha="right" if above else "left", fontsize=8.5, color=WARN,
                bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "none", "pad": 1},
                arrowprops={"arrowstyle": "->", "color": WARN})  # fmt: skip


def sweep_limits(lo: float, hi: float) -> tuple[float, float]:
    """The sweep chart's x range: the grid's, with a little room on a logarithmic axis."""
    pad = max((hi / lo) ** 0.06, 1.15)
    return lo / pad, hi * pad


def svg(fig: Figure, salt: str) -> str:
    """The figure as an ``<svg>`` element to inline in HTML: no XML prolog, scalable, and ids unique to ``salt``
    (several charts share one page)."""
    out = io.StringIO()
    salted: dict[RcKeyType, Any] = {**STYLE, "svg.hashsalt": salt}
    with matplotlib.rc_context(salted):
        FigureCanvasSVG(fig).print_svg(out, metadata={"Date": None, "Creator": None})
    text = out.getvalue()
    text = text[text.index("<svg") :]
    return re.sub(r'<svg([^>]*?) width="[^"]+" height="[^"]+"', r'<svg\1 role="img"', text, count=1)


def png(fig: Figure) -> bytes:
    """The figure as PNG bytes (Agg)."""
    out = io.BytesIO()
    FigureCanvasAgg(fig).print_png(out, metadata={"Software": None})
    return out.getvalue()
