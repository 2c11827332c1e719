"""The bias detectors as a section (``rcdiag.sections``) every analyze runs: their sums (``DetectorState``), their
findings and why any of them had too little data. ``--explain`` replaces it: its own state holds the same sums and
its section gives the same findings, with the breakdowns, the worst responses and ``token_specific``."""

from __future__ import annotations

from typing import ClassVar

from rcdiag.explain.detector_state import DetectorState
from rcdiag.records.report import DetectorsReport, Finding
from rcdiag.sections.base import PlainSection, RunFacts


class DetectorSection(PlainSection):
    """temperature_mismatch, logprob_offset, sampling_truncation, position_drift and mismatch_trend on every analyze
    (docs/verdict.md); ``token_specific`` needs ``--explain``'s by-token table, and its not-run reason says so."""

    KEY: ClassVar[str] = DetectorState.KEY
    STATE = DetectorState

    def new_state(self) -> DetectorState:
        return DetectorState()

    def record(self, state: DetectorState | None, run: RunFacts) -> DetectorsReport | None:
        if state is None:
            return None
        from rcdiag.explain.detectors import not_run
        from rcdiag.explain.token_detector import default_not_run

        return DetectorsReport({**not_run(state, run.steps), "token_specific": default_not_run(run.input)})

    def findings(self, state: DetectorState | None, run: RunFacts) -> list[Finding]:
        if state is None:
            return []
        from rcdiag.explain.detectors import detect

        return detect(state, run.steps)
