"""``--as-option KEY=VALUE``: a framework's own option names and values, checked against what it declares.

KEY is the option as the framework's configuration spells it, dotted where it nests
(``actor.rejection_sampling.upper``); VALUE is a JSON value (``3.0``, ``true``, ``null``, ``[0.5, 5.0]``,
``{"level": "sequence"}``), and a bare word that is not JSON is read as a string (``sequence_mask``). A nested block
is given whole as a JSON object (its other fields at their defaults) or one field at a time. Every refusal is one
line naming the option as given (exit 2).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from rcdiag.frameworks.base import Framework
from rcdiag.runtime.errors import ConfigError


def parse_value(text: str) -> Any:
    """A JSON value, else the text itself as a string (a bare word)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def split_option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` -> ``(KEY, value)``."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--as-option {text}: expected KEY=VALUE (e.g. vllm_importance_sampling_mode=token_mask)")
    return key.strip(), parse_value(value.strip())


def option_values(
    framework: Framework, given: Iterable[str] | Mapping[str, Any]
) -> tuple[dict[str, Any], frozenset[str]]:
    """Every option of ``framework`` by its key, at its release's default, overridden by ``given`` (``KEY=VALUE``
    texts, or a mapping of keys to values) in the order given; and the keys given (a block's field as
    ``block.field``, every field of a block given whole)."""
    values = framework.defaults()
    named: set[str] = set()
    pairs = list(given.items()) if isinstance(given, Mapping) else [split_option(text) for text in given]
    for key, value in pairs:
        where = f"--as-option {key}={value if isinstance(value, str) else json.dumps(value)}"
        found = framework.locate(key)
        if found is None:
            raise ConfigError(f"{where}: {_unknown(framework, key)}")
        option, field = found
        if field is None:
            values[option.key] = option.check(value, where)
            named.add(option.key)
            named.update(f"{option.key}.{f.key}" for f in option.fields)
            continue
        current = values[option.key]
        block = dict(option.block_defaults() if current is None else current)
        block[field.key] = field.check(value, where)
        values[option.key] = block
        named.add(f"{option.key}.{field.key}")
    return values, frozenset(named)


def _unknown(framework: Framework, key: str) -> str:
    keys = []
    for option in framework.options:
        keys.append(option.key)
        keys.extend(f"{option.key}.{field.key}" for field in option.fields)
    return (
        f"{framework.label} has no option {key!r} that rcdiag reproduces; its options: {', '.join(keys)} "
        f"(`rcdiag presets --as {framework.name}` lists them with their defaults)"
    )
