"""A real (tiny) language-model path for the tests: a rollout engine and a trainer over a trained model, and
dumps with one planted cause each (see README.md)."""

from .scenarios import CLEAN_DEFECTS, DEFECTS, SCENARIOS, SWAPPED, TOP_K, Defect, Dump, make_defect_dump, make_dump

__all__ = [
    "CLEAN_DEFECTS",
    "DEFECTS",
    "SCENARIOS",
    "SWAPPED",
    "TOP_K",
    "Defect",
    "Dump",
    "make_defect_dump",
    "make_dump",
]
