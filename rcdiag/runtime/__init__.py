"""How rcdiag behaves as a process, below every other layer: errors and exit codes, the one template a bad option is
refused with (``option_checks``) and the type checks of values read from files (``fields``), notices, Ctrl-C and
SIGTERM, its ``RCDIAG_*`` variables, names resolved when first asked for, and text from files made safe for a
terminal.

These modules import nothing of rcdiag but each other and ``rcdiag.core`` (docs/architecture.md, "leaves")."""
