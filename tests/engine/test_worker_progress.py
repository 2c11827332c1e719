"""``--workers``: the progress callback sees rows while the workers read, not only when a part ends (it showed
``0 rows · 0 tokens`` until then)."""

from __future__ import annotations

from pathlib import Path

import rcdiag
from rcdiag.api import ReadProgress
from rcdiag.io import synthetic


def test_workers_report_rows_before_a_part_ends(tmp_path: Path) -> None:
    dump = tmp_path / "run.parquet"
    synthetic.write(synthetic.generate("healthy", rows=1000, seed=0), dump, row_group_size=250)
    events: list[ReadProgress] = []
    report = rcdiag.analyze(dump, workers=2, chunk_tokens=20_000, on_chunk=events.append)
    early = [e for e in events if e.parts == 0]
    assert early and all(e.rows > 0 and e.tokens > 0 for e in early)  # rows counted while both parts were read
    assert [e.rows for e in events] == sorted(e.rows for e in events)  # never goes back
    last = events[-1]
    assert (last.rows, last.tokens, last.parts, last.total_parts) == (report.input.rows, report.input.tokens, 2, 2)
