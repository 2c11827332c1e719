"""Rules from TOML: a standalone rules file, or the ``[tool.rcdiag.check]`` table of a pyproject.toml.

TOML errors are the user's input errors (``InputError``, naming the file and table), not configuration errors,
so they are reported against the file that holds them.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rcdiag.check.findings_gate import FindingGate, parse_fail_on
from rcdiag.check.packs import packs_and_gate
from rcdiag.check.rules import RULE_KINDS, Rule, parse_bound
from rcdiag.io.outputs import reads
from rcdiag.io.paths import regular_file
from rcdiag.runtime.errors import ConfigError, InputError
from rcdiag.runtime.option_checks import key
from rcdiag.settings.correction import CorrectionConfig, preset, refuse_router_replay
from rcdiag.settings.rule_options import STEP_MODE, TOLERATE, StepMode

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CONFIG_TABLE = ("tool", "rcdiag", "check")
MAX_RULES_BYTES = 1 << 20
"""The largest rules file (or pyproject.toml) read: rules are a few lines."""
RULES_INPUT = "the rules file {source}"
PROJECT_INPUT = "the project file {source} (read for its [tool.rcdiag.check]; --no-pyproject skips it)"
"""How a refused output names the file rules were read from (rcdiag.io.outputs.Ledger)."""


@dataclass(frozen=True)
class RuleFile:
    """What a TOML rules table holds."""

    path: Path
    rules: tuple[Rule, ...]
    engine: dict[str, Any]
    """``preset`` and verl's ``rollout_correction`` fields for the engine (empty: flags/defaults)."""
    baseline: Path | str | None
    """Resolved against the TOML file's directory."""
    fail_on: FindingGate | None = None
    """``fail_on = ["warning"]`` or ``packs = ["analyze"]``: the gate on findings (``--fail-on``)."""
    exact: bool = False
    """``exact = true``: fail unless the log-prob columns are bitwise identical (``--exact``)."""

    def refuse_router_replay(self, config: CorrectionConfig) -> None:
        """Refuse ``router_replay_mode = "R2"`` with the engine's final ``config`` in bypass mode, as verl 0.9.1's
        ``validate_config`` does (the flags may have set bypass mode on top of the file)."""
        mode = self.engine.get(ROUTER_REPLAY, "disabled")
        if mode not in ("disabled", "R2", "R3"):
            raise ConfigError(f"{self.path}: [engine]: {ROUTER_REPLAY} must be disabled, R2 or R3, got {mode!r}")
        try:
            refuse_router_replay(mode, config.bypass_mode, config.verl_version)
        except ConfigError as exc:
            raise ConfigError(f"{self.path}: [engine]: {exc}") from None

    def config(self) -> CorrectionConfig | None:
        """The engine configuration the file asks for, or ``None`` if it sets none."""
        if not set(self.engine) - {ROUTER_REPLAY}:
            return None
        fields = {k: v for k, v in self.engine.items() if k not in ("preset", ROUTER_REPLAY)}
        name = self.engine.get("preset")
        try:
            base = preset(name) if name else CorrectionConfig()
            return base.replace(**fields)
        except (TypeError, ConfigError) as exc:
            raise ConfigError(f"{self.path}: [engine]: {exc}") from None


_TABLE_KEYS = {"packs", "fail_on", "exact", "steps", "tolerate", "baseline", "engine", "rule", *RULE_KINDS}
_RULE_KEYS = {"metric", "steps", "tolerate", *RULE_KINDS}
ROUTER_REPLAY = "router_replay_mode"
"""``[engine]``'s key for the actor engine's ``router_replay.mode``, read only to refuse what verl 0.9.1 refuses."""
_ENGINE_KEYS = {"preset", ROUTER_REPLAY, *(f.name for f in dataclasses.fields(CorrectionConfig))}


def load_rules(
    path: str | Path,
    *,
    steps: StepMode = "every",
    tolerate: float = 0.0,
    required: bool = True,
    what: str = RULES_INPUT,
) -> RuleFile | None:
    """Rules from a TOML file: its ``[tool.rcdiag.check]`` table if it has one, else its top level.

    ``steps``/``tolerate`` are the defaults for rules that set neither (the file's own top-level ``steps`` and
    ``tolerate`` override them). With ``required=False`` a file without ``[tool.rcdiag.check]`` gives ``None``
    (a pyproject.toml that does not configure rcdiag). The file is added to the run's inputs first (``what``
    names it): an output over it is refused before it is read.
    """
    p = Path(path)
    reads(p, what=what)
    try:
        regular_file(str(p), "a rules file")
        with p.open("rb") as handle:
            raw = handle.read(MAX_RULES_BYTES + 1)
        if len(raw) > MAX_RULES_BYTES:
            raise InputError(f"is more than {MAX_RULES_BYTES >> 20} MiB, the limit for a rules file", path=str(p))
        data = tomllib.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        raise InputError("file not found", path=str(p)) from None
    except OSError as exc:
        raise InputError(f"cannot read the rules file ({exc.strerror})", path=str(p)) from None
    except UnicodeDecodeError as exc:
        raise InputError(f"not valid TOML (not UTF-8 text: byte {exc.start})", path=str(p)) from None
    except RecursionError:
        raise InputError("not valid TOML (arrays or tables nested too deep)", path=str(p)) from None
    except ValueError as exc:  # TOMLDecodeError, and an integer beyond Python's 4300-digit conversion limit
        raise InputError(f"not valid TOML ({exc})", path=str(p)) from None
    table: Any = data
    for part in CONFIG_TABLE:
        table = table.get(part) if isinstance(table, dict) else None
    if table is None:
        if not required or p.name == "pyproject.toml":
            if required:
                raise InputError("has no [tool.rcdiag.check] table", path=str(p))
            return None
        table, where = data, "top level"
    else:
        where = "[tool.rcdiag.check]"
    if not isinstance(table, dict):
        raise InputError(f"{where} must be a table", path=str(p))
    return _parse_table(p, table, where, steps, tolerate)


def _parse_table(path: Path, table: dict, where: str, steps: Any, tolerate: Any) -> RuleFile:
    def fail(message: str) -> InputError:
        return InputError(f"{where}: {message}", path=str(path))

    unknown = sorted(set(table) - _TABLE_KEYS)
    if unknown:
        raise fail(f"unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(_TABLE_KEYS))}")

    def place(name: str, label: str = "") -> str:  # `[tool.rcdiag.check] [[rule]] #2 steps in pyproject.toml`
        return key(name, path, " ".join(part for part in (where if where != "top level" else "", label) if part))

    steps = STEP_MODE(table.get("steps", steps), place("steps"), InputError)
    tolerate = float(TOLERATE(table.get("tolerate", tolerate), place("tolerate"), InputError))
    rules: list[Rule] = []
    source = path.name
    try:
        gate = parse_fail_on(_list_of_str(table.get("fail_on", []), "fail_on", fail), option="fail_on")
        packed, gate = packs_and_gate(
            _list_of_str(table.get("packs", []), "packs", fail), gate, steps=steps, tolerate=tolerate
        )
        rules.extend(packed)
        for kind in RULE_KINDS:
            entries = table.get(kind, {})
            if not isinstance(entries, dict):
                raise fail(f"[{kind}] must be a table of NAME = VALUE")
            for metric, value in entries.items():
                bound, relative = parse_bound(value, kind, place(metric, f"[{kind}]"), InputError)
                rules.append(Rule(metric, kind, bound, relative, steps, tolerate, source))
        entries = table.get("rule", [])
        if not isinstance(entries, list):
            raise fail("rule must be an array of tables ([[rule]])")
        for index, entry in enumerate(entries):
            if not isinstance(entry, dict) or not isinstance(entry.get("metric"), str):
                raise fail(f'[[rule]] #{index + 1} needs metric = "NAME"')
            bad = sorted(set(entry) - _RULE_KEYS)
            if bad:
                raise fail(
                    f"[[rule]] #{index + 1}: unknown key(s) {', '.join(bad)}; known: {', '.join(sorted(_RULE_KEYS))}"
                )
            kinds = [k for k in RULE_KINDS if k in entry]
            if not kinds:
                raise fail(f"[[rule]] #{index + 1} ({entry['metric']}) sets no bound ({', '.join(RULE_KINDS)})")
            for kind in kinds:
                label = f"[[rule]] #{index + 1}"
                bound, relative = parse_bound(entry[kind], kind, place(kind, label), InputError)
                rule_steps = STEP_MODE(entry.get("steps", steps), place("steps", label), InputError)
                rule_tolerate = float(TOLERATE(entry.get("tolerate", tolerate), place("tolerate", label), InputError))
                rules.append(Rule(entry["metric"], kind, bound, relative, rule_steps, rule_tolerate, source))
    except ConfigError as exc:
        message = str(exc)
        raise (InputError(message) if message.startswith(str(path)) else fail(message)) from None
    engine = table.get("engine", {})
    if not isinstance(engine, dict) or set(engine) - _ENGINE_KEYS:
        raise fail(f"[engine] takes {', '.join(sorted(_ENGINE_KEYS))}")
    baseline = table.get("baseline")
    if baseline is not None and not isinstance(baseline, str):
        raise fail("baseline must be a path string")
    # a path is relative to the rules file; a URL (s3://...) is kept as it is
    resolved = (baseline if "://" in baseline else path.parent / baseline) if baseline else None
    exact = table.get("exact", False)
    if not isinstance(exact, bool):
        raise fail("exact must be true or false")
    return RuleFile(path, tuple(rules), dict(engine), resolved, gate, exact)


def _list_of_str(value: Any, name: str, fail: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise fail(f"{name} must be a list of strings")
    return value


def find_project_rules(directory: str | Path = ".", **defaults: Any) -> RuleFile | None:
    """``[tool.rcdiag.check]`` of ``directory/pyproject.toml``, if that file exists and has the table (one that is
    there but is no regular file, such as a FIFO or a dangling symlink, is refused by ``load_rules``, not passed
    over)."""
    candidate = Path(directory) / "pyproject.toml"
    if not os.path.lexists(candidate):
        return None
    return load_rules(candidate, required=False, what=PROJECT_INPUT, **defaults)
