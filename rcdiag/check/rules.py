"""The rule model and the ``NAME=VALUE`` bound syntax every rule source shares.

Kept free of reports and engines so that the command line, the packs and the TOML loader can build and validate
rules before any file is read.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

from rcdiag.runtime.errors import ConfigError, RcdiagError
from rcdiag.runtime.option_checks import keyword, refuse
from rcdiag.settings.rule_options import STEP_MODE, TOLERATE, StepMode

RuleKind = Literal["max", "min", "max_abs", "max_increase", "max_decrease"]
Status = Literal["passed", "failed", "skipped"]

RULE_KINDS: tuple[RuleKind, ...] = ("max", "min", "max_abs", "max_increase", "max_decrease")
RELATIVE_KINDS = ("max_increase", "max_decrease")


@dataclass(frozen=True)
class Rule:
    """One bound on one metric."""

    metric: str
    """As written: ``kl``, ``rollout_corr/kl`` or ``rcdiag/token_mult_prob_error``."""
    kind: RuleKind
    bound: float
    relative: bool = False
    """For ``max_increase``/``max_decrease``: ``bound`` is a fraction of |baseline| (``50%`` -> 0.5)."""
    steps: StepMode = "every"
    tolerate: float = 0.0
    """Fraction of steps allowed to fail (``steps="every"`` only)."""
    source: str = "command line"
    optional: bool = False
    """Skipped (not an error) when the configuration does not compute the metric: rule packs."""

    def __post_init__(self) -> None:
        if self.kind not in RULE_KINDS:
            raise ConfigError(f"unknown rule kind '{self.kind}'; use one of {', '.join(RULE_KINDS)}.")
        STEP_MODE(self.steps, keyword("steps"))
        if not math.isfinite(self.bound):
            raise refuse(f"the bound of the rule on '{self.metric}'", "a finite number", self.bound)
        if self.relative and self.kind not in RELATIVE_KINDS:
            raise ConfigError(f"a percentage bound only makes sense for max_increase/max_decrease ({self.metric}).")
        TOLERATE(self.tolerate, keyword("tolerate"))
        if self.tolerate and self.steps != "every":
            raise ConfigError(f"tolerate applies to steps='every' only (rule on '{self.metric}' has '{self.steps}').")
        if self.kind == "max_abs" and self.bound < 0:
            raise refuse(f"the max_abs bound of the rule on '{self.metric}'", "a number >= 0", self.bound)

    def describe(self, key: str | None = None) -> str:
        """``rollout_corr/kl <= 0.002``, ``|kl| <= 0.1``, ``kl <= baseline + 50%``."""
        name = key or self.metric
        amount = f"{self.bound * 100:g}%" if self.relative else f"{self.bound:g}"
        return {
            "max": f"{name} <= {self.bound:g}",
            "min": f"{name} >= {self.bound:g}",
            "max_abs": f"|{name}| <= {self.bound:g}",
            "max_increase": f"{name} <= baseline + {amount}",
            "max_decrease": f"{name} >= baseline - {amount}",
        }[self.kind]

    def mode(self) -> str:
        """``every step``, ``every step, 10% may fail``, ``last step``, ``mean over steps``."""
        if self.steps == "last":
            return "last step"
        if self.steps == "mean":
            return "mean over steps"
        return "every step" + (f", {self.tolerate * 100:g}% may fail" if self.tolerate else "")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def parse_assignment(
    text: str, kind: RuleKind, *, option: str, steps: StepMode = "every", tolerate: float = 0.0
) -> Rule:
    """``kl=2e-3`` (``kl=50%`` or ``kl=abs:1e-4`` for a relative rule) from a command-line option."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip() or not value.strip():
        raise ConfigError(f"{option} expects NAME=VALUE (e.g. {option} kl=2e-3), got '{text}'.")
    bound, relative = parse_bound(value.strip(), kind, f"{option} {name.strip()}")
    return Rule(name.strip(), kind, bound, relative, steps, tolerate, option)


ABSOLUTE_PREFIX = "abs:"
"""``kl=abs:1e-4``: an allowed increase/decrease in the metric's own units (``kl=50%``: a share of |baseline|)."""


def parse_bound(value: Any, kind: RuleKind, where: str, error: type[RcdiagError] = ConfigError) -> tuple[float, bool]:
    """``(bound, relative)`` of the bound ``where`` names (``--max kl``, ``[max] kl in rules.toml``); a bad one is
    the option-check template's ``error``. A relative kind needs its unit spelled out (``50%`` or ``abs:0.002``): a
    bare number is refused, since ``kl=50`` meant as 50% would be an absolute +50 that always passes."""
    unit = kind in RELATIVE_KINDS
    what = (
        f"a share of |baseline| ('{value}%') or an amount in the metric's own units ('{ABSOLUTE_PREFIX}{value}')"
        if unit
        else "a finite number (a percentage or 'abs:' only for max_increase/max_decrease)"
    )
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise refuse(where, what, value, error)
    text = value.strip() if isinstance(value, str) else value
    relative = isinstance(text, str) and text.endswith("%")
    absolute = isinstance(text, str) and text.lower().startswith(ABSOLUTE_PREFIX)
    if unit != (relative or absolute):
        raise refuse(where, what, value, error)
    if isinstance(text, str):
        text = text.removesuffix("%") if relative else text[len(ABSOLUTE_PREFIX) :] if absolute else text
    try:
        number = float(text)
    except ValueError:
        raise refuse(where, what, value, error) from None
    if not math.isfinite(number):
        raise refuse(where, what, value, error)
    if unit and number < 0:
        raise refuse(where, "an allowed increase/decrease >= 0", value, error)
    return (number / 100.0 if relative else number), relative
