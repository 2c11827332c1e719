"""``check`` results for machines and CI: JUnit XML, a Markdown step summary, GitHub Actions annotations.

No rich here: these are plain strings (the JUnit file is built with the standard library's ElementTree).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from rcdiag.check import CheckResult, RuleResult
from rcdiag.render import counted

_MARK = {"passed": "✅", "failed": "❌", "skipped": "⏭️"}


def render_junit(result: CheckResult) -> str:
    """A JUnit XML report: one ``testcase`` per rule, a ``failure`` per failed rule, ``skipped`` per skipped one."""
    counts = result.counts()
    facts = result.report.input
    gate = _gate_cases(result)
    exact = exact_cases(result)
    totals = {
        "tests": str(len(result.results) + len(gate) + len(exact)),
        "failures": str(counts["failed"] + len(result.failing_findings) + sum(failed for _, failed, _ in exact)),
        "errors": "0",
        "skipped": str(counts["skipped"]),
    }
    root = ET.Element("testsuites", {"name": "rcdiag check", **totals})
    suite = ET.SubElement(root, "testsuite", {"name": f"rcdiag check {facts.path}", **totals})
    properties = ET.SubElement(suite, "properties")
    props = {
        "dump": facts.path,
        "rows": str(facts.rows),
        "steps": str(facts.steps),
        "config": json.dumps(result.report.config.to_dict()),
    }
    if result.baseline is not None:
        props["baseline"] = result.baseline.input.path
    for name, value in props.items():
        ET.SubElement(properties, "property", {"name": name, "value": value})
    for item in result.results:
        case = ET.SubElement(suite, "testcase", {"classname": f"rcdiag.check.{item.rule.source}", "name": item.label})
        if item.status == "failed":
            failure = ET.SubElement(case, "failure", {"message": item.message, "type": "rcdiag.RuleFailed"})
            failure.text = _details(item)
        elif item.status == "skipped":
            ET.SubElement(case, "skipped", {"message": item.message})
    for name, failure_message, text in gate:
        case = ET.SubElement(suite, "testcase", {"classname": "rcdiag.check.fail_on", "name": name})
        if failure_message is not None:
            failure = ET.SubElement(case, "failure", {"message": failure_message, "type": "rcdiag.FindingFailed"})
            failure.text = text
    for name, failed, text in exact:
        case = ET.SubElement(suite, "testcase", {"classname": "rcdiag.check.exact", "name": name})
        if failed:
            failure = ET.SubElement(case, "failure", {"message": text, "type": "rcdiag.NotIdentical"})
            failure.text = text
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _gate_cases(result: CheckResult) -> list[tuple[str, str | None, str]]:
    """The finding gate's test cases: one failed case per failing finding, or one passing case when none fails
    (no cases without a gate), as (name, failure message or ``None``, details)."""
    if result.fail_on is None:
        return []
    gate = result.fail_on.describe()
    if not result.failing_findings:
        return [(f"no finding: {gate}", None, "")]
    cases: list[tuple[str, str | None, str]] = []
    for item in result.failing_findings:
        steps = f"\nsteps: {', '.join(map(str, item.steps))}" if item.steps else ""
        text = f"finding: {item.code} ({item.severity})\nfail on: {gate}{steps}\n{item.message}"
        cases.append((f"finding {item.code} ({item.severity})", item.message, text))
    return cases


def exact_cases(result: CheckResult) -> list[tuple[str, bool, str]]:
    """``--exact``'s one test case (none without it), as (name, failed, message): the message names the first
    differing response and position when it fails."""
    if not result.exact:
        return []
    return [("bitwise identical", result.exact_failure is not None, result.exact_message)]


def _details(item: RuleResult) -> str:
    lines = [
        f"rule: {item.label}",
        f"source: {item.rule.source}",
        f"value: {_g(item.value)}",
        f"limit: {_g(item.limit)}",
    ]
    if item.step is not None:
        lines.append(f"step: {item.step}")
    if item.failing_steps:
        lines.append("failing steps: " + ", ".join(map(str, item.failing_steps)))
    if item.baseline is not None:
        lines.append(f"baseline: {_g(item.baseline)}")
    lines.append(item.message)
    return "\n".join(lines)


def render_markdown(result: CheckResult) -> str:
    """A Markdown summary for a CI step (e.g. ``$GITHUB_STEP_SUMMARY``)."""
    facts = result.report.input
    verdict = result.verdict()
    word, _, rest = verdict.partition(": ")
    headline = f"{'✅' if result.passed else '❌'} rcdiag check {word.lower()}: {rest}"
    lines = [f"### {headline}", ""]
    about = f"`{facts.path}` · {counted(facts.rows, 'row')} · {facts.valid_tokens:,} valid tokens"
    if facts.steps:
        about += f" · {counted(facts.steps, 'step')}"
    if result.baseline is not None:
        about += f" · baseline `{result.baseline.input.path}`"
    lines += [about, "", "| | rule | value | limit | step | source | detail |", "|---|---|---|---|---|---|---|"]
    for item in result.results:
        cells = [
            _MARK[item.status],
            f"`{item.rule.describe(item.key)}` ({item.rule.mode()})",
            _g(item.value),
            _g(item.limit),
            "" if item.step is None else str(item.step),
            item.rule.source,
            item.message,
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    for name, failure_message, _ in _gate_cases(result):
        mark = _MARK["failed"] if failure_message is not None else _MARK["passed"]
        lines.append(
            "| " + " | ".join(_cell(c) for c in (mark, name, "", "", "", "--fail-on", failure_message or "")) + " |"
        )
    for name, failed, text in exact_cases(result):
        mark = _MARK["failed" if failed else "passed"]
        lines.append("| " + " | ".join(_cell(c) for c in (mark, name, "", "", "", "--exact", text)) + " |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def github_annotations(result: CheckResult) -> list[str]:
    """``::error`` workflow commands, one per failed rule (GitHub shows them on the run's summary)."""
    out = []
    for item in result.failed:
        title = _property(f"rcdiag check: {item.rule.describe(item.key)}")
        out.append(f"::error title={title}::{_data(f'{result.report.input.path}: {item.label}: {item.message}')}")
    for finding in result.failing_findings:
        title = _property(f"rcdiag check: finding {finding.code}")
        out.append(f"::error title={title}::{_data(f'{result.report.input.path}: {finding.code}: {finding.message}')}")
    if result.exact_failure is not None:
        title = _property("rcdiag check: --exact")
        out.append(f"::error title={title}::{_data(f'{result.report.input.path}: {result.exact_failure}')}")
    return out


def _data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _property(text: str) -> str:
    return _data(text).replace(":", "%3A").replace(",", "%2C")


def _g(value: float | None) -> str:
    return "—" if value is None else f"{value:.6g}"
