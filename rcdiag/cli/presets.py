"""``rcdiag presets``: verl's 19 presets and what each sets."""

from __future__ import annotations


def presets() -> None:
    """List verl's RolloutCorrectionConfig presets (use one with `rcdiag analyze --preset NAME`)."""
    from rich.table import Table

    from rcdiag.cli.console import stdout_console
    from rcdiag.config import PRESETS

    table = Table(title="verl v0.9.0 presets", title_justify="left", show_edge=False, pad_edge=False)
    for column in (
        "preset",
        "rollout_is",
        "is_threshold",
        "rollout_rs",
        "rs_threshold",
        "bypass_mode",
        "loss_type",
    ):
        table.add_column(column, no_wrap=True)
    for name, build in PRESETS.items():
        c = build()
        table.add_row(
            name,
            str(c.rollout_is),
            str(c.rollout_is_threshold),
            str(c.rollout_rs),
            str(c.rollout_rs_threshold),
            str(c.bypass_mode),
            c.loss_type,
        )
    stdout_console().print(table)
