"""The verl releases rcdiag reproduces, and what each one logged differently (reference sections 0.1, 11, 12).

Users compare rcdiag with the W&B panels of the verl they ran. The ``rollout_corr/*`` formulas changed between
releases; each change is one flag here, read by the one implementation of that formula (a variation point, never
a copy of an accumulator). Imports nothing heavy: the CLI's ``--help`` lists the versions.
"""

from __future__ import annotations

from dataclasses import dataclass

from rcdiag.runtime.errors import ConfigError


@dataclass(frozen=True)
class VerlVersion:
    """One verl release and the semantics of its rollout-correction code."""

    name: str
    is_metrics_on_raw_weights: bool
    """<= 0.7.1: IS mean/max/min/seq_* describe the untruncated (safety-bounded) weights; std and ESS clamp them
    to [1/U, U]; truncation comes after the metrics."""
    seq_fraction_on_applied_weights: bool
    """0.8.0: ``rollout_is_seq_fraction_high/low`` compare the per-row mean of the *applied* weights (so the high
    fraction is 0 under TIS); 0.9.0 went back to the raw per-row mean (PR #6806)."""
    icepop: bool
    """>= 0.8.0: ``rollout_is_threshold`` may be ``"lower_upper"`` (IcePop), with ``rollout_is_oob_ratio``."""
    checks_k1_band_order: bool
    """>= 0.9.0: a k1 RS band ``"L_U"`` with L > U is refused; earlier releases accept it and reject every token."""
    legacy_actor: bool
    """<= 0.7.1: ``dp_actor``/``megatron_actor`` computed the off-policy metrics per micro-batch on the RS-modified
    mask (and asserted a valid token in each); metrics were reduced over all micro-batches by key name."""
    debug_metrics_on_empty: bool
    """>= 0.8.0: ``calculate_debug_metrics`` (the ``training/rollout_*probs*`` keys) gives
    ``rollout_probs_diff_valid`` 0 and NaN for a batch without a valid token; 0.7.1 raises ``RuntimeError``
    (``torch.max`` of no element)."""
    refuses_r2_bypass: bool = False
    """>= 0.9.1: ``validate_config`` refuses ``router_replay.mode: R2`` with ``rollout_correction.bypass_mode: true``
    (``verl/utils/config.py``, ``_validate_router_replay_config``)."""
    same_code_as: str | None = None
    """A release whose rollout-correction code is byte-identical (0.9.1 = 0.9.0)."""

    @property
    def semantics(self) -> str:
        """The release whose code this one runs: equal semantics compare and merge as equal."""
        return self.same_code_as or self.name


VERSIONS: dict[str, VerlVersion] = {
    v.name: v
    for v in (
        VerlVersion("0.7.1", True, False, False, False, True, False),
        VerlVersion("0.8.0", False, True, True, False, False, True),
        VerlVersion("0.9.0", False, False, True, True, False, True),
        VerlVersion("0.9.1", False, False, True, True, False, True, refuses_r2_bypass=True, same_code_as="0.9.0"),
    )
}
"""Oldest first. v0.6.x/v0.7.0 had another RS API (token/sequence/geometric plus a veto) and are not reproduced."""
DEFAULT_VERSION = "0.9.1"
"""The latest release."""


def verl_version(name: str | None) -> VerlVersion:
    """The release called ``name`` (``None``: the default); an unknown one is a ``ConfigError`` listing them."""
    key = DEFAULT_VERSION if name is None else str(name).strip().removeprefix("v")
    try:
        return VERSIONS[key]
    except KeyError:
        raise ConfigError(f"Unknown verl version '{name}'. rcdiag reproduces: {', '.join(VERSIONS)}.") from None


def first_with(feature: str) -> str:
    """The first release (oldest first) whose ``feature`` flag is set."""
    return next(v.name for v in VERSIONS.values() if getattr(v, feature))


def needs(version: VerlVersion, feature: str, what: str) -> None:
    """Refuse ``what`` under a release that lacks ``feature``, naming the first release that has it."""
    if not getattr(version, feature):
        raise ConfigError(f"{what} needs verl {first_with(feature)} or later; verl {version.name} does not have it.")
