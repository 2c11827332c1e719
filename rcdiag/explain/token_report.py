"""The by-token part of a report: the ``breakdowns.token`` section, the ``--tokens`` Parquet table, the detector's
finding and the worst responses' text, each with the ids' text when a tokenizer is given (``--tokenizer``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

import rcdiag.io.outputs as outputs
from rcdiag.explain.by_token import TokenSums, ranked_ids, token_breakdown, token_stats
from rcdiag.explain.token_detector import token_not_run, token_specific
from rcdiag.explain.vocabulary import TOKENIZER_INPUT, Vocabulary, tokenizer_file
from rcdiag.records.report import Finding, TokenBreakdown, TokenText
from rcdiag.runtime.errors import InputError, OutputError

TABLE_COLUMNS = (
    "id", "text", "tokens", "token_share", "kl", "k3_kl", "chi2_token", "abs_log_ratio_mean", "k3_share", "z",
    "significant",
)  # fmt: skip
"""Columns of the ``--tokens`` file, one row per token id that has a valid token."""


def load_vocabulary(path: str | Path | None) -> Vocabulary | None:
    """The tokenizer at ``path`` (``None``: none given)."""
    if path is None:
        return None
    claim_tokenizer(path)
    return Vocabulary(path)


def claim_tokenizer(path: str | Path | None) -> None:
    """Add the file ``--tokenizer PATH`` reads to the run's inputs (rcdiag.io.outputs.Ledger), before it is read: an
    output over it is refused."""
    if path is None:
        return
    if not str(path).strip():
        raise InputError("--tokenizer is empty (an unset variable?); give a tokenizer.json or its directory")
    outputs.reads(tokenizer_file(path), what=TOKENIZER_INPUT)


def token_section(sums: TokenSums, vocabulary: Vocabulary | None) -> TokenBreakdown:
    """``breakdowns.token``."""
    texts = None if vocabulary is None else vocabulary.texts(ranked_ids(sums))
    return token_breakdown(sums, texts)


def token_findings(sums: TokenSums, vocabulary: Vocabulary | None) -> list[Finding]:
    found = token_specific(sums, vocabulary)
    return [] if found is None else [found]


def token_not_run_reason(sums: TokenSums) -> dict[str, str]:
    """``detectors_not_run`` entry of ``token_specific`` (empty when it ran)."""
    why = token_not_run(sums)
    return {} if why is None else {"token_specific": why}


def decoded_texts(texts: list[TokenText], vocabulary: Vocabulary | None) -> tuple[TokenText, ...]:
    """The worst responses' ids with each token's text, when a tokenizer is given."""
    if vocabulary is None:
        return tuple(texts)
    return tuple(dataclasses.replace(text, pieces=vocabulary.pieces(text.ids)) for text in texts)


def check_tokens_target(path: str | Path) -> None:
    """``--tokens`` takes a ``.parquet`` path in an existing directory."""
    if Path(path).suffix.lower() not in (".parquet", ".pq"):
        raise InputError("--tokens writes Parquet: give the file a .parquet suffix", path=str(path))
    if not Path(path).resolve().parent.is_dir():
        raise InputError("cannot write the token table here (no such directory)", path=str(path))


def token_frame(sums: TokenSums, vocabulary: Vocabulary | None = None) -> Any:
    """The whole by-token table as a polars DataFrame, one row per id, ids ascending."""
    import polars as pl

    stats = token_stats(sums)
    n = stats.sums[:, 0]
    with np.errstate(all="ignore"):
        columns = {
            "id": stats.ids,
            "text": [None if vocabulary is None else vocabulary.text(int(i)) for i in stats.ids],
            "tokens": n.astype(np.int64),
            "token_share": stats.token_share,
            "kl": -stats.sums[:, 1] / n,
            "k3_kl": stats.sums[:, 3] / n,
            "chi2_token": stats.sums[:, 4] / n,
            "abs_log_ratio_mean": stats.sums[:, 2] / n,
            "k3_share": stats.k3_share,
            "z": stats.z,
            "significant": stats.significant,
        }
    frame = pl.DataFrame({name: pl.Series(name, columns[name], dtype=pl.String if name == "text" else None)
                          for name in TABLE_COLUMNS})  # fmt: skip
    floats = [name for name in TABLE_COLUMNS if frame.schema[name] == pl.Float64]
    return frame.with_columns([pl.col(name).fill_nan(None) for name in floats]).with_columns(
        [pl.when(pl.col(name).is_infinite()).then(None).otherwise(pl.col(name)).alias(name) for name in floats]
    )


def write_token_table(sums: TokenSums, path: str | Path, vocabulary: Vocabulary | None = None) -> None:
    """Write ``token_frame`` to ``path``, whole or not at all."""
    import polars as pl

    frame = token_frame(sums, vocabulary)
    with outputs.replacing(path) as temporary:
        try:
            frame.write_parquet(str(temporary))
        except (OSError, pl.exceptions.PolarsError) as exc:
            raise OutputError(path, str(getattr(exc, "strerror", None) or exc).splitlines()[0]) from None
