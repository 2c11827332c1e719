"""What a rule's ``steps`` and ``tolerate`` take, in one leaf module: the command line checks ``--steps`` and
``--tolerate`` with them before the ``rcdiag.check`` package (which loads the report model) is imported, and the
rule model and the rules file check the same keys with the same words."""

from __future__ import annotations

from typing import Literal, TypeGuard

from rcdiag.runtime.option_checks import choice, probability

StepMode = Literal["every", "last", "mean"]
STEP_MODES: tuple[StepMode, ...] = ("every", "last", "mean")
STEP_MODE = choice(STEP_MODES)
"""What ``--steps`` and a rules file's or rule's ``steps`` take (``rcdiag.runtime.option_checks``)."""
TOLERATE = probability(below_one=True)
"""What ``--tolerate`` and ``tolerate`` take: a share of steps that may fail (1 would pass every rule)."""


def is_step_mode(text: str) -> TypeGuard[StepMode]:
    """Whether ``text`` names a step mode (``--steps``, a rule's ``steps``)."""
    return text in STEP_MODES
