"""``rcdiag translate``: what a verl setting means in another framework's terms."""

from __future__ import annotations

from typing import Annotated

import typer

from rcdiag.cli.flags import VerlVersionOpt

TARGETS = ("trl", "openrlhf", "areal", "skyrl")
"""``--to`` choices (``rcdiag.frameworks.translate.TARGETS``; tests/test_translate.py checks they agree)."""


def translate(
    setting: Annotated[
        list[str],
        typer.Argument(
            metavar="SETTING...",
            help="A verl preset (decoupled_geo_rs) or algorithm.rollout_correction fields as KEY=VALUE "
            "(rollout_is=token rollout_is_threshold=2.0), as `analyze --as verl --as-option` takes them.",
            show_default=False,
        ),
    ],
    to: Annotated[
        str,
        typer.Option(
            "--to",
            metavar="|".join(TARGETS),
            help="The framework whose options to give.",
            show_default=False,
        ),
    ],
    source: Annotated[
        str,
        typer.Option("--from", metavar="verl", help="The framework the setting is written for (verl only, for now)."),
    ] = "verl",
    verl_version: VerlVersionOpt = None,
) -> None:
    """Say what a verl setting means in another framework's terms: per part (its IS weight, each RS option), the
    framework's options to give (`analyze --as NAME --as-option ...`), whether they put the same weight on every
    token, reject the same tokens but weight the kept ones otherwise, or are only the nearest, and what differs
    (one- vs two-sided clamps, products vs geometric means, rejection vs a zero weight, verl's inverted k1 band).

    Examples: `rcdiag translate decoupled_geo_rs --to areal`,
    `rcdiag translate rollout_rs=token_k1 rollout_rs_threshold=0.7_1.3 --to trl`.
    """
    from rich.table import Table
    from rich.text import Text

    from rcdiag.cli.console import stdout_console
    from rcdiag.config import PRESETS, preset
    from rcdiag.errors import ConfigError
    from rcdiag.frameworks.registry import choose, framework
    from rcdiag.frameworks.translate import Translation, combined
    from rcdiag.frameworks.translate import translate as translated
    from rcdiag.frameworks.verl import VerlSettings

    if source.strip().lower() != "verl":
        raise ConfigError(f"--from {source}: rcdiag translates verl's settings only, for now")
    if len(setting) == 1 and "=" not in setting[0]:
        if setting[0] not in PRESETS:
            raise ConfigError(f"{setting[0]}: not a verl preset ({', '.join(PRESETS)}) nor KEY=VALUE")
        config = preset(setting[0], verl_version)
    else:
        settings = choose("verl", setting).settings
        assert isinstance(settings, VerlSettings)
        config = settings.config(preset("disabled", verl_version))
    parts = translated(config, to)
    target = framework(to)
    console = stdout_console()
    console.print(Text(f"verl {config.verl_version} -> {target.label} (--as {target.name})", style="bold"))
    table = Table(show_edge=False, pad_edge=False)
    for column in ("verl", "match", f"{target.title} (--as-option)", "what differs"):
        table.add_column(column)
    for part in parts:
        table.add_row(part.part, part.match, "\n".join(part.as_options()) or "—", part.meaning)
    console.print(table)
    setting_all = combined(parts)
    if setting_all is None:
        console.print(Text(f"{target.title} applies one of these at a time: they do not combine into one setting."))
    elif setting_all:
        line = " ".join(f"--as-option '{option}'" for option in Translation("", "same", setting_all).as_options())
        console.print(Text(f"rcdiag analyze DUMP --as {target.name} {line}", style="cyan"), soft_wrap=True)
