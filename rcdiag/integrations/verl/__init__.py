"""Dump from verl's own trainer without editing it::

    python -m rcdiag.integrations.verl <verl's usual arguments> +rcdiag.dump_dir=DIR

runs verl's trainer (``verl.trainer.main_ppo``) with rcdiag's ``DumpWriter`` wrapped around verl's
rollout-correction step (``hook.py``); ``launch.py`` handles the command line (docs/dump-writer.md).
"""
