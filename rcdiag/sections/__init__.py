"""Everything that rides on a run beside verl's per-step metrics: ``--explain``, and each feature built the same
way (docs/architecture.md, "Sections").

A section (``Section``) declares its key, checks what it needs before any value is read (``prepare``), builds the
whole-dump accumulator each read feeds (``new_state``, merged across worker parts and saved under its key), turns
the finished state into a typed record (``record``), derives its findings from that record (``findings``) and writes
its files (``write``, called by the library after the report is built, never inside it). ``registry`` is the one
table of the section kinds a saved state may hold.
"""

from rcdiag.sections.base import RunFacts, Section, SectionRecord

__all__ = ["RunFacts", "Section", "SectionRecord"]
