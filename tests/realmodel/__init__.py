"""A real (tiny) language-model path for the tests: a rollout engine and a trainer over a trained model, and
dumps with one planted cause each (see README.md)."""

from .scenarios import SCENARIOS, SWAPPED, TOP_K, Dump, make_dump

__all__ = ["SCENARIOS", "SWAPPED", "TOP_K", "Dump", "make_dump"]
