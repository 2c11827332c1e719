"""What the sections' options take (the actor's batching for micro-batches, the worst-responses list for explain),
in one leaf module: the command line checks ``--micro-batch-size`` ... ``--worst`` with them before the sections
(and numpy) are imported, and the sections check their keywords with the same words
(``rcdiag.runtime.option_checks``)."""

from __future__ import annotations

from rcdiag.runtime.option_checks import Check, count

ROWS = count(1, of="rows")
"""``micro_batch_size`` and ``mini_batch_size``: rows per GPU."""
MICROBATCH: dict[str, Check] = {
    "micro_batch_size": ROWS,
    "mini_batch_size": ROWS,
    "dp_size": count(1, of="ranks"),
    "max_token_len": count(1, of="tokens"),
    "prompt_len": count(0, of="tokens"),
}
"""What each field of ``rcdiag.MicroBatchSettings`` (and its flag) takes."""
WORST = count(0, of="responses")
"""``worst`` (``--worst``): the size of explain's worst-responses list."""
