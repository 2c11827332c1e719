"""What a verdict leaves open, answered on the dump in one more pass: the history test and a prescription's
measured effect (docs/verdict.md, docs/performance.md)."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rcdiag.api.reading import accumulate
from rcdiag.api.report import analyze_state, build_report
from rcdiag.catalogue.checklist import checklist
from rcdiag.catalogue.emit import ordered
from rcdiag.diagnosis.prescribe import SEQ_IS_PRESET, effect_of, prescribed_setting, seq_is_measured, seq_is_unmeasured
from rcdiag.diagnosis.signature_rules import repeats
from rcdiag.diagnosis.verdict import history_untested, judge
from rcdiag.frameworks.section import FrameworkSection
from rcdiag.frameworks.speak import chosen as spoken_chosen
from rcdiag.frameworks.speak import measured as spoken_effect
from rcdiag.metrics.signatures import HISTORY_KEYS
from rcdiag.records.report import Report
from rcdiag.runtime.errors import InputError
from rcdiag.sections import Section
from rcdiag.sections.token_ids import TokenIdsSection
from rcdiag.settings.correction import CorrectionConfig, preset
from rcdiag.settings.reading import ReadOptions


def complete_verdict(report: Report, path: str | Path, read: ReadOptions | None = None) -> Report:
    """``report`` with what its verdict left open answered on the dump, in one more pass (two where sequence-level
    IS is offered):

    * the history test (``repeated_tokens_lowered``), where the verdict names ``noise`` or ``unexplained`` and the
      dump has token ids the first pass did not read (``rcdiag.diagnosis.verdict.history_untested``): a penalty on
      repeated tokens would explain the mismatch, and reading the ids on every run would cost every analyze their
      decode;
    * a ``correct`` verdict's prescription: its effect (rejected shares, IS ESS and truncated share) is what analyze
      computes under the prescribed setting, and a setting that raises one of analyze's own findings is flagged;
      where a next step offers sequence-level IS, its ESS measured under that preset (another pass).

    No pass when neither is open, or when the report was already computed with the prescribed setting and no
    history test is due (docs/performance.md)."""
    history = history_untested(report)
    setting = _prescribed(report)
    if not history and setting is None:
        return report
    config = setting or report.config.config
    riding, record = _spoken_run(report) if setting is not None else ([], None)
    under = report
    same = setting is None or setting.resolve().same_computation(report.config)
    if history:
        try:
            under = _again(path, config, read, True, riding)
        except InputError as exc:  # the ids were read only for this test: a bad id column skips it, said once
            from rcdiag.runtime.notices import notify

            notify(f"the repeated-token test did not run: the dump's token ids cannot be read ({exc})")
            history = False
    if not history and (riding or not same):
        under = _again(path, config, read, False, riding)
    if history:  # a history finding turns the verdict to fix (no prescription) or leaves it as it was
        report = with_history(report, under)
    verdict = report.verdict
    if verdict is None or verdict.recommendation is None or setting is None:
        return report
    measured, steps, remedy = effect_of(verdict.recommendation, under)
    if measured.framework is not None:  # under --as NAME: its setting's effect under its own semantics
        ran = under.sections.get(FrameworkSection.KEY) if riding else record
        measured = dataclasses.replace(measured, framework=spoken_effect(measured.framework, ran))
    headline = verdict.headline if remedy else f"{verdict.headline} (not a remedy on this dump: see next steps)"
    offered = seq_is_unmeasured(report)
    later = verdict.next_steps
    if offered in later:  # the offer is worth a pass only with a prescription: measured, never guessed
        seq_is = seq_is_measured(_again(path, preset(SEQ_IS_PRESET, report.config.config.verl_version), read, False))
        later = tuple(seq_is if step == offered else step for step in later)
    return dataclasses.replace(
        report,
        verdict=dataclasses.replace(verdict, headline=headline, recommendation=measured, next_steps=(*steps, *later)),
    )


def _prescribed(report: Report) -> CorrectionConfig | None:
    """The setting the verdict prescribes, while its effect is still to be measured."""
    prescription = report.verdict.recommendation if report.verdict is not None else None
    if prescription is None or prescription.effect is not None:
        return None
    return prescribed_setting(prescription.config, report.config.config.verl_version)


def _spoken_run(report: Report) -> tuple[list[Section], Any]:
    """Under ``--as NAME``, what measures the prescription in that framework's settings: the section running them
    on the dump (none when the first pass already ran exactly them, whose record is returned, or when the framework
    has nothing alike)."""
    verdict = report.verdict
    spoken = verdict.recommendation.framework if verdict and verdict.recommendation else None
    chosen = None if spoken is None else spoken_chosen(spoken)
    if chosen is None:
        return [], None
    first = report.sections.get(FrameworkSection.KEY)
    if first is not None and first.name == chosen.name and first.options == chosen.settings.to_dict():
        return [], first
    return [FrameworkSection(chosen)], None


def _again(
    path: str | Path,
    config: CorrectionConfig,
    read: ReadOptions | None,
    token_ids: bool,
    sections: Sequence[Section] = (),
) -> Report:
    """The dump's report under ``config`` (its token ids read too, with ``token_ids``; ``sections`` riding, such as
    a framework's setting), quietly: the first pass told the user everything about the dump."""
    riding = [*([TokenIdsSection()] if token_ids else []), *sections]
    with warnings.catch_warnings(record=True):
        again = accumulate(path, config, read, sections=riding)
    return build_report(analyze_state(again.state), again.info, again.device, again.screen, sections=riding)


def with_history(report: Report, read_ids: Report) -> Report:
    """``report`` with the history statistics of ``read_ids`` (the same dump with its token ids read), their finding,
    the token column it read, and the verdict judged again."""
    extras = {**report.extras, **{key: read_ids.extras.get(key) for key in HISTORY_KEYS}}
    found = repeats(extras, report.input.valid_tokens)
    findings = ordered([*report.findings, *([found] if found else [])])
    column = read_ids.input.columns.get("token_ids")
    facts = dataclasses.replace(
        report.input,
        columns={**report.input.columns, "token_ids": column},
        dtypes={**report.input.dtypes, **({column: read_ids.input.dtypes[column]} if column else {})},
    )
    not_run = report.detectors_not_run
    updated = dataclasses.replace(
        report,
        extras=extras,
        findings=tuple(findings),
        input=facts,
        checklist=checklist(findings, report.metrics, not_run),
    )
    return dataclasses.replace(updated, verdict=judge(updated))
