"""``rcdiag translate``: what one framework's setting means in another's terms."""

from __future__ import annotations

from typing import Annotated

import typer

from rcdiag.cli.flags import AS_NAMES, VerlVersionOpt

FORMATS = ("text", "json")


def translate(
    setting: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="SETTING...",
            help="The --from framework's options as KEY=VALUE, as `analyze --as NAME --as-option` takes them "
            "(nothing: its defaults); for verl also a preset name (decoupled_geo_rs).",
            show_default=False,
        ),
    ] = None,
    to: Annotated[
        str,
        typer.Option(
            "--to",
            metavar="|".join(AS_NAMES),
            help="The framework whose options to give.",
            show_default=False,
        ),
    ] = "",
    source: Annotated[
        str,
        typer.Option("--from", metavar="|".join(AS_NAMES), help="The framework the setting is written for."),
    ] = "verl",
    verl_version: VerlVersionOpt = None,
    output_format: Annotated[
        str,
        typer.Option("--format", metavar="|".join(FORMATS), help="text (tables) or json (the translation)."),
    ] = "text",
) -> None:
    """Say what one framework's setting means in another's terms: per part (a weight and its own mask, each other
    band), the target's options, whether they put the same weight on every token (`same`), zero the same tokens
    but weight the kept ones otherwise (`same_rejections`), are only the `nearest` or have `none` alike, and what
    differs (one- vs two-sided clamps, products vs geometric means, verl's inverted k1 band, AReaL's reversed k3);
    then the whole setting as one of the target's, written as its users write it, and the `analyze --as` line.

    Examples: `rcdiag translate decoupled_geo_rs --to areal`,
    `rcdiag translate rollout_rs=token_k1 rollout_rs_threshold=0.7_1.3 --to trl`,
    `rcdiag translate --from trl --to openrlhf` (TRL's defaults).
    """
    from rcdiag.cli.output import print_stdout
    from rcdiag.frameworks.registry import choose
    from rcdiag.frameworks.translate import translate as translated
    from rcdiag.runtime.errors import ConfigError
    from rcdiag.settings.correction import PRESETS, preset

    if output_format not in FORMATS:
        raise ConfigError(f"--format {output_format}: translate writes {' or '.join(FORMATS)}")
    if not to:
        raise ConfigError(f"--to: give the framework whose options to give ({', '.join(AS_NAMES)})")
    given = setting or []
    chosen = choose(source, given if not _preset(given, source) else [])
    if _preset(given, source):
        if given[0] not in PRESETS:
            raise ConfigError(f"{given[0]}: not a verl preset ({', '.join(PRESETS)}) nor KEY=VALUE")
        fields = preset(given[0], verl_version).to_dict()
        fields.pop("verl_version")
        chosen = choose("verl", fields)
    elif chosen.name == "verl" and verl_version is not None:
        chosen.settings.config(preset("disabled", verl_version))  # type: ignore[attr-defined]  # its grammar's checks
    result = translated(chosen, to)
    if output_format == "json":
        import json

        out = result.to_dict()
        whole = result.whole
        out["setting"]["paste"] = result.target.paste(whole.options) if whole.options else ""
        print_stdout(json.dumps(out, indent=2))
        return
    _text(result, chosen)


def _preset(given: list[str], source: str) -> bool:
    return source.strip().lower() == "verl" and len(given) == 1 and "=" not in given[0]


def _text(result: object, chosen: object) -> None:
    from rich.table import Table
    from rich.text import Text

    from rcdiag.cli.console import stdout_console
    from rcdiag.frameworks.translate import Translated

    assert isinstance(result, Translated)
    source, target = result.source, result.target
    console = stdout_console()
    console.print(Text(f"{source.label} -> {target.label} (--as {target.name})", style="bold"))
    table = Table(show_edge=False, pad_edge=False)
    for column in (source.title, "match", f"{target.title} (--as-option)", "what differs"):
        table.add_column(column)
    for part in result.parts:
        cells = (part.part, part.match, "\n".join(part.as_options()) or "—", part.meaning)
        table.add_row(*(Text(cell) for cell in cells))
    console.print(table)
    whole = result.whole
    if whole.match == "none":
        console.print(Text(f"as one setting: none. {whole.meaning}"))
        return
    console.print(Text(f"as one setting ({whole.match}): {whole.meaning}", style="bold"))
    console.print(Text(target.paste(whole.options).rstrip()))
    line = " ".join(f"--as-option '{option}'" for option in whole.as_options())
    console.print(Text(f"rcdiag analyze DUMP --as {target.name} {line}", style="cyan"), soft_wrap=True)
