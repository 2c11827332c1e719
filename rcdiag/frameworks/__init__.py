"""Each LLM-RL framework's own correction and logged keys, reproduced on a dump (``rcdiag analyze --as NAME``).

One module per framework (``trl``, ``openrlhf``, ``areal``; ``verl`` maps its options onto rcdiag's verl engine)
declares a ``Framework``: the release it reproduces, its options as its config spells them, with that release's
defaults, the keys it logs, and how its settings build the per-step accumulator that computes them.
``registry`` is the one table of names; ``section`` runs the chosen framework beside verl's metrics (a section of
``rcdiag.sections``: per step and pooled, merged like every accumulator). docs/frameworks.md says how to add one.
"""
