"""``framework_drops_gradient``: under ``--as NAME``, whether NAME's own correction takes away most of the gradient on
this dump, judged from rcdiag's readings of it (``rcdiag/<name>/*``, ``framework_key``), and said in NAME's options.

Three bounds, each failing alone (every bound inclusive: the value on it holds): the mean weight on a valid token's
loss below ``WEIGHT_MEAN_MIN`` (less than half the loss's mass is left: TRL's default ``sequence_mask`` on long
rollouts), more than ``ZEROED_MAX`` of the valid tokens zeroed (a mask that drops most of the batch), or the ESS
of the weights below verl's minimum for its own IS weights (``is_ess_low``): a few tokens carry the gradient.

Judged pooled over the dump first; where the pooled readings hold, each step's own readings against the same
bounds: one bad step among several loses its gradient though the pool keeps most of it. One finding either way,
naming the steps that fail and the worst of them."""

from __future__ import annotations

from collections.abc import Mapping

from rcdiag.catalogue.emit import at_steps, emit
from rcdiag.catalogue.findings import Code
from rcdiag.catalogue.metrics import finding_threshold, framework_key
from rcdiag.frameworks.base import scalar
from rcdiag.frameworks.registry import Chosen
from rcdiag.frameworks.translate import translate
from rcdiag.metrics.base import MetricValue
from rcdiag.records.report import Finding

WEIGHT_MEAN_MIN = 0.5
"""Below it the framework's weights keep less than half of the loss's mass: most of the gradient is gone."""
ZEROED_MAX = 0.5
"""Above it the framework's mask zeroes most of the valid tokens' losses."""
ESS_FLOOR = float(finding_threshold(Code.IS_ESS_LOW).limit)
"""verl's minimum ESS of its own IS weights (0.3): below it a few tokens carry most of the weight."""


def failed_bounds(weight_mean: MetricValue, zeroed: MetricValue, ess: MetricValue) -> list[str]:
    """The bounds these readings fail, in words (empty: the correction keeps most of the gradient); a reading that
    is ``None`` (no valid token, every weight 0 for the ESS) fails nothing of its own."""
    failed = []
    if weight_mean is not None and weight_mean < WEIGHT_MEAN_MIN:
        failed.append(f"weight mean {weight_mean:.3g} < {WEIGHT_MEAN_MIN:g}")
    if zeroed is not None and zeroed > ZEROED_MAX:
        failed.append(f"{zeroed:.1%} of the tokens zeroed > {ZEROED_MAX:.0%}")
    if ess is not None and ess < ESS_FLOOR:
        failed.append(f"ESS of the weights {ess:.3g} < {ESS_FLOOR:g}")
    return failed


def drops_gradient(
    chosen: Chosen, extras: Mapping[str, MetricValue], steps: Mapping[int, Mapping[str, MetricValue]] | None = None
) -> Finding | None:
    """The finding where ``chosen``'s correction, read from its pooled ``extras``, fails a bound; else, where the
    readings of some of its ``steps`` (each step's ``extras``) fail one, the finding naming those steps; ``None``
    where nothing fails."""
    stats = ("weight_mean", "zeroed_fraction", "zeroed_response_fraction", "ess")
    mean, zeroed, responses, ess = (framework_key(chosen.name, stat) for stat in stats)
    failed = failed_bounds(extras.get(mean), extras.get(zeroed), extras.get(ess))
    values_at = steps or {}
    if failed:
        where, value, at = "on this dump", extras.get(mean), None
    else:
        failing = {
            step: bounds
            for step, values in sorted(values_at.items())
            if (bounds := failed_bounds(values.get(mean), values.get(zeroed), values.get(ess)))
        }
        if not failing:
            return None
        worst = min(failing, key=lambda step: _lowest(values_at[step].get(mean)))
        failed, extras = failing[worst], values_at[worst]
        where = f"{at_steps(tuple(failing), len(values_at))} though not pooled over the dump; worst at step {worst}"
        value, at = extras.get(mean), tuple(failing)
    own = translate(chosen, chosen.name).whole.options
    setting = ", ".join(f"{key}={scalar(option)}" for key, option in own.items()) or "its defaults"
    share = extras.get(responses)
    facts = (
        f"{chosen.framework.label}'s {setting} (--as {chosen.name}) takes away most of the gradient {where}: "
        + "; ".join(failed)
        + ("" if share is None else f" ({share:.1%} of the responses have a token zeroed)")
    )
    return emit(
        Code.FRAMEWORK_DROPS_GRADIENT,
        facts,
        value=value,
        threshold=WEIGHT_MEAN_MIN,
        metric=mean,
        steps=at,
    )


def _lowest(weight_mean: MetricValue) -> float:
    """A step's weight mean as a sort key (a failing step without one last)."""
    return float("inf") if weight_mean is None else weight_mean
