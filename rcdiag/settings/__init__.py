"""What a run is told: verl's rollout-correction options and presets (``correction``), how to read a dump
(``reading``), the verl releases (``versions``), shared defaults and metadata keys (``constants``), and what a rule's
and a section's options take (``rule_options``, ``section_options``: leaf modules, so ``--help`` and the flags' checks
import no numpy)."""
