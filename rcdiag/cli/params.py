"""Flag groups: flags declared once and turned into one value a command receives (a ``ReadOptions``, the engine
flags, the output target), so that a command takes a whole group with one decorator argument.

typer reads a command's parameters from its signature; ``with_flags`` gives the command a signature in which the
group's argument is replaced by the group's flags, and builds the value from them before the command runs (so
every check a builder makes happens before any file is opened).
"""

from __future__ import annotations

import enum
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from rcdiag.runtime.option_checks import Check, choice, flag

F = TypeVar("F", bound=Callable[..., Any])
E = TypeVar("E", bound=enum.Enum)
KEYWORD_ONLY = inspect.Parameter.KEYWORD_ONLY


@dataclass(frozen=True)
class Flag:
    """One command-line parameter: its Python name, ``Annotated[type, typer.Option(...)]`` and default."""

    name: str
    annotation: Any
    default: Any = None


@dataclass(frozen=True)
class FlagGroup:
    """Flags that build one value, passed to the command as ``argument``."""

    argument: str
    flags: tuple[Flag, ...]
    build: Callable[[dict[str, Any]], Any]


def with_flags(*groups: FlagGroup) -> Callable[[F], F]:
    """Give the decorated command every flag of ``groups``; it receives each group's value as its argument."""

    def decorate(command: F) -> F:
        signature = inspect.signature(command)
        arguments = {group.argument for group in groups}
        missing = arguments - set(signature.parameters)
        if missing:
            raise TypeError(f"{command.__name__} takes no argument(s) {', '.join(sorted(missing))}")
        own = [  # the group arguments' annotations may name types imported for type checking only
            p.replace(annotation=_evaluated(p.annotation, command))
            for p in signature.parameters.values()
            if p.name not in arguments
        ]
        added = [
            inspect.Parameter(flag.name, KEYWORD_ONLY, default=flag.default, annotation=flag.annotation)
            for group in groups
            for flag in group.flags
        ]

        @functools.wraps(command)
        def run(**values: Any) -> Any:
            for group in groups:
                values[group.argument] = group.build({flag.name: values.pop(flag.name) for flag in group.flags})
            return command(**values)

        parameters = own + added
        run.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in parameters}
        return run  # type: ignore[return-value]

    return decorate


def _evaluated(annotation: Any, command: Callable[..., Any]) -> Any:
    return eval(annotation, command.__globals__) if isinstance(annotation, str) else annotation


def checked_option(check: Check, into: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """``typer.Option`` keywords holding a flag's value to ``check`` (``rcdiag.runtime.option_checks``): the flag's text
    reaches the check as its ``read`` makes it (a number's text the number, any other text as typed), so every bad
    value, ``0`` or ``abc``, is the template's one line naming the flag as typed (``--workers must be ..., got
    'two'``), exit 2, never typer's wording; ``into`` turns a value that passes into what the command takes. The
    check rides on the callback (``.check``) so the tests can find every checked flag and give it bad values."""

    def callback(ctx: Any, param: Any, value: Any) -> Any:
        if value is None:
            return value
        given = value.value if isinstance(value, enum.Enum) else value
        check(given, flag(max(param.opts, key=len)))
        return value if into is None else into(given)

    callback.check = check  # type: ignore[attr-defined]
    return {"parser": check.read, "callback": callback}


def choice_flag(choices: type[E]) -> dict[str, Any]:
    """``checked_option`` for a flag taking one of ``choices``' values: typer still lists them in ``--help`` and
    completes them in the shell (from the annotation), but a bad one is the template's line (``--format must be
    one of table, json, got 'x'``), not click's."""
    return checked_option(choice(m.value for m in choices), into=choices)
