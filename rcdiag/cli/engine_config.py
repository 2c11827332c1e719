"""The engine flags every engine command shares, turned into a ``CorrectionConfig``: preset first, flags on top,
and a flag that would change nothing (a threshold without its option) refused before any file is read."""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rcdiag.runtime.errors import ConfigError
from rcdiag.settings.correction import CorrectionConfig, ThresholdError, preset
from rcdiag.settings.versions import verl_version

FIELD_FLAGS = {
    "rollout_is": "--is",
    "rollout_is_threshold": "--is-threshold",
    "rollout_is_batch_normalize": "--batch-normalize",
    "rollout_rs": "--rs",
    "rollout_rs_threshold": "--rs-threshold",
}
"""verl's field -> the flag that sets it: the library's messages name fields, the command line's name flags."""


def flag_names(message: str, flags: Mapping[str, str]) -> str:
    """``message`` with each field of ``flags`` named by its flag (whole words: ``rollout_rs`` is not the start of
    ``rollout_rs_threshold``)."""
    if not flags:
        return message
    fields = "|".join(sorted(map(re.escape, flags), key=len, reverse=True))
    return re.sub(rf"\b({fields})\b", lambda match: flags[match.group(1)], message)


@contextmanager
def named_by_flags(flags: Mapping[str, str]) -> Iterator[None]:
    """A ``ConfigError`` raised in the block, its fields named by their flags (``flag_names``), and a threshold's
    followed by the forms it accepts (``ThresholdError.forms``)."""
    try:
        yield
    except ConfigError as exc:
        forms = f" {exc.forms}" if isinstance(exc, ThresholdError) else ""
        raise ConfigError(flag_names(str(exc), flags) + forms) from None


class ISLevel(str, enum.Enum):
    """``--is`` choices."""

    token = "token"
    sequence = "sequence"
    none = "none"


@dataclass(frozen=True)
class EngineFlags:
    """The values of ``--is``, ``--is-threshold``, ``--rs``, ``--rs-threshold``, ``--batch-normalize`` and
    ``--preset`` and ``--verl-version`` (``None``: not given)."""

    is_level: ISLevel | None = None
    is_threshold: str | None = None
    rs: str | None = None
    rs_threshold: str | None = None
    batch_normalize: bool | None = None
    preset: str | None = None
    verl_version: str | None = None

    def config(self, base: CorrectionConfig | None = None) -> CorrectionConfig:
        """The configuration the flags describe, on top of ``--preset``, else ``base`` (a rules file's
        ``[engine]``), else verl's default; resolved here, so that every configuration error comes first."""
        given = self.verl_version if self.verl_version is not None or base is None else base.verl_version
        version = verl_version(given)
        config = preset(self.preset, version.name) if self.preset else base or CorrectionConfig()
        changes: dict[str, Any] = {"verl_version": version.name}
        if self.is_level is not None:
            changes["rollout_is"] = None if self.is_level is ISLevel.none else self.is_level.value
        if self.is_threshold is not None:
            changes["rollout_is_threshold"] = self.is_threshold
        if self.rs is not None:
            changes["rollout_rs"] = None if self.rs.strip().lower() == "none" else self.rs
        if self.rs_threshold is not None:
            changes["rollout_rs_threshold"] = self.rs_threshold
        if self.batch_normalize is not None:
            changes["rollout_is_batch_normalize"] = self.batch_normalize
        config = config.replace(**changes)
        self._refuse_unused(config)
        with named_by_flags(self._flags(config)):
            config.resolve()
        return config

    def for_framework(self, chosen: Any, config: CorrectionConfig) -> CorrectionConfig:
        """``config`` under ``--as NAME`` (``chosen``): ``--as verl``'s options put on top of it (verl's refusals,
        R2 with bypass mode among them, raised now); another framework takes its own options, so a flag that
        configures verl's correction is refused rather than read as that framework's."""
        if chosen.name == "verl":
            return chosen.settings.config(config)
        given = [flag for flag, value in self._correction_flags().items() if value is not None]
        if given:
            raise ConfigError(
                f"{', '.join(given)} {'configures' if len(given) == 1 else 'configure'} verl's correction; under "
                f"--as {chosen.name} give "
                f"{chosen.framework.title}'s own options with --as-option KEY=VALUE (`rcdiag presets --as "
                f"{chosen.name}` lists them)"
            )
        return config

    def _correction_flags(self) -> dict[str, Any]:
        return {
            "--is": self.is_level,
            "--is-threshold": self.is_threshold,
            "--rs": self.rs,
            "--rs-threshold": self.rs_threshold,
            "--batch-normalize": self.batch_normalize,
            "--preset": self.preset,
        }

    def _flags(self, config: CorrectionConfig) -> dict[str, str]:
        """The fields an error names by their flag: those a flag set, and those left unset (a flag sets them); a
        value from ``--preset`` or a rules file keeps its field's name, which is where it was written."""
        given = {
            "rollout_is": self.is_level,
            "rollout_is_threshold": self.is_threshold,
            "rollout_is_batch_normalize": self.batch_normalize,
            "rollout_rs": self.rs,
            "rollout_rs_threshold": self.rs_threshold,
        }
        return {
            field: flag
            for field, flag in FIELD_FLAGS.items()
            if given[field] is not None or getattr(config, field) is None
        }

    def _refuse_unused(self, config: CorrectionConfig) -> None:
        """verl ignores an IS threshold or batch normalisation while IS is off, and an RS threshold while RS is
        off; a flag the user typed must not be ignored silently."""
        if config.rollout_is is None:
            given = (("--is-threshold", self.is_threshold), ("--batch-normalize", self.batch_normalize or None))
            for flag, value in given:
                if value is not None:
                    shown = flag if isinstance(value, bool) else f"{flag} {value}"
                    raise ConfigError(
                        f"{shown} has no effect while IS is off: add --is token or --is sequence (or a preset that "
                        "sets rollout_is), or leave it out."
                    )
        if config.rollout_rs is None and self.rs_threshold is not None:
            raise ConfigError(
                f"--rs-threshold {self.rs_threshold} has no effect while RS is off: add --rs OPTIONS (or a preset "
                "that sets rollout_rs), or leave it out."
            )
