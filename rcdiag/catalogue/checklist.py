"""``analyze``'s checklist: every check of the finding catalogue, with whether (and where) it fired, computed once
on the report (``Report.checklist``, JSON ``checklist``); renderers only lay it out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rcdiag.catalogue.findings import FINDINGS
from rcdiag.catalogue.metrics import metric
from rcdiag.records.report import ChecklistRow, Finding

NOT_COMPUTED = "not computed for this config"
"""The reason of a row whose metric this configuration does not compute."""


def _checks(*, explain: bool) -> list[tuple[str, str | None, str]]:
    """(code, full metric key or None, check) of every checklist row, from the finding catalogue; the bias
    detectors' only when they ran (``explain``: every analyze runs them)."""
    rows = []
    for spec in FINDINGS:
        if spec.check is None or "analyze" not in spec.commands or (spec.explain and not explain):
            continue
        needed = metric(spec.metric) if spec.metric is not None else None
        check = spec.check
        if needed is not None and "{rule}" in check:
            threshold = next(t for t in needed.thresholds if t.finding == spec.code)
            check = check.format(rule=threshold.describe(needed.short))
        rows.append((spec.code, needed.name if needed is not None else None, check))
    return rows


def checklist(
    findings: Iterable[Finding], metrics: Mapping[str, float | None], not_run: Mapping[str, str] | None
) -> tuple[ChecklistRow, ...]:
    """Every analyze check, given a report's findings and metrics; ``not_run``: why each bias detector that did not
    run did not (too little data; ``token_specific`` without ``--explain``); ``None``: the report holds none of their
    results (a state saved without their sums), and their rows are left out, never read as passed."""
    fired: dict[str, Finding] = {}
    for found in findings:
        fired.setdefault(found.code, found)
    rows = []
    for code, key, check in _checks(explain=not_run is not None):
        first = fired.get(code)
        if key and key not in metrics:
            rows.append(ChecklistRow(code, check, "not_computed", reason=NOT_COMPUTED))
        elif not_run is not None and code in not_run:
            rows.append(ChecklistRow(code, check, "not_computed", reason=not_run[code]))
        elif first is None:
            rows.append(ChecklistRow(code, check, "ok"))
        else:
            rows.append(ChecklistRow(code, check, first.severity, first.value, first.steps))
    return tuple(rows)
