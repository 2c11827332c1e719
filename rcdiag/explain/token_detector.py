"""The ``token_specific`` detector: the mismatch sits on a few token ids (docs/findings.md argues the thresholds).

From the by-token table (``rcdiag.explain.by_token``): take the ids with at least ``MIN_COUNT`` tokens, largest share
of the dump's k3 first, while each one's mean |log-ratio| is significantly above the rest's (the table's test),
up to ``MAX_IDS`` of them. It fires when such ids carry at least ``K3_SHARE_MIN`` of the k3 while being at most
``TOKEN_SHARE_MAX`` of the valid tokens. Numerical noise spreads over ids in proportion to their counts (a share
of k3 about the share of tokens); one outlier token cannot pass the test (its id's own spread grows with it); a
mismatch spread over every id leaves no id significant by much, nor concentrated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rcdiag.catalogue.emit import emit
from rcdiag.catalogue.findings import Code
from rcdiag.explain.by_token import MIN_COUNT, TokenStats, TokenSums, token_stats
from rcdiag.records.report import Finding, InputFacts

if TYPE_CHECKING:
    from rcdiag.explain.vocabulary import Vocabulary

CODE = Code.TOKEN_SPECIFIC
MAX_IDS = 10
"""At most this many ids ('one id or a handful')."""
K3_SHARE_MIN = 0.5
"""The ids carry at least this share of the dump's k3."""
TOKEN_SHARE_MAX = 0.05
"""... while being at most this share of its valid tokens (so at least 10 times their share)."""
MIN_TOKENS = 2000
"""Fewer valid tokens with ids leave the detector silent."""


NO_IDS = "not run: the dump has no token ids (--token-col NAME)"
NEEDS_EXPLAIN = (
    "not run: it reads the token-id column and --explain's by-token table, which analyze leaves out by default (the "
    "ids' decode alone costs about 1.3x a plain analyze: docs/performance.md); --explain runs it"
)
"""Why an analyze without ``--explain`` does not run it on a dump that has token ids."""


def token_not_run(sums: TokenSums) -> str | None:
    """Why the detector cannot run (no ids read, too few tokens), or ``None``."""
    if not sums.seen:
        return NO_IDS
    stats = token_stats(sums)
    have = int(stats.total[0])
    return f"not run: {have:,} valid tokens with ids, needs {MIN_TOKENS:,}" if have < MIN_TOKENS else None


def concentrated(stats: TokenStats) -> list[int]:
    """Indices (into ``stats``) of the few significant ids carrying most of the k3; empty when there are none."""
    share, tokens = stats.k3_share, stats.token_share
    chosen: list[int] = []
    carried = 0.0
    for index in stats.k3_order()[:MAX_IDS].tolist():
        if not stats.significant[index] or not share[index] > 0:
            break
        chosen.append(index)
        carried += float(share[index])
        if carried >= K3_SHARE_MIN:
            break
    if carried >= K3_SHARE_MIN and float(tokens[chosen].sum()) <= TOKEN_SHARE_MAX:
        return chosen
    return []


NOT_BUILT = "not run: it reads --explain's by-token table, which rcdiag.analyze_chunks does not build"


def default_not_run(facts: InputFacts) -> str:
    """Why an analyze without ``--explain`` did not run it: the dump's columns say whether it has token ids (a
    ``token_ids`` of ``None``: none found; no ``token_ids`` at all: found, and left unread); chunks built by hand
    (``rcdiag.analyze_chunks``) have no ``--explain``."""
    if facts.format == "chunks":
        return NOT_BUILT
    columns = facts.columns
    return NO_IDS if "token_ids" in columns and columns["token_ids"] is None else NEEDS_EXPLAIN


def token_specific(sums: TokenSums, vocabulary: Vocabulary | None = None) -> Finding | None:
    """The finding, or ``None`` (also when the detector cannot run)."""
    if token_not_run(sums) is not None:
        return None
    stats = token_stats(sums)
    chosen = concentrated(stats)
    if not chosen:
        return None
    share, tokens = stats.k3_share, stats.token_share
    k3_share, token_share = float(share[chosen].sum()), float(tokens[chosen].sum())
    per_id: list[dict[str, Any]] = []
    for index in chosen:
        token_id = int(stats.ids[index])
        n = float(stats.sums[index, 0])
        per_id.append(
            {
                "id": token_id,
                "text": None if vocabulary is None else vocabulary.text(token_id),
                "special": None if vocabulary is None else vocabulary.is_special(token_id),
                "tokens": int(n),
                "k3_share": float(share[index]),
                "token_share": float(tokens[index]),
                "abs_log_ratio_mean": float(stats.sums[index, 2]) / n,
                "z": float(stats.z[index]),
            }
        )
    named = ", ".join(
        f"id {e['id']}" + (f" {e['text']}" if e["text"] is not None else "") + f" ({e['k3_share']:.0%} of k3, "
        f"{e['tokens']:,} tokens)"
        for e in per_id
    )
    count = f"{len(chosen)} token id{'s carry' if len(chosen) > 1 else ' carries'}"
    facts = (
        f"{count} {k3_share:.0%} of the dump's k3 while being {token_share:.2%} of its valid tokens "
        f"(each with at least {MIN_COUNT} tokens, mean |log-ratio| beyond the rest's by z > {stats.z_critical:.1f}): "
        f"{named}"
    )
    special = [e["id"] for e in per_id if e["special"]]
    more = ""
    if special:
        more = (
            f"Special token{'s' if len(special) > 1 else ''} {', '.join(map(str, special))} (end of sequence or a "
            "chat-template marker): the engines handle the chat template or the stop token differently."
        )
    elif vocabulary is None:
        more = "Give --tokenizer PATH to see their text."
    evidence = {
        "ids": [e["id"] for e in per_id],
        "k3_share": k3_share,
        "token_share": token_share,
        "z_critical": stats.z_critical,
        "per_id": per_id,
    }
    return emit(CODE, facts, more=more, value=k3_share, threshold=K3_SHARE_MIN, evidence=evidence)
