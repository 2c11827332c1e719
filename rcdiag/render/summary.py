"""What the terminal's default screen shows after the verdict, as plain rows (imports no rich): one off-policy
table, one row per configured IS/RS option with the share it truncates or rejects, and the health warnings.

Every value is read from the report (its pooled metrics and its findings); nothing is computed here. A check mark
says whether a finding fired (at any step), never whether the pooled value shown beside it passes the bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rcdiag.catalogue import metric, short_key
from rcdiag.catalogue.keys import Key
from rcdiag.catalogue.metrics import rs_key, rs_option
from rcdiag.records.report import Report, Severity
from rcdiag.render.text import where
from rcdiag.runtime.printable import printable
from rcdiag.settings.correction import ISSpec, RSOption

OFFPOLICY = (Key.KL, Key.K3_KL, Key.CHI2_TOKEN, Key.CHI2_SEQ, Key.TRAINING_PPL, Key.ROLLOUT_PPL)
"""The off-policy table's rows, in the design card's order; every other metric is behind ``--details``."""
ESS = Key.ROLLOUT_IS_EFF_SAMPLE_SIZE
RS_TOKENS = Key.ROLLOUT_RS_MASKED_FRACTION
RS_RESPONSES = Key.ROLLOUT_RS_SEQ_MASKED_FRACTION
WARNING_SEVERITIES = ("error", "warning")
"""The findings listed as health warnings; an ``info`` finding's advice is in the verdict's next steps."""
DETAILS_HINT = "every metric, the per-step table, the findings checklist and each finding's full message: --details"
"""The default view's last line."""


def exact_line(report: Report) -> str | None:
    """``exact: bitwise identical at all ...`` or ``exact: 1,234 of 43,992 valid tokens differ ...``: the exact match
    in one line (``None``: a report without it, such as one merged from states saved before it existed)."""
    exact = report.sections.get("exact")
    return None if exact is None else "exact: " + exact.summary()


@dataclass(frozen=True)
class Check:
    """One health check on a row: a catalogue rule (``|kl| <= 0.1``) or a finding that names the row's metric."""

    rule: str
    """The rule as the checklist words it; ``""`` for a finding without a rule of its own."""
    code: str
    status: Literal["ok", "fired", "unchecked"]
    """``unchecked``: the metric has no value (non-finite, JSON null), so its rule was not tested."""

    @property
    def fired(self) -> bool:
        return self.status == "fired"


@dataclass(frozen=True)
class MetricRow:
    key: str
    label: str
    value: float | None
    checks: tuple[Check, ...]


@dataclass(frozen=True)
class CorrectionRow:
    """One configured IS setting, RS option or RS aggregate: the shares of tokens and responses it truncates,
    zeroes or rejects (``None``: verl logs no such share for it), and IS's effective sample size."""

    name: str
    setting: str
    tokens: float | None
    responses: float | None
    ess: float | None
    checks: tuple[Check, ...]


def checks(report: Report, keys: tuple[str, ...]) -> tuple[Check, ...]:
    """The catalogue's rules on ``keys`` (each marked by whether its finding fired, or as untested where the
    metric has no value), then any other finding that fired on one of them (``kl_k3_disagree`` on kl)."""
    fired = {f.code for f in report.findings}
    out: list[Check] = []
    for key in keys:
        spec = metric(key)
        if spec is None:
            continue
        untested = report.metrics.get(key) is None
        out.extend(
            Check(
                t.describe(spec.short), t.finding, "fired" if t.finding in fired else "unchecked" if untested else "ok"
            )
            for t in spec.thresholds
            if t.finding is not None
        )
    ruled = {c.code for c in out}
    named = [f.code for f in report.findings if f.metric in keys and f.code not in ruled]
    out.extend(Check("", code, "fired") for code in dict.fromkeys(named))
    return tuple(out)


def offpolicy_rows(report: Report) -> list[MetricRow]:
    """kl, k3_kl, chi2_token, chi2_seq and both PPLs, as the report has them (pooled over every step)."""
    return [
        MetricRow(key, short_key(key), report.metrics[key], checks(report, (key,)))
        for key in OFFPOLICY
        if key in report.metrics
    ]


def is_setting(spec: ISSpec) -> str:
    """``TIS: weights clamped at 2``, ``IcePop: weights outside [0.5, 2] zeroed``, with batch normalization."""
    if spec.icepop:
        how = f"IcePop: weights outside [{spec.lower:g}, {spec.upper:g}] zeroed"
    else:
        how = f"TIS: weights clamped at {spec.upper:g}"
    return how + (", batch-normalized" if spec.batch_normalize else "")


def is_title(spec: ISSpec) -> str:
    """The IS table's title in ``--details``."""
    return f"IS weights, {spec.level} level ({is_setting(spec)})"


def rs_keeps(spec: RSOption) -> str:
    """What an RS option keeps: ``ratio pi_train/pi_rollout in [0.5, 2]``, ``k2 per token <= 0.01``."""
    if spec.is_k1:
        assert spec.lower is not None
        return f"ratio pi_train/pi_rollout in [{1 / spec.upper:.6g}, {1 / spec.lower:.6g}]"
    where = "per token" if spec.level == "token" else f"{spec.agg} per response"
    return f"{spec.estimator} {where} <= {spec.upper:g}"


def correction_rows(report: Report) -> list[CorrectionRow]:
    """A row for the configured IS setting, one per RS option, and RS's aggregate; none without IS or RS."""
    m = report.metrics
    rows: list[CorrectionRow] = []
    is_keys = tuple(k for k in m if _group(k) == "is")
    if is_keys:
        spec = report.config.is_spec
        assert spec is not None
        # TIS: the raw ratios above the bound are the truncated ones (per token, or per response at sequence
        # level); IcePop: the tokens it zeroes (rollout_is_oob_ratio, a share of tokens at either level).
        beyond = Key.ROLLOUT_IS_OOB_RATIO if spec.icepop else Key.ROLLOUT_IS_RATIO_FRACTION_HIGH
        per_token = spec.icepop or spec.level == "token"
        rows.append(
            CorrectionRow(
                f"IS {spec.level}",
                is_setting(spec),
                m.get(beyond) if per_token else None,
                None if per_token else m.get(beyond),
                m.get(ESS),
                checks(report, is_keys),
            )
        )
    options: dict[str, list[str]] = {}
    for key in m:
        if (option := rs_option(key)) is not None:
            options.setdefault(option, []).append(key)
    for option, keys in options.items():
        tokens, responses = (rs_key(option, s) for s in ("masked_fraction", "seq_masked_fraction"))
        rows.append(
            CorrectionRow(
                f"RS {option}",
                rs_keeps(report.config.rs_option(option)),
                m.get(tokens),
                m.get(responses),
                None,
                checks(report, tuple(keys)),
            )
        )
    if RS_TOKENS in m:
        aggregate = tuple(k for k in m if _group(k) == "rs_aggregate")
        rows.append(
            CorrectionRow(
                "RS combined",
                "rejected by any RS option",
                m.get(RS_TOKENS),
                m.get(RS_RESPONSES),
                None,
                checks(report, aggregate),
            )
        )
    return rows


@dataclass(frozen=True)
class HealthWarning:
    """One error or warning finding as one line: the check it fails, with the value and steps where it failed
    (its checklist row), not its message, much of which the verdict above already quotes (a cause's evidence is
    its findings' measured facts, a next step a finding's advice); ``--details`` prints every message whole."""

    severity: Severity
    code: str
    text: str
    """``3166.38 (1 step: 2): fails chi2_token <= 1``; the message for a finding without a checklist row."""


def health_warnings(report: Report) -> list[HealthWarning]:
    """The findings of severity error or warning, in the report's order (errors first)."""
    rows = {row.code: row for row in report.checklist if row.status in WARNING_SEVERITIES}
    out = []
    for f in report.findings:
        if f.severity not in WARNING_SEVERITIES:
            continue
        row = rows.get(f.code)
        text = f"{where(row)}: fails {row.check}" if row is not None else f.message
        out.append(HealthWarning(f.severity, f.code, printable(text)))
    return out


def _group(key: str) -> str:
    spec = metric(key)
    return spec.group if spec is not None else "extras"
