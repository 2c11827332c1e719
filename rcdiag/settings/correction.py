"""verl's rollout-correction configuration: fields, presets and threshold parsing (verl v0.7.1 to v0.9.1).

``CorrectionConfig`` mirrors ``verl.trainer.config.algorithm.RolloutCorrectionConfig`` field for field, but its
defaults are verl's YAML defaults (metrics only), which is what a run without an explicit
``rollout_correction`` block gets. ``resolve()`` parses the thresholds exactly as verl's helper does and raises
``ConfigError`` with verl's own message where verl raises ``ValueError``/``TypeError``. Where verl crashes with
an unhelpful exception (``ZeroDivisionError`` for a bare k1 threshold of ``"0"``, a raw float-conversion error
for a non-numeric bare k1 threshold), rcdiag raises a clear ``ConfigError`` that says so.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from rcdiag.core.limits import SAFETY_BOUND  # noqa: F401 (verl's clamp, named here beside the options it bounds)
from rcdiag.runtime.errors import ConfigError
from rcdiag.runtime.fields import FieldError, checked
from rcdiag.settings.constants import ROUTER_REPLAY_KEY
from rcdiag.settings.versions import DEFAULT_VERSION, VerlVersion, needs, verl_version

ISLevel = Literal["token", "sequence"]
IS_LEVELS: tuple[ISLevel, ...] = ("token", "sequence")
RS_OPTIONS = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)
"""The 11 options of ``SUPPORTED_ROLLOUT_RS_OPTIONS`` (there is no ``seq_max_k1``)."""

ThresholdSpec = float | int | str


@dataclass(frozen=True)
class CorrectionConfig:
    """The seven fields of verl's ``algorithm.rollout_correction`` block.

    Defaults are those of verl's YAML (``rollout_is: null``, ``rollout_rs: null``): the 13 off-policy metrics
    only. Note that verl's *dataclass* default is ``rollout_is="sequence"``; use ``preset(...)`` or pass
    fields explicitly to get anything else.
    """

    rollout_is: str | None = None
    rollout_is_threshold: ThresholdSpec | None = 2.0
    rollout_is_batch_normalize: bool = False
    rollout_rs: str | None = None
    rollout_rs_threshold: ThresholdSpec | None = None
    bypass_mode: bool = False
    loss_type: str = "ppo_clip"
    verl_version: str = DEFAULT_VERSION
    """rcdiag's, not verl's: which verl release's semantics to reproduce (``rcdiag.settings.versions``)."""

    def __post_init__(self) -> None:
        """Refuse a field of the wrong type (a TOML ``bypass_mode = "yes"``, a state's ``loss_type = 5``): verl's
        dataclass would take it and act on its truthiness. The thresholds are checked by ``resolve``, with verl's
        messages."""
        try:
            for name in _TYPED_FIELDS:
                checked(getattr(self, name), _FIELD_TYPES[name], name)
        except FieldError as exc:
            raise ConfigError(str(exc)) from None

    def replace(self, **changes: Any) -> CorrectionConfig:
        """Return a copy with some fields changed (CLI flags on top of a preset)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict with verl's field names, for reports."""
        return dataclasses.asdict(self)

    def resolve(self) -> ResolvedConfig:
        """Parse and validate the thresholds; raise ``ConfigError`` where verl would raise."""
        return _resolve(self)


_TYPED_FIELDS = ("rollout_is", "rollout_is_batch_normalize", "rollout_rs", "bypass_mode", "loss_type", "verl_version")
_FIELD_TYPES = typing.get_type_hints(CorrectionConfig)


@dataclass(frozen=True)
class ISSpec:
    """Resolved importance-sampling settings."""

    level: ISLevel
    upper: float
    lower: float | None
    """IcePop lower bound; ``None`` means truncated IS (TIS)."""
    batch_normalize: bool

    @property
    def icepop(self) -> bool:
        """IcePop (weights outside [lower, upper] are zeroed) rather than TIS (weights clamped at upper)."""
        return self.lower is not None

    @property
    def metric_lower(self) -> float:
        """The lower bound used by the ``*_fraction_low`` metrics: ``lower`` for IcePop, ``1/upper`` for TIS."""
        return self.lower if self.lower is not None else 1.0 / self.upper


Estimator = Literal["k1", "k2", "k3"]
"""verl's per-token statistics an RS option thresholds: k1 = -d, k2 = d^2/2, k3 = e^d - 1 - d."""


@dataclass(frozen=True)
class RSOption:
    """One resolved rejection-sampling option, e.g. ``seq_mean_k1`` with bounds ``[0.999, 1.001]``."""

    name: str
    agg: Literal["token", "sum", "mean", "max"]
    estimator: Estimator
    upper: float
    lower: float | None
    """Ratio lower bound, k1 options only."""

    @property
    def level(self) -> Literal["token", "sequence"]:
        """Token options decide per token; the others decide per sequence."""
        return "token" if self.agg == "token" else "sequence"

    @property
    def is_k1(self) -> bool:
        """k1 options are two-sided and compared in log space."""
        return self.estimator == "k1"

    @property
    def thr_hi(self) -> float:
        """Upper bound on the statistic: ``log(upper)`` for k1, ``upper`` for k2/k3."""
        return math.log(self.upper) if self.is_k1 else self.upper

    @property
    def thr_lo(self) -> float:
        """Lower bound on the statistic: ``log(lower)`` for k1; 0 for k2/k3 (used only as the std clamp floor)."""
        return math.log(self.lower) if self.is_k1 and self.lower is not None else 0.0


@dataclass(frozen=True)
class ResolvedConfig:
    """A validated configuration: what the engine computes, and the record a report carries (``Report.config``):
    the fields as given and what verl's parser makes of them, resolved once where the report is built."""

    config: CorrectionConfig
    is_spec: ISSpec | None
    rs_options: tuple[RSOption, ...]
    version: VerlVersion

    def to_dict(self) -> dict[str, Any]:
        """The fields as given (verl's names), for reports and state files: the form the state reader reads back."""
        return self.config.to_dict()

    def rs_option(self, name: str) -> RSOption:
        """The resolved RS option ``name`` (``KeyError`` if this configuration does not run it)."""
        for option in self.rs_options:
            if option.name == name:
                return option
        raise KeyError(name)

    def same_computation(self, other: ResolvedConfig) -> bool:
        """Whether two configurations compute the same metrics (``2`` and ``"2.0"`` are the same threshold, and
        verl 0.9.0 and 0.9.1 the same code)."""
        mine, theirs = self.config, other.config
        return (self.is_spec, self.rs_options, mine.bypass_mode, mine.loss_type, self.version.semantics) == (
            other.is_spec,
            other.rs_options,
            theirs.bypass_mode,
            theirs.loss_type,
            other.version.semantics,
        )


# --------------------------------------------------------------------------------------------------- parsing


def parse_is_threshold(spec: Any) -> tuple[float, float | None]:
    """``rollout_is_threshold`` -> ``(upper, lower or None)``, exactly as verl's ``_parse_rollout_is_threshold``.

    A number or a float-like string is TIS; ``"lower_upper"`` (split on the first ``_``) is IcePop.
    """
    if isinstance(spec, bool):
        raise ConfigError(
            "rollout_is_threshold must be specified as a float or a string threshold specification, not a boolean."
        )
    lower: float | None
    if isinstance(spec, int | float):
        upper, lower = float(spec), None
    elif isinstance(spec, str):
        text = spec.strip()
        if not text:
            raise ConfigError("rollout_is_threshold must not be an empty string.")
        try:
            if "_" in text:
                lower_text, upper_text = text.split("_", 1)
                lower, upper = float(lower_text), float(upper_text)
            else:
                upper, lower = float(text), None
        except ValueError:
            raise ConfigError(f"Invalid rollout_is_threshold '{spec}'.") from None
    else:
        raise ConfigError("rollout_is_threshold must be a float or a string threshold specification.")
    if upper <= 0:
        raise ConfigError(f"rollout_is_threshold upper bound must be positive, got {upper}.")
    if lower is not None:
        if lower <= 0:
            raise ConfigError(f"rollout_is_threshold lower bound must be positive, got {lower}.")
        if lower > upper:
            raise ConfigError("rollout_is_threshold lower bound must be <= upper bound.")
    return upper, lower


def parse_rs_options(rollout_rs: Any) -> list[str]:
    """Split, strip, validate and de-duplicate (first occurrence wins) a ``rollout_rs`` string."""
    if not isinstance(rollout_rs, str):
        raise ConfigError("rollout_rs must be a non-empty string (comma separated for multiple options).")
    parts = [part.strip() for part in rollout_rs.split(",") if part.strip()]
    if not parts:
        raise ConfigError("rollout_rs must contain at least one valid option.")
    options: list[str] = []
    for option in parts:
        if option not in RS_OPTIONS:
            raise ConfigError(f"Invalid rollout_rs option: {option}. Must be one of {sorted(RS_OPTIONS)}.")
        if option not in options:
            options.append(option)
    return options


def parse_rs_thresholds(
    options: list[str], spec: Any, *, check_band_order: bool = True
) -> dict[str, tuple[float | None, float]]:
    """Per-option ``(lower, upper)`` from ``rollout_rs_threshold``, as verl's ``_parse_rollout_rs_thresholds``.

    One spec is broadcast to every option; otherwise there must be one per (de-duplicated) option. A bare
    number ``u`` for a k1 option means ``[1/u, u]``.
    """
    if spec is None:
        raise ConfigError("rollout_rs_threshold must be provided for rejection sampling.")
    if isinstance(spec, int | float):
        specs = [str(spec)]
    elif isinstance(spec, str):
        specs = [part.strip() for part in spec.split(",") if part.strip()]
    else:
        raise ConfigError("rollout_rs_threshold must be a string or numeric value specifying per-option thresholds.")
    if not specs:
        raise ConfigError("rollout_rs_threshold must contain at least one threshold value.")
    if len(specs) not in (1, len(options)):
        raise ConfigError(
            "rollout_rs_threshold expects either one threshold shared by all options or exactly "
            f"{len(options)} thresholds to match the provided rollout_rs options."
        )
    if len(specs) == 1:
        specs = specs * len(options)
    return {
        option: _parse_one_rs_threshold(option, text, check_band_order)
        for option, text in zip(options, specs, strict=True)
    }


class ThresholdError(ConfigError):
    """A threshold verl refuses: the message is verl's own text (``resolve`` raises what verl raises), and
    ``forms`` the forms it accepts, which the command line appends (``rcdiag.cli.engine_config``)."""

    def __init__(self, message: str, forms: str) -> None:
        super().__init__(message)
        self.forms = forms


IS_FORMS = (
    "An IS threshold is U (TIS: weights truncated at U, e.g. 2.0) or L_U (IcePop: weights outside [L, U] zeroed, "
    "e.g. 0.5_5.0)."
)
"""The accepted forms of ``rollout_is_threshold``: the ``forms`` of each of its errors."""
K1_FORMS = "U (the ratio band [1/U, U], e.g. 2.0) or L_U (e.g. 0.5_2.0)"
UPPER_FORMS = "an upper bound U (e.g. 0.01; no '_')"


def rs_forms(options: object) -> str:
    """The accepted forms of ``rollout_rs_threshold`` for ``options`` (a list, or verl's comma-separated text; any
    other value: every form): the ``forms`` of each of its errors."""
    try:
        names = parse_rs_options(options) if not isinstance(options, list) else options
    except ConfigError:
        names = list(RS_OPTIONS)
    k1 = [name for name in names if name.endswith("k1")]
    upper = [name for name in names if not name.endswith("k1")]
    forms = [f"{', '.join(group)}: {text}" for group, text in ((k1, K1_FORMS), (upper, UPPER_FORMS)) if group]
    each = "; one threshold for every option, or one per option separated by commas" if len(names) > 1 else ""
    return f"An RS threshold for {'; for '.join(forms)}{each}."


def _band_hint(options: list[str], spec: Any) -> str:
    """For ``0.5,2.0`` or ``[0.5, 2.0]`` meant as one k1 band: how a band is written."""
    if not isinstance(spec, str) or not any(option.endswith("k1") for option in options):
        return ""
    parts = [part.strip() for part in spec.strip().strip("[]()").split(",")]
    try:
        lower, upper = (float(part) for part in parts)
    except ValueError:
        return ""
    return (
        f" A k1 band is written lower_upper with an underscore: '{parts[0]}_{parts[1]}' "
        f"(a comma separates one threshold per option). It keeps the ratio in [{1 / upper:g}, {1 / lower:g}]."
        if lower > 0 and upper > 0
        else ""
    )


def _parse_one_rs_threshold(option: str, spec: str, check_band_order: bool) -> tuple[float | None, float]:
    if option.endswith("k1"):
        if "_" in spec:
            lower_text, upper_text = spec.split("_", 1)
        else:
            upper_text = spec
            try:
                upper_value = float(upper_text)
            except ValueError:
                raise ConfigError(
                    f"Invalid numeric threshold '{spec}' for option '{option}'. (verl v0.9.0 crashes here "
                    f"with a bare ValueError: could not convert string to float: '{spec}')"
                ) from None
            if upper_value == 0:
                raise ConfigError(
                    f"Thresholds for option '{option}' must be positive, got {spec}. A bare k1 threshold u "
                    "means [1/u, u] (verl v0.9.0 crashes here with ZeroDivisionError)."
                )
            lower_text = str(1.0 / upper_value)
        try:
            lower, upper = float(lower_text), float(upper_text)
        except ValueError:
            raise ConfigError(f"Invalid numeric threshold '{spec}' for option '{option}'.") from None
        if lower <= 0 or upper <= 0:
            raise ConfigError(f"Thresholds for option '{option}' must be positive, got {spec}.")
        if lower > upper and check_band_order:  # verl <= 0.8.0 accepts it, and then rejects every token
            raise ConfigError(f"Thresholds for option '{option}' must be lower <= upper, got {spec}.")
        return lower, upper
    if "_" in spec:
        raise ConfigError(
            f"rollout_rs_threshold for option '{option}' must provide a single upper bound without '_'. "
            f"Received '{spec}'."
        )
    try:
        upper = float(spec)
    except ValueError:
        raise ConfigError(f"Invalid numeric threshold '{spec}' for option '{option}'.") from None
    if upper <= 0:
        raise ConfigError(f"Threshold for option '{option}' must be positive, got {spec}.")
    return None, upper


def _resolve(config: CorrectionConfig) -> ResolvedConfig:
    version = verl_version(config.verl_version)
    is_spec: ISSpec | None = None
    # verl runs IS only when both the level and the threshold are set; a None threshold silently skips IS.
    if config.rollout_is is not None and config.rollout_is_threshold is not None:
        if config.rollout_is not in IS_LEVELS:
            raise ConfigError(f"Invalid rollout_is: {config.rollout_is}. Must be one of {{'token', 'sequence'}}.")
        try:
            upper, lower = parse_is_threshold(config.rollout_is_threshold)
        except ConfigError as exc:
            raise ThresholdError(str(exc), IS_FORMS) from None
        if lower is not None:
            needs(version, "icepop", f"rollout_is_threshold '{config.rollout_is_threshold}' (IcePop, lower_upper)")
        is_spec = ISSpec(config.rollout_is, upper, lower, bool(config.rollout_is_batch_normalize))
    rs_options: list[RSOption] = []
    if config.rollout_rs is not None:
        if config.rollout_rs_threshold is None:
            raise ThresholdError(
                "rollout_rs_threshold must be explicitly provided when rollout_rs is enabled. "
                "Set rollout_rs_threshold to the desired threshold value.",
                rs_forms(config.rollout_rs),
            )
        names = parse_rs_options(config.rollout_rs)
        try:
            bounds = parse_rs_thresholds(
                names, config.rollout_rs_threshold, check_band_order=version.checks_k1_band_order
            )
        except ConfigError as exc:
            hint = _band_hint(names, config.rollout_rs_threshold)
            raise ConfigError(f"{exc}{hint}") if hint else ThresholdError(str(exc), rs_forms(names)) from None
        for name in names:
            agg, estimator = name.rsplit("_", 1)
            lower, upper = bounds[name]
            rs_options.append(
                RSOption(
                    name=name,
                    agg="token" if agg == "token" else agg.removeprefix("seq_"),  # type: ignore[arg-type]
                    estimator=estimator,  # type: ignore[arg-type]
                    upper=upper,
                    lower=lower,
                )
            )
    if config.bypass_mode and config.loss_type not in ("ppo_clip", "reinforce"):
        raise ConfigError(f"Invalid loss_type: {config.loss_type}. Must be 'reinforce' or 'ppo_clip'.")
    return ResolvedConfig(config=config, is_spec=is_spec, rs_options=tuple(rs_options), version=version)


ROUTER_REPLAY_R2_BYPASS = (
    "router_replay.mode='R2' requires algorithm.rollout_correction.bypass_mode=False: "
    "R2 records routes while recomputing actor old_log_probs, but bypass mode skips that forward."
)
"""verl 0.9.1's message (``verl/utils/config.py``, ``_validate_router_replay_config``)."""


def router_replay_mode(metadata: Mapping[str, Any]) -> str:
    """The router replay mode a dump's metadata records (``disabled`` when it records none)."""
    mode = metadata.get(ROUTER_REPLAY_KEY)
    return mode if isinstance(mode, str) else "disabled"


def refuse_router_replay(mode: str, bypass_mode: bool, version: str | None = None) -> None:
    """Refuse, as verl ``version`` does (0.9.1 on), the actor's MoE router replay in mode ``R2`` together with
    ``bypass_mode``: R2 records routes in the forward that recomputes ``old_log_probs``, which bypass mode skips.
    Every configuration rcdiag reads or prescribes passes through here (``rcdiag.frameworks.verl``)."""
    if mode == "R2" and bypass_mode and verl_version(version).refuses_r2_bypass:
        raise ConfigError(ROUTER_REPLAY_R2_BYPASS)


# --------------------------------------------------------------------------------------------------- presets

_GEO = "0.999_1.001"


def _preset(**fields: Any) -> Callable[..., CorrectionConfig]:
    def build() -> CorrectionConfig:
        return CorrectionConfig(**fields)

    return build


PRESETS: dict[str, Callable[[], CorrectionConfig]] = {
    "decoupled_token_is": _preset(rollout_is="token"),
    "decoupled_seq_is": _preset(rollout_is="sequence"),
    "decoupled_token_icepop": _preset(rollout_is="token", rollout_is_threshold="0.5_5.0"),
    "decoupled_seq_is_rs": _preset(rollout_is="sequence", rollout_rs="seq_sum_k1", rollout_rs_threshold="0.5_2.0"),
    "decoupled_geo_rs": _preset(rollout_rs="seq_mean_k1", rollout_rs_threshold=_GEO),
    "decoupled_geo_rs_seq_tis": _preset(rollout_is="sequence", rollout_rs="seq_mean_k1", rollout_rs_threshold=_GEO),
    "decoupled_geo_rs_token_tis": _preset(rollout_is="token", rollout_rs="seq_mean_k1", rollout_rs_threshold=_GEO),
    "decoupled_k3_rs": _preset(rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01),
    "decoupled_k3_rs_seq_tis": _preset(rollout_is="sequence", rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01),
    "decoupled_k3_rs_token_tis": _preset(rollout_is="token", rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01),
    "bypass_ppo_clip": _preset(bypass_mode=True),
    "bypass_ppo_clip_geo_rs": _preset(rollout_rs="seq_mean_k1", rollout_rs_threshold=_GEO, bypass_mode=True),
    "bypass_ppo_clip_k3_rs": _preset(rollout_rs="seq_mean_k3", rollout_rs_threshold=0.01, bypass_mode=True),
    "bypass_pg_is": _preset(rollout_is="sequence", bypass_mode=True, loss_type="reinforce"),
    "bypass_pg_token_icepop": _preset(
        rollout_is="token", rollout_is_threshold="0.5_5.0", bypass_mode=True, loss_type="reinforce"
    ),
    "bypass_pg_geo_rs": _preset(
        rollout_rs="seq_mean_k1", rollout_rs_threshold=_GEO, bypass_mode=True, loss_type="reinforce"
    ),
    "bypass_pg_geo_rs_seq_tis": _preset(
        rollout_is="sequence",
        rollout_rs="seq_mean_k1",
        rollout_rs_threshold=_GEO,
        bypass_mode=True,
        loss_type="reinforce",
    ),
    "bypass_pg_geo_rs_token_tis": _preset(
        rollout_is="token",
        rollout_rs="seq_mean_k1",
        rollout_rs_threshold=_GEO,
        bypass_mode=True,
        loss_type="reinforce",
    ),
    "disabled": _preset(),
}
"""verl's 19 ``RolloutCorrectionConfig`` classmethod presets (v0.8.0 on; v0.7.1 lacks the two IcePop ones)."""


PRESET_FEATURES = {"decoupled_token_icepop": "icepop", "bypass_pg_token_icepop": "icepop"}
"""Presets a release may lack: the ``rcdiag.settings.versions`` feature they came with (the others exist since
0.7.1)."""


def preset(name: str, version: str | None = None) -> CorrectionConfig:
    """The configuration of one of verl's presets, by its classmethod name (e.g. ``"decoupled_geo_rs"``), as
    verl ``version`` (default: the latest) defines it."""
    try:
        build = PRESETS[name]
    except KeyError:
        raise ConfigError(f"Unknown preset '{name}'. Known presets: {', '.join(PRESETS)}.") from None
    release = verl_version(version)
    if name in PRESET_FEATURES:
        needs(release, PRESET_FEATURES[name], f"The preset {name}")
    return build().replace(verl_version=release.name)


def rollout_correction_yaml(fields: Mapping[str, Any]) -> str:
    """``algorithm.rollout_correction`` fields as lines to paste into verl's config: ``None`` is ``null``; a string
    holding ``_`` that is not a name (a band ``"0.5_2.0"``) is quoted, so YAML reads it as the string verl parses,
    while an option name (``token_k1``) stays bare."""

    def value(v: Any) -> str:
        text = "null" if v is None else str(v)
        return f'"{text}"' if isinstance(v, str) and "_" in text and not text.isidentifier() else text

    pasted = (f"    {key}: {value(v)}" for key, v in fields.items())
    return "\n".join(["algorithm:", "  rollout_correction:", *pasted]) + "\n"
