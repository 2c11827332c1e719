"""docs/options.md and ``--help`` agree: every flag of every command is documented under the commands that take
it, no documented flag is missing from a command, and every flag with choices lists exactly its choices."""

from __future__ import annotations

import re

import pytest
import typer
from conftest import ROOT

from rcdiag.cli import app

PAGE = (ROOT / "docs" / "options.md").read_text()
ROOT_COMMAND = typer.main.get_command(app)
COMMANDS = {"rcdiag": ROOT_COMMAND, **ROOT_COMMAND.commands}  # type: ignore[attr-defined]


def documented() -> dict[str, dict[str, list[str] | None]]:
    """command -> flag -> its choices as documented (``None``: no choices), from the flag tables of
    '## Command-line flags', whose '###' headings name their commands in backticks."""
    section = PAGE.split("## Command-line flags", 1)[1].split("\n## ", 1)[0]
    result: dict[str, dict[str, list[str] | None]] = {name: {} for name in COMMANDS}
    for block in section.split("\n### ")[1:]:
        heading, _, body = block.partition("\n")
        names = re.findall(r"`([a-z]+)`", heading.rpartition("(")[2])
        assert names and set(names) <= set(COMMANDS), heading
        for line in body.splitlines():
            if not line.startswith("| `-"):
                continue
            first_cell = re.split(r"(?<!\\)\|", line)[1]
            for item in re.findall(r"`([^`]+)`", first_cell):
                flag, _, value = item.partition(" ")
                choices = value.split("\\|") if "\\|" in value else None
                for name in names:
                    assert flag not in result[name], f"{flag} documented twice for {name}"
                    result[name][flag] = choices
    return result


def in_help(command: object) -> dict[str, list[str] | None]:
    """flag -> its choices (a click Choice, or a metavar that lists values as ``a|b``), for one command."""
    flags: dict[str, list[str] | None] = {}
    for param in command.params:  # type: ignore[attr-defined]
        if param.param_type_name != "option":
            continue
        kind = getattr(param, "type", None) or getattr(param, "type_descriptor", None)  # click; typer >= 0.26
        choices = getattr(kind, "choices", None)
        if choices is None and param.metavar and "|" in param.metavar:
            choices = param.metavar.split("|")
        for flag in (*param.opts, *param.secondary_opts):
            if flag != "--help":
                flags[flag] = [str(getattr(c, "value", c)) for c in choices] if choices else None
    return flags


DOCUMENTED = documented()


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_options_page_lists_exactly_each_commands_flags(name: str) -> None:
    assert set(DOCUMENTED[name]) == set(in_help(COMMANDS[name]))


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_documented_choices_are_the_help_choices(name: str) -> None:
    documented_choices = DOCUMENTED[name]
    for flag, choices in in_help(COMMANDS[name]).items():
        assert documented_choices.get(flag) == choices, flag


def test_the_device_choices_agree_with_the_backend() -> None:
    """``--device`` lists the spellings ``get_backend`` accepts; an unlisted one is refused."""
    from rcdiag.metrics.backend import get_backend
    from rcdiag.runtime.errors import ConfigError
    from rcdiag.settings.constants import DEVICES

    assert DOCUMENTED["analyze"]["--device"] == list(DEVICES)
    assert get_backend("cpu").name == "cpu"
    with pytest.raises(ConfigError, match="Use one of cpu, cuda, cuda:N, auto, torch-cpu"):
        get_backend("tpu")
