"""``rcdiag presets``: verl's presets (19 since v0.8.0) and what each sets, for the chosen verl release; with
``--as NAME``, the release of that framework rcdiag reproduces, its options with their defaults and its keys."""

from __future__ import annotations

from rcdiag.cli.flags import VerlVersionOpt, as_option

PresetsAsOpt = as_option(
    "Show the release of this framework rcdiag reproduces, its options (for `analyze --as NAME --as-option "
    "KEY=VALUE`) with their defaults, and the keys it logs."
)


def presets(verl_version: VerlVersionOpt = None, as_name: PresetsAsOpt = None) -> None:  # type: ignore[valid-type]
    """List verl's RolloutCorrectionConfig presets (use one with `rcdiag analyze --preset NAME`); with `--as NAME`,
    the framework's release, options and keys (docs/frameworks.md)."""
    from rich.table import Table

    from rcdiag.cli.console import stdout_console
    from rcdiag.settings.correction import PRESET_FEATURES, PRESETS, preset
    from rcdiag.settings.versions import verl_version as release_of

    console = stdout_console()
    if as_name is not None:
        from rcdiag.frameworks.registry import framework

        found = framework(as_name)
        if found.name != "verl":
            _framework(found, console)
            return
        _framework(found, console, release=release_of(verl_version).name)
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
    console.print(table)


def _framework(found: object, console: object, release: str | None = None) -> None:
    """A framework's release, options (defaults, what each takes) and keys."""
    import json

    from rich.table import Table
    from rich.text import Text

    from rcdiag.frameworks.base import Framework
    from rcdiag.frameworks.registry import choose

    assert isinstance(found, Framework)
    label = f"{found.title} {release or found.release}"
    say = console.print  # type: ignore[attr-defined]
    say(Text(f"{label} (--as {found.name}): {found.source}", style="bold"))
    say(Text(f"one dump step = {found.batching}", style="dim"))
    options = Table(title="options (--as-option KEY=VALUE)", title_justify="left", show_edge=False, pad_edge=False)
    options.add_column("key", no_wrap=True)
    for column in ("default", "takes", "what"):
        options.add_column(column)
    for option in found.options:
        each = "[]." if option.kind == "blocks" else "."  # a list's fields, in each of its blocks
        rows = [(option, option.key)] + [(field, f"{option.key}{each}{field.key}") for field in option.fields]
        for item, key in rows:
            whole = item.fields and item.default is not None and item.kind == "block"
            default = "(its fields)" if whole else json.dumps(item.default)
            options.add_row(key, default, item.accepts(), item.help)
    say(options)
    keys = Table(title="keys it logs", title_justify="left", show_edge=False, pad_edge=False)
    keys.add_column("key", no_wrap=True)
    keys.add_column("reading")
    for logged in found.keys:
        keys.add_row(logged.key, logged.reading + (f" ({logged.when})" if logged.when else ""))
    say(keys)
    for note in choose(found.name).settings.notes():
        say(Text(f"under its defaults: {note}", style="dim"))
