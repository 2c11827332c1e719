"""``rcdiag presets``: verl's presets (19 since v0.8.0) and what each sets, for the chosen verl release."""

from __future__ import annotations

from rcdiag.cli.flags import VerlVersionOpt


def presets(verl_version: VerlVersionOpt = None) -> None:
    """List verl's RolloutCorrectionConfig presets (use one with `rcdiag analyze --preset NAME`)."""
    from rich.table import Table

    from rcdiag.cli.console import stdout_console
    from rcdiag.config import PRESET_FEATURES, PRESETS, preset
    from rcdiag.versions import verl_version as release_of

    release = release_of(verl_version)
    table = Table(title=f"verl v{release.name} presets", title_justify="left", show_edge=False, pad_edge=False)
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
    for name in PRESETS:
        if name in PRESET_FEATURES and not getattr(release, PRESET_FEATURES[name]):
            continue  # the release has no such preset
        c = preset(name, release.name)
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
