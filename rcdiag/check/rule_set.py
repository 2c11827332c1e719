"""The one rule set a gate runs: bounds given as flags, packs, ``--fail-on`` and a rules file (or pyproject.toml's
table), assembled the same way for ``check`` and ``watch``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rcdiag.check.findings_gate import FindingGate, parse_fail_on
from rcdiag.check.packs import packs_and_gate
from rcdiag.check.rules import Rule, RuleKind, StepMode, parse_assignment
from rcdiag.check.rules_file import RuleFile

BOUND_FLAGS: dict[RuleKind, str] = {
    "max": "--max",
    "min": "--min",
    "max_abs": "--max-abs",
    "max_increase": "--max-increase",
    "max_decrease": "--max-decrease",
}
"""Each rule kind's flag, for the messages that name the flag a bound came from."""


@dataclass(frozen=True)
class RuleSet:
    """Rules on metrics and the gate on findings, with the rules file they were partly read from."""

    rules: tuple[Rule, ...]
    gate: FindingGate | None
    loaded: RuleFile | None = None


def rule_set(
    bounds: Mapping[str, Sequence[str] | None],
    packs: Sequence[str] | None = None,
    fail_on: Sequence[str] | None = None,
    loaded: RuleFile | None = None,
    *,
    steps: StepMode = "every",
    tolerate: float = 0.0,
) -> RuleSet:
    """The flags' bounds (``NAME=VALUE`` texts by rule kind: ``{"max": [...]}``), the packs' rules and gate,
    ``--fail-on``, then the rules file's rules and gate, in that order (a rule file's gate merged with the flags')."""
    rules: list[Rule] = []
    for kind, option in BOUND_FLAGS.items():
        texts = bounds.get(kind)
        rules += [parse_assignment(text, kind, option=option, steps=steps, tolerate=tolerate) for text in texts or []]
    packed, gate = packs_and_gate(packs or [], parse_fail_on(fail_on or []), steps=steps, tolerate=tolerate)
    rules += packed
    if loaded is not None:
        rules += loaded.rules
        gate = loaded.fail_on.merged(gate) if loaded.fail_on is not None else gate
    return RuleSet(tuple(rules), gate, loaded)
