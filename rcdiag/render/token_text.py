"""What the terminal and the HTML report show of the by-token breakdown and of the worst responses' text (shared by
``explain_table`` and ``token_html``; no rich, no HTML here)."""

from __future__ import annotations

import math

from rcdiag.records.report import TokenBreakdown, TokenRow, TokenText, WorstRow
from rcdiag.render.text import fmt
from rcdiag.runtime.printable import printable

TOKEN_TABLES = {
    "by_k3_share": "By token id: largest share of the dump's k3",
    "by_abs_log_ratio": "By token id: largest mean |log-ratio| (significant ids only)",
}
"""``breakdowns.token``'s ranked lists and their titles."""
TOKEN_COLUMNS = ("id", "text", "tokens", "share of tokens", "share of k3", "k3_kl", "mean |log-ratio|", "z")
SHOWN = 10
"""Rows of each ranked list the terminal shows (the JSON and HTML carry ``rcdiag.explain.by_token.TOP``)."""
SCALE = 1.0
"""|log-ratio| at which a token's highlight is at full strength."""
QUIET = 0.01
"""|log-ratio| below which a token is not highlighted (noise)."""


def token_note(token: TokenBreakdown) -> str:
    """One line on the table: how many ids and tokens, and the test."""
    return (
        f"{token.ids:,} token ids over {token.tokens:,} valid tokens; ranked: ids with at least "
        f"{token.min_count} tokens; significant (*): mean |log-ratio| above the rest's by z > "
        f"{token.z_critical:.2f} ({token.ids_tested:,} ids tested, 1% family-wise)."
    )


def token_cells(entry: TokenRow) -> tuple[str, ...]:
    """One ranked id's row, in ``TOKEN_COLUMNS`` order."""
    share = entry.k3_share
    z = entry.z
    return (
        str(entry.id),
        "—" if entry.text is None else printable(entry.text),
        f"{entry.tokens:,}",
        f"{entry.token_share:.2%}",
        "—" if share is None else f"{share:.1%}",
        fmt(entry.k3_kl),
        fmt(entry.abs_log_ratio_mean),
        ("—" if z is None else f"{z:.1f}") + (" *" if entry.significant else ""),
    )


def pieces(text: TokenText) -> list[str]:
    """Each token's text (decoded with ``--tokenizer``), else its id in brackets."""
    if text.pieces:
        return list(text.pieces)
    return [f"\u27e8{token_id}\u27e9" for token_id in text.ids]


def window(text: TokenText, size: int) -> tuple[int, int]:
    """``[a, b)`` of at most ``size`` tokens of ``text`` around its largest |log-ratio|."""
    n = len(text.ids)
    if n <= size:
        return 0, n
    finite = [abs(v) if math.isfinite(v) else math.inf for v in text.log_ratios]
    peak = max(range(n), key=finite.__getitem__)
    start = min(max(peak - size // 2, 0), n - size)
    return start, start + size


def strength(log_ratio: float) -> float:
    """0 (no highlight) to 1 (full) for a token's |log-ratio|; NaN counts as full."""
    if not math.isfinite(log_ratio):
        return 1.0
    size = abs(log_ratio)
    return 0.0 if size < QUIET else min(1.0, size / SCALE)


def rgb(log_ratio: float) -> tuple[int, int, int]:
    """The highlight colour: red where the trainer gives the token more probability (log-ratio > 0), blue where
    the rollout engine does; white at 0."""
    s = strength(log_ratio)
    if log_ratio > 0 or not math.isfinite(log_ratio):
        return 255, round(255 - 175 * s), round(255 - 175 * s)
    return round(255 - 175 * s), round(255 - 120 * s), 255


def caption(text: TokenText, entry: WorstRow | None) -> str:
    """What a highlighted response is: its row, step and log-ratio sum, and which of its tokens are shown."""
    where = f"row {text.row}"
    if entry is not None:
        where += ("" if entry.step is None else f", step {entry.step}") + f", sum {fmt(entry.log_ratio_sum)}"
    return where
