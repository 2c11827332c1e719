"""Charts drawn with matplotlib (the ``plot`` extra), on its Agg and SVG canvases (never pyplot: no GUI backend, no
global figure state). Each ``draw_*`` function draws one chart on given axes, so the PNG dashboard and the HTML
report draw the same charts; ``svg`` and ``png`` turn a figure into inline SVG text or PNG bytes.

Everything drawn is an aggregate (per-step metrics, bin counts), so a chart's size does not grow with the dump.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import matplotlib
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from rcdiag.catalogue import short_key
from rcdiag.config import SAFETY_BOUND
from rcdiag.render.panels import TRENDS, Panel, Series, panel_keys, series
from rcdiag.render.text import fmt
from rcdiag.report import Histogram, Report

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f")
SIDES = {"A": ("#1f77b4", "-"), "B": ("#d62728", "--")}
"""compare: each dump's colour and line style."""
WARN = "#d62728"
STYLE = {
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


def figure(width: float, height: float, dpi: int = 100) -> Figure:
    """A figure with rcdiag's style (``matplotlib.rc_context`` only holds while drawing, so it is applied here)."""
    with matplotlib.rc_context(STYLE):
        return Figure(figsize=(width, height), dpi=dpi, layout="constrained")


def trend_lines(report: Report, panel: Panel, side: str | None = None) -> list[Line]:
    """The panel's series for one report; with ``side`` (compare), labelled and styled as that dump's."""
    out = []
    for i, key in enumerate(panel_keys(panel, report)):
        label = short_key(key) if side is None else f"{side}: {short_key(key)}"
        style = "-" if side is None else SIDES[side][1]
        out.append(Line(series(report, key, label), PALETTE[i % len(PALETTE)], style))
    return out


def dashboard(reports: Sequence[tuple[str | None, Report]], title: str) -> Figure:
    """The six trend panels of ``TRENDS`` in 2x3 (the seed guide's figure), for one report or both of a compare."""
    fig = figure(16, 10, dpi=120)
    with matplotlib.rc_context(STYLE):
        fig.suptitle(title, x=0.01, ha="left", fontsize=13)
        axes = fig.subplots(2, 3)
    for ax, panel in zip(axes.flat, TRENDS, strict=True):
        draw_trend(ax, panel, panel_lines(panel, reports))
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
                    marker="o" if few else None, markersize=4 if len(ys) > 1 else 8, linewidth=1.6)  # fmt: skip
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


def draw_histogram(ax: Axes, histograms: Sequence[tuple[str, Histogram, str]], share: bool = False) -> None:
    """The log-ratio distribution: counts (or, with ``share``, shares of tokens) per logarithmic bin, on a
    logarithmic count axis; the region where verl's clamps bite is shaded."""
    with matplotlib.rc_context(STYLE):
        ax.set_title("Token log-ratio log π_train − log π_rollout", loc="left")
        ax.set_xscale("symlog", linthresh=1e-6, linscale=0.5)
        ax.set_yscale("log")
        ax.set_xlabel("log-ratio (symmetric log scale; outer bins hold everything beyond ±100)")
        ax.set_ylabel("share of tokens" if share else "tokens")
        for label, histogram, color in histograms:
            edges = [2 * histogram.edges[0], *histogram.edges, 2 * histogram.edges[-1]]
            total = max(sum(histogram.counts), 1)
            counts = [c / total if share else c for c in histogram.counts]
            floor = 0.5 / total if share else 0.5
            ax.stairs([max(c, floor) for c in counts], edges, baseline=floor, fill=len(histograms) == 1,
                      color=color, alpha=0.55 if len(histograms) == 1 else 0.9, label=label, linewidth=1.5)  # fmt: skip
        ax.axvspan(SAFETY_BOUND, 2 * histograms[0][1].edges[-1], color=WARN, alpha=0.07)
        ax.axvspan(2 * histograms[0][1].edges[0], -SAFETY_BOUND, color=WARN, alpha=0.07,
                   label=f"|log-ratio| > {SAFETY_BOUND:g}: verl clamps")  # fmt: skip
        ax.set_xticks(list(LOG_TICKS), list(LOG_TICKS.values()))
        ax.legend(loc="upper center")


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
    curves: dict[str, tuple[Sequence[float], Sequence[float | None]]],
    recommended: tuple[float, float, str] | None,
    target: float | None,
) -> None:
    """Rejected share against a threshold's upper bound, one line per curve (tokens, responses; TIS and IcePop
    apart), the target share and the recommended threshold marked."""
    with matplotlib.rc_context(STYLE):
        ax.set_title(option, loc="left", fontsize=12)
        ax.set_xscale("log")
        ax.set_yscale("symlog", linthresh=1e-4)
        ax.set_xlabel("threshold (its upper bound)")
        ax.set_ylabel("share rejected")
        for i, (label, (xs, ys)) in enumerate(curves.items()):
            style = "--" if "responses" in label else "-"
            values = [math.nan if y is None else y for y in ys]
            ax.plot(xs, values, style, marker="o", markersize=4, color=PALETTE[i // 2 % len(PALETTE)], label=label)
        if target is not None:
            ax.axhline(target, color="#2ca02c", linestyle=":", linewidth=1.2, label=f"target {fmt(target)}")
        if recommended is not None:
            x, y, label = recommended
            ax.plot([x], [y], "*", color=WARN, markersize=15, label=f"recommended {label}", zorder=5)
        ax.set_ylim(bottom=0)
        ax.legend(loc="best", fontsize=8)


def svg(fig: Figure, salt: str) -> str:
    """The figure as an ``<svg>`` element to inline in HTML: no XML prolog, scalable, and ids unique to ``salt``
    (several charts share one page)."""
    out = io.StringIO()
    with matplotlib.rc_context({**STYLE, "svg.hashsalt": salt}):
        FigureCanvasSVG(fig).print_svg(out, metadata={"Date": None, "Creator": None})
    text = out.getvalue()
    text = text[text.index("<svg") :]
    return re.sub(r'<svg([^>]*?) width="[^"]+" height="[^"]+"', r'<svg\1 role="img"', text, count=1)


def png(fig: Figure) -> bytes:
    """The figure as PNG bytes (Agg)."""
    out = io.BytesIO()
    FigureCanvasAgg(fig).print_png(out, metadata={"Software": None})
    return out.getvalue()
