"""The HTML report's by-token sections (``--explain`` with token ids): the ranked token tables, and each worst
response's text as a heat map, one span per token coloured by its log-ratio with the value on hover (a ``title``:
no script, as the rest of the page)."""

from __future__ import annotations

import html
import math
from typing import Any

from rcdiag.records.report import Report, TokenText, WorstRow
from rcdiag.render.text import fmt
from rcdiag.render.token_text import (
    TOKEN_COLUMNS,
    TOKEN_TABLES,
    caption,
    pieces,
    rgb,
    strength,
    token_cells,
    token_note,
)

STYLE = (
    "<style>.tokens{font-family:ui-monospace,'SFMono-Regular',Menlo,Consolas,monospace;font-size:13px;"
    "white-space:pre-wrap;word-break:break-all;line-height:1.9;border:1px solid #e4e7eb;padding:8px 10px;"
    "background:#fff;max-height:420px;overflow:auto}.tokens span{border-radius:2px}"
    ".tokens .nl{color:#8c959f}.legend span{display:inline-block;padding:0 6px;margin-right:4px;"
    "border:1px solid #e4e7eb}</style>"
)


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def token_sections(report: Report, section: Any, table: Any) -> list[str]:
    """The by-token table and the highlighted worst responses (nothing without token ids); ``section`` and
    ``table`` are the page's own builders (``rcdiag.render.html``)."""
    explained = report.explain
    token = None if explained is None else explained.breakdowns.token
    if explained is None or token is None:
        return []
    tables = []
    for name, ranked in token.ranked():
        rows = [[_e(cell) for cell in token_cells(entry)] for entry in ranked]
        tables.append(f"<h3>{_e(TOKEN_TABLES[name])}</h3>" + table(TOKEN_COLUMNS, rows, numeric=(0, 2, 3, 4, 5, 6, 7)))
    out = [section("Which tokens carry the mismatch (--explain)", f'<p class="note">{_e(token_note(token))}</p>',
                   *tables)]  # fmt: skip
    if explained.texts:
        entries = {entry.row: entry for entry in explained.worst_sequences}
        texts = [highlighted(text, entries.get(text.row)) for text in explained.texts]
        out.append(section("Worst responses as text (log-ratio per token; hover for values)", STYLE, legend(), *texts))
    return out


def legend() -> str:
    samples = [(-1.0, "rollout higher (−1)"), (-0.1, "−0.1"), (0.0, "0"), (0.1, "+0.1"), (1.0, "trainer higher (+1)")]
    cells = "".join(f'<span style="background:{_colour(v)}">{_e(label)}</span>' for v, label in samples)
    return f'<p class="legend note">log-ratio = old − rollout log-prob: {cells}</p>'


def highlighted(text: TokenText, entry: WorstRow | None) -> str:
    """One response: a heading and its tokens as spans, each with its id, log-ratio and log-probs on hover."""
    spans = []
    for token_id, piece, value in zip(text.ids, pieces(text), text.log_ratios, strict=True):
        shown = _e(piece).replace("\n", '<span class="nl">\u21b5</span>\n')
        tip = f"id {token_id} · log-ratio {fmt(value) if math.isfinite(value) else value}"
        style = f' style="background:{_colour(value)}"' if strength(value) > 0 else ""
        spans.append(f'<span title="{_e(tip)}" data-lr="{value!r}"{style}>{shown}</span>')
    last = text.start + len(text.ids) - 1
    head = f"<h3>{_e(caption(text, entry))} <small>(valid tokens {text.start}-{last})</small></h3>"
    return head + f'<div class="tokens">{"".join(spans)}</div>'


def _colour(value: float) -> str:
    r, g, b = rgb(value)
    return f"rgb({r},{g},{b})"
