"""``analyze --explain``: where the mismatch sits and why.

* ``breakdowns``: token-level off-policy metrics per bucket of position, rollout probability and length;
* ``worst``: the responses with the largest |sum of log-ratios|, in a bounded heap;
* ``statistics`` and ``detectors``: the sums behind, and the verdicts of, ``temperature_mismatch``,
  ``logprob_offset``, ``sampling_truncation``, ``position_drift`` and ``mismatch_trend``;
* ``tokens``: exact per-token-id sums and their ranking (``breakdowns.token``), ``token_detector`` its
  ``token_specific`` detector, ``vocabulary`` the text of ids (``--tokenizer``), ``token_report`` the report's
  by-token parts and the ``--tokens`` Parquet file;
* ``sequences``: the ``--sequences`` per-response Parquet file (polars);
* ``state``: ``ExplainState``, the mergeable whole of it (accumulators of ``rcdiag.metrics.base``), a whole-dump
  accumulator the engine feeds block by block.
"""
