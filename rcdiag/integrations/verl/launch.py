"""``python -m rcdiag.integrations.verl <verl's arguments> +rcdiag.dump_dir=DIR [+rcdiag.main=MODULE]``.

Takes rcdiag's own ``+rcdiag.*`` overrides out of the command line, wraps verl's rollout-correction step in this
process (``hook.install``), and runs verl's entry module (``verl.trainer.main_ppo`` unless ``+rcdiag.main`` names
another, e.g. a recipe's) as ``python -m`` would, with the rest of the arguments, so Hydra reads them as usual. verl
runs its trainer in a Ray worker; two more overrides put ``hook.setup_worker`` and the dump directory in the Ray
job's runtime environment, so every worker of the run wraps the step too. Nothing else of verl's configuration
changes.
"""

from __future__ import annotations

import importlib.util
import os
import re
import runpy
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rcdiag.integrations.verl.hook import DUMP_DIR_ENV, install
from rcdiag.io.dump_writer import PART
from rcdiag.runtime.errors import ConfigError, ExitCode

USAGE = "python -m rcdiag.integrations.verl <verl's arguments> +rcdiag.dump_dir=DIR [+rcdiag.main=MODULE]"
DEFAULT_MAIN = "verl.trainer.main_ppo"
OPTIONS = ("dump_dir", "main")
OVERRIDE = re.compile(r"^\+{0,2}rcdiag\.([^=]*)(?:=(.*))?$", re.DOTALL)
SETUP_HOOK = "rcdiag.integrations.verl.hook.setup_worker"
RUNTIME_ENV = "ray_kwargs.ray_init.runtime_env"
"""Where verl's ``run_ppo`` reads the Ray job's runtime environment from (merged with its own)."""


@dataclass(frozen=True)
class Launch:
    """What to run: verl's entry module, with ``argv`` (Hydra overrides), dumping into ``dump_dir``."""

    dump_dir: Path
    main: str
    argv: tuple[str, ...]


def parse(argv: Sequence[str]) -> Launch:
    """Split rcdiag's ``+rcdiag.KEY=VALUE`` overrides (also ``rcdiag.`` and ``++rcdiag.``) from verl's arguments,
    which keep their order; the Ray runtime-environment overrides are appended."""
    options: dict[str, str] = {}
    rest: list[str] = []
    for arg in argv:
        match = OVERRIDE.match(arg)
        if match is None:
            rest.append(arg)
            continue
        key, value = match.groups()
        if key not in OPTIONS:
            raise ConfigError(f"unknown option {arg.split('=', 1)[0]}: rcdiag takes +rcdiag.dump_dir and +rcdiag.main")
        if not value:
            raise ConfigError(f"+rcdiag.{key} needs a value: {USAGE}")
        options[key] = _unquoted(value)
    if "dump_dir" not in options:
        raise ConfigError(f"give the dump directory: {USAGE}")
    if "://" in options["dump_dir"]:
        raise ConfigError(f"+rcdiag.dump_dir must be a local directory, got {options['dump_dir']}")
    dump_dir = Path(options["dump_dir"]).expanduser().absolute()
    ray = (
        f"++{RUNTIME_ENV}.worker_process_setup_hook={SETUP_HOOK}",
        f"++{RUNTIME_ENV}.env_vars.{DUMP_DIR_ENV}={_quoted(str(dump_dir))}",
    )
    return Launch(dump_dir, options.get("main", DEFAULT_MAIN), (*rest, *ray))


def _unquoted(value: str) -> str:
    """A Hydra-style quoted value (``'a b'``, ``"a b"``) without its quotes."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _quoted(value: str) -> str:
    """A Hydra override value that stays one string whatever it holds (spaces, ``,``, ``=``, quotes)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def run(launch: Launch) -> None:
    """Wrap verl's step here, tell Ray's workers to, and run verl's entry module as ``python -m`` would."""
    try:
        install(launch.dump_dir)
    except ImportError as error:
        raise ConfigError(f"cannot import verl's rollout-correction step ({error}); is verl installed?") from None
    try:
        found = importlib.util.find_spec(launch.main)
    except ImportError:
        found = None
    if found is None:
        raise ConfigError(f"no module named {launch.main} to run (+rcdiag.main names verl's entry module)")
    os.environ[DUMP_DIR_ENV] = str(launch.dump_dir)
    sys.argv = [launch.main, *launch.argv]
    try:
        runpy.run_module(launch.main, run_name="__main__", alter_sys=True)
    finally:
        print(summary(launch.dump_dir), file=sys.stderr)


def summary(directory: Path) -> str:
    """What the run dumped, or why it may have dumped nothing."""
    steps = {int(m.group(1)) for p in directory.glob("step-*.parquet") if (m := PART.match(p.name))}
    if steps:
        return f"rcdiag: dumped {len(steps)} step(s) to {directory}; read them with: rcdiag analyze {directory}"
    return (
        f"rcdiag: no step was dumped to {directory}: verl runs its rollout-correction step only with "
        "actor_rollout_ref.rollout.calculate_log_probs=true, algorithm.rollout_correction set and bypass_mode=false"
    )


def main(argv: Sequence[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    if args in (["--help"], ["-h"]):
        print(f"usage: {USAGE}\nruns verl's trainer with its rollout-correction step dumped to DIR; verl's own "
              f"options: python -m {DEFAULT_MAIN} --help; docs/dump-writer.md")  # fmt: skip
        return
    try:
        launch = parse(args)
        run(launch)
    except ConfigError as error:
        print(f"rcdiag: error: {error}", file=sys.stderr)
        raise SystemExit(ExitCode.USAGE) from None
