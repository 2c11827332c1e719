"""What a sweep covers: the options (two IS levels, eleven RS options) and the thresholds of each.

Every threshold is a spec as written for ``rcdiag analyze`` (``2.0``, ``0.5_2.0``) and is resolved by verl's own
parsers (``rcdiag.settings.correction``), so a spec verl refuses is refused here with verl's message. The default
grids cover verl's documented typical ranges (docs/sweep.md) and every threshold a verl preset uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from rcdiag.runtime.errors import ConfigError
from rcdiag.runtime.option_checks import choice, keyword, refuse
from rcdiag.settings.correction import IS_LEVELS, RS_OPTIONS, CorrectionConfig, ISSpec, RSOption
from rcdiag.settings.versions import DEFAULT_VERSION, VerlVersion, verl_version

IS_OPTIONS = {"token": "is_token", "sequence": "is_sequence"}
"""``--is`` level -> the option name a sweep row carries."""

_K1_BANDS = (
    "0.5_2.0",
    "0.667_1.5",
    "0.8_1.25",
    "0.9_1.1",
    "0.96_1.04",
    "0.98_1.02",
    "0.99_1.01",
    "0.995_1.005",
    "0.998_1.002",
    "0.999_1.001",
)
_K23_BOUNDS = ("0.0001", "0.0003", "0.001", "0.003", "0.01", "0.03", "0.1", "0.3", "1.0", "3.0", "10.0")
DEFAULT_GRIDS: dict[str, tuple[str, ...]] = {
    "is_token": ("1.5", "2.0", "2.5", "3.0", "4.0", "5.0", "0.5_2.0", "0.5_5.0", "0.2_5.0"),
    "is_sequence": ("2.0", "3.0", "5.0", "7.5", "10.0", "0.5_2.0", "0.5_5.0", "0.1_10.0"),
    **{option: _K1_BANDS if option.endswith("k1") else _K23_BOUNDS for option in RS_OPTIONS},
}
"""Default thresholds per option: token IS 1.5-5 and sequence IS 2-10 (TIS) plus IcePop bands (left out for a
verl release without IcePop); k1 bands from ``0.5_2.0`` to ``0.999_1.001``; k2/k3 upper bounds from 1e-4 to 10."""

OPTIONS = (*IS_OPTIONS.values(), *RS_OPTIONS)


@dataclass(frozen=True)
class GridPoint:
    """One grid point: the spec as written and what verl's parser makes of it."""

    spec: str
    is_spec: ISSpec | None = None
    rs_option: RSOption | None = None

    def config(self, option: str, version: str = DEFAULT_VERSION) -> CorrectionConfig:
        """The ``rcdiag analyze`` configuration of this single option at this threshold."""
        if option.startswith("is_"):
            level = option.removeprefix("is_")
            return CorrectionConfig(rollout_is=level, rollout_is_threshold=self.spec, verl_version=version)
        return CorrectionConfig(rollout_rs=option, rollout_rs_threshold=self.spec, verl_version=version)


@dataclass(frozen=True)
class SweepGrid:
    """The options swept and each one's thresholds, in the order given."""

    options: tuple[tuple[str, tuple[GridPoint, ...]], ...]
    verl_version: str = DEFAULT_VERSION
    """The verl release whose semantics every point follows (``rcdiag.settings.versions``)."""

    def thresholds(self, option: str) -> tuple[GridPoint, ...]:
        return dict(self.options)[option]

    def specs(self) -> dict[str, list[str]]:
        """Plain form (state files, reports): option -> specs."""
        return {option: [t.spec for t in thresholds] for option, thresholds in self.options}

    @classmethod
    def from_specs(cls, specs: dict[str, list[str]], version: str = DEFAULT_VERSION) -> SweepGrid:
        options = tuple(
            (option, tuple(resolve(option, spec, version) for spec in given)) for option, given in specs.items()
        )
        return cls(options, version)


def resolve(option: str, spec: str, version: str = DEFAULT_VERSION) -> GridPoint:
    """Parse one threshold of one option with verl ``version``'s rules; ``ConfigError`` (verl's message, or the
    release that introduced the option) if verl refuses it."""
    text = spec.strip()
    if option.startswith("is_"):
        config = CorrectionConfig(
            rollout_is=option.removeprefix("is_"), rollout_is_threshold=text, verl_version=version
        )
        return GridPoint(text, is_spec=config.resolve().is_spec)
    resolved = CorrectionConfig(rollout_rs=option, rollout_rs_threshold=text, verl_version=version).resolve()
    return GridPoint(text, rs_option=resolved.rs_options[0])


_IS_LEVEL = choice(IS_LEVELS)
_RS_OPTION = choice(RS_OPTIONS)


def build_grid(
    is_levels: list[str] | None = None,
    rs_options: list[str] | None = None,
    thresholds: list[str] | None = None,
    version: str = DEFAULT_VERSION,
) -> SweepGrid:
    """The grid for ``--is``, ``--rs``, ``--thresholds`` and ``--verl-version``.

    With neither ``--is`` nor ``--rs``, every option; with one of them, only the options named. ``--thresholds``
    replaces the default grid and needs exactly one option.
    """
    release = verl_version(version)
    options = [IS_OPTIONS[_IS_LEVEL(level, keyword("is_levels"))] for level in is_levels or []]
    options += [_RS_OPTION(name, keyword("rs_options")) for name in rs_options or []]
    options = list(dict.fromkeys(options)) or list(OPTIONS)
    if thresholds is not None:
        if len(options) != 1:
            raise ConfigError(
                f"--thresholds sets the grid of one option; name exactly one with --is or --rs (got {len(options)})."
            )
        specs = [spec.strip() for spec in thresholds if spec.strip()]
        if not specs:
            raise refuse(keyword("thresholds"), "one or more threshold specs", thresholds)
        return SweepGrid.from_specs({options[0]: list(dict.fromkeys(specs))}, release.name)
    return SweepGrid.from_specs(
        {option: [s for s in DEFAULT_GRIDS[option] if _available(option, s, release)] for option in options},
        release.name,
    )


def _available(option: str, spec: str, release: VerlVersion) -> bool:
    """Whether a default threshold exists in ``release`` (IcePop IS bands came with v0.8.0)."""
    return release.icepop or not (option.startswith("is_") and "_" in spec)


def split_list(value: str | None) -> list[str] | None:
    """``"a, b"`` -> ``["a", "b"]``; ``None`` stays ``None``."""
    if value is None:
        return None
    return [part.strip() for part in value.split(",") if part.strip()]
