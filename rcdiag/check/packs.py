"""Rule packs: named sets of thresholds that verl, NeMo-RL and Miles document.

The packs and their thresholds live in the metric catalogue (each ``Threshold`` names the packs holding it).
Pack rules are optional: a metric the configuration does not compute is skipped, so one pack fits every
configuration.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rcdiag.catalogue.metrics import PACKS, pack_rules
from rcdiag.check.findings_gate import ANALYZE_PACK, ANALYZE_PACK_GATE, FindingGate
from rcdiag.check.rules import Rule, StepMode
from rcdiag.runtime.errors import ConfigError

PACK_SOURCES = PACKS


def pack(name: str, *, steps: StepMode = "every", tolerate: float = 0.0) -> tuple[Rule, ...]:
    """The rules of one pack; a rule whose metric the configuration does not compute is skipped, not an error."""
    if name == ANALYZE_PACK:
        raise ConfigError(
            f"the '{ANALYZE_PACK}' pack is a gate on findings, not metric rules: pass fail_on=ANALYZE_PACK_GATE."
        )
    if name not in PACKS:
        raise ConfigError(f"unknown rule pack '{name}'; packs: {', '.join(PACKS)}, {ANALYZE_PACK}.")
    return tuple(
        Rule(key, kind, bound, steps=steps, tolerate=tolerate, source=f"pack {name}", optional=True)
        for key, kind, bound in pack_rules(name)
    )


def packs_and_gate(
    names: Iterable[str], gate: FindingGate | None, *, steps: StepMode = "every", tolerate: float = 0.0
) -> tuple[list[Rule], FindingGate | None]:
    """Packs as ``--pack`` and a rules file's ``packs`` name them: each metric pack's rules, and ``gate`` merged
    with the ``analyze`` pack's gate on findings when it is named. A pack named more than once counts once (in the
    order first named): 5,000 repeated entries are one pack's rules, not 5,000 copies of them to evaluate."""
    rules: list[Rule] = []
    for name in dict.fromkeys(names):
        if name == ANALYZE_PACK:
            gate = ANALYZE_PACK_GATE.merged(gate)
        else:
            rules.extend(pack(name, steps=steps, tolerate=tolerate))
    return rules, gate


def describe_packs() -> Mapping[str, str]:
    """Pack name -> where its thresholds come from."""
    return PACKS
