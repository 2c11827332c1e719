"""What one framework's setting means in another's terms (``rcdiag translate SETTING --from A --to B``; the verdict's
prescription and the sweep's recommendations under ``--as NAME``).

Both sides speak the shared vocabulary of ``rcdiag.frameworks.correction``: the source reads its settings into a
``Correction`` (``Settings.correction()``), and the target's declared ``Form``s propose option sets filled with the
source's bounds, each read back through the target's own settings (its own checks refuse what it refuses) and
graded against what the source does. A match is ``same`` (the same weight on every token), ``same_rejections``
(the same tokens or responses zeroed, the kept ones weighted otherwise: said how), ``nearest`` (the closest it has,
with every difference said) or ``none`` (nothing alike). Each part of the setting (its weight, each band) is
translated on its own, and the whole setting as one (``Translated.whole``: what to paste).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from rcdiag.frameworks.base import Framework
from rcdiag.frameworks.correction import Band, Correction, Form, Weight, family, unit_family
from rcdiag.frameworks.registry import Chosen, choose, framework, names
from rcdiag.runtime.errors import ConfigError

Match = Literal["same", "same_rejections", "nearest", "none"]
"""``same``: the same weight on every token; ``same_rejections``: the same tokens (or responses) zeroed, the kept
ones weighted otherwise (said how); ``nearest``: the closest it has; ``none``: nothing alike."""
MATCHES: tuple[Match, ...] = ("same", "same_rejections", "nearest", "none")


@dataclass(frozen=True)
class Translation:
    """One part of a setting (or the whole) in the target's terms."""

    part: str
    """The source's part, in its own words."""
    match: Match
    options: dict[str, Any] = field(default_factory=dict)
    """The target's options to give (``--as-option KEY=VALUE``); empty for ``none``."""
    meaning: str = ""
    """What the target's options do, and what differs."""

    def as_options(self) -> list[str]:
        """The options as ``KEY=VALUE`` texts (JSON values)."""
        return [f"{key}={_text(value)}" for key, value in self.options.items()]

    def to_dict(self) -> dict[str, Any]:
        return {"part": self.part, "match": self.match, "options": self.options, "meaning": self.meaning}


@dataclass(frozen=True)
class Translated:
    """A setting of ``source`` in ``target``'s terms: part by part, and as one setting of the target."""

    source: Framework
    target: Framework
    parts: tuple[Translation, ...]
    whole: Translation
    """The target's one setting nearest the whole (``none``: nothing alike)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "from": self.source.label,
            "to": self.target.label,
            "parts": [part.to_dict() for part in self.parts],
            "setting": self.whole.to_dict(),
        }


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def combined(parts: list[Translation]) -> dict[str, Any] | None:
    """Every part's options as one setting of the target, or ``None`` where two parts need different values of one
    option (the target applies one of them at a time)."""
    merged: dict[str, Any] = {}
    for part in parts:
        for key, value in part.options.items():
            if key in merged and merged[key] != value:
                return None
            merged[key] = value
    return merged


def translate(source: Chosen, to: str) -> Translated:
    """``source`` (a framework with its settings) in the terms of framework ``to``: each part and the whole. Into
    its own framework a setting is itself, whatever its forms can write."""
    target = _target(to)
    wanted = source.settings.correction()
    parts = tuple(express(part, target, source.framework.title) for part in wanted.parts())
    whole = express(wanted, target, source.framework.title, [p.options for p in parts if p.options])
    if target.name == source.framework.name and whole.match != "same":
        whole = Translation(wanted.label(), "same", source.settings.to_dict(), "the same framework and options")
    return Translated(source.framework, target, parts, whole)


def _target(to: str) -> Framework:
    if to.strip().lower() not in names():
        raise ConfigError(f"--to {to}: rcdiag translates between {', '.join(names())}")
    return framework(to)


def express(
    wanted: Correction, target: Framework, source: str = "", extra: list[dict[str, Any]] | None = None
) -> Translation:
    """``wanted`` as the target's best setting (``source``: whose it is, in the words). Every form of the target is
    filled with ``wanted``'s bounds, alone and in pairs (and ``extra``: option sets to try combined, such as each
    part's translation), read back through the target's settings and graded; the best wins, the target's own order
    of forms breaking ties."""
    best: tuple[tuple, dict[str, Any], Correction] | None = None
    for rank, (options, single) in enumerate(_candidates(wanted, target, extra or [])):
        got = _read(target, options)
        if got is None:
            continue
        score = (*_score(wanted, got, single), -rank)
        if best is None or score > best[0]:
            best = (score, options, got)
    if best is None or not _shares(wanted, best[2]):
        return Translation(wanted.label(), "none", meaning=_nothing(wanted, target))
    _, options, got = best
    match = _match(wanted, got)
    return Translation(wanted.label(), match, options, _meaning(match, wanted, got, target.title, source))


def _candidates(
    wanted: Correction, target: Framework, extra: list[dict[str, Any]]
) -> Iterator[tuple[dict[str, Any], bool]]:
    """Option sets to try, each with whether it is one form alone."""
    singles = [options for form in target.forms for options in _fill(form, wanted)]
    yield from ((options, True) for options in singles)
    if len(extra) > 1:
        merged = target.combine(extra)
        if merged is not None:
            yield merged, False
    for a, b in itertools.combinations(singles, 2):
        merged = target.combine([a, b])
        if merged is not None:
            yield merged, False
    parts = _components(wanted, target)
    if len(parts) > 2:  # one form per component (the weight, each band), for targets that hold them all at once
        for chosen in itertools.product(*parts):
            merged = target.combine(list(chosen))
            if merged is not None:
                yield merged, False


COMPONENT_CHOICES = 3
"""Forms tried per component of a correction when composing one per component (the first in the target's order)."""


def _components(wanted: Correction, target: Framework) -> list[list[dict[str, Any]]]:
    """Per component of ``wanted`` (its weight, each band), the target's options that write that component alone:
    the weight by a form of its unit (clamped, or not), a band by a form on its statistic."""
    weight = wanted.weight
    forms = [f for f in target.forms if f.unit == weight.unit and f.normalize == wanted.normalize]
    weights = [
        o for f in forms for o in _fill(f, Correction(weight)) if f.slot == ("clamp" if weight.clamped else "none")
    ]
    parts = [weights[:COMPONENT_CHOICES]] if weight.unit != "one" else []
    for band in wanted.bands:
        alone = Correction(Weight("one"), (band,))
        found = [o for f in target.forms if f.slot == "band" and f.statistic == band.statistic for o in _fill(f, alone)]
        parts.append(found[:COMPONENT_CHOICES])
    return [p for p in parts if p]


def _fill(form: Form, wanted: Correction) -> Iterator[dict[str, Any]]:
    """The form's options with each of ``wanted``'s bounds that fit its slot."""
    bounds: list[tuple[float | None, float | None]] = []
    if form.slot == "none":
        bounds.append((None, None))
    elif form.slot == "clamp":
        if wanted.weight.clamped:
            bounds.append((wanted.weight.low, wanted.weight.high))
        bounds.extend((b.low, b.high) for b in wanted.bands if family(b.statistic) == _weight_family(form.unit))
    else:
        bounds.extend((b.low, b.high) for b in wanted.bands if family(b.statistic) == family(form.statistic))
        if wanted.weight.clamped and _weight_family(wanted.weight.unit) == family(form.statistic):
            bounds.append((wanted.weight.low, wanted.weight.high))
    for low, high in dict.fromkeys(bounds):
        options = form.options(low, high)
        if options is not None:
            yield options


def _weight_family(unit: str) -> str:
    return family({"token": "ratio", "product": "product", "geomean": "geomean"}.get(unit, ""))


def _read(target: Framework, options: Mapping[str, Any]) -> Correction | None:
    """What ``options`` do in the target, read through its own settings; ``None`` where it refuses them."""
    try:
        return choose(target.name, options).settings.correction()
    except ConfigError:
        return None


def _score(wanted: Correction, got: Correction, single: bool) -> tuple:
    """How near ``got`` is to ``wanted``, compared as tuples: the same, the same bands; then band by band (exactly,
    on the same statistic, on a statistic of the same kind, of the same family), then the weight, then one form
    rather than two, a weight of the same kind, nothing extra."""

    def count(alike: Callable[[Band, Band], bool]) -> int:
        return sum(any(alike(w, g) for g in got.bands) for w in wanted.bands)

    extra = sum(not any(g.same(w) for w in wanted.bands) for g in got.bands)
    return (
        got.same(wanted),
        wanted.same_bands(got),
        count(Band.same),
        count(lambda w, g: w.statistic == g.statistic),
        count(lambda w, g: _kind(w.statistic) == _kind(g.statistic)),
        count(lambda w, g: family(w.statistic) == family(g.statistic)),
        wanted.weight.same(got.weight),
        wanted.weight.unit == got.weight.unit,
        single,
        unit_family(wanted.weight.unit) == unit_family(got.weight.unit),
        -extra,
        wanted.normalize == got.normalize,
    )


def _kind(statistic: str) -> str:
    """A statistic's kind: verl's k3 and AReaL's reversed k3 are one kind, and a ratio is its own."""
    return statistic.rsplit("_", 1)[-1].rstrip("r") if "_k" in statistic else statistic


def _shares(wanted: Correction, got: Correction) -> bool:
    """Whether ``got`` has anything of ``wanted``: a band alike, or a weight of the same kind (beyond weight 1)."""
    if wanted.other:
        return False
    if wanted.same(got):
        return True
    if any(family(w.statistic) == family(g.statistic) for w in wanted.bands for g in got.bands):
        return True
    kind = unit_family(wanted.weight.unit)
    return kind != "one" and kind == unit_family(got.weight.unit)


def _match(wanted: Correction, got: Correction) -> Match:
    if wanted.same(got):
        return "same"
    if wanted.bands and wanted.same_bands(got):
        return "same_rejections"
    return "nearest"


def _meaning(match: Match, wanted: Correction, got: Correction, target: str, source: str) -> str:
    """What the target's setting does and, unless the same, what differs from the source's."""
    source = source or "the source"
    if match == "same":
        quirks = [f"{source} {q}" for q in wanted.quirks if q not in got.quirks]
        quirks += [f"{target} {q}" for q in got.quirks if q not in wanted.quirks]
        return "; ".join(["the same weight on every token", *quirks])
    if match == "same_rejections":
        zeroed = " and ".join(sorted({"tokens" if b.scope == "token" else "responses" for b in wanted.bands}))
        return (
            f"the same {zeroed} zeroed; the kept ones weighted otherwise: {target}'s weight is "
            f"{got.weight.describe()} ({source}'s: {wanted.weight.describe()})"
        )
    return "; ".join(_differences(wanted, got, target, source))


def _differences(wanted: Correction, got: Correction, target: str, source: str) -> list[str]:
    out = []
    if not wanted.weight.same(got.weight):
        out.append(f"{target}'s weight is {got.weight.describe()} ({source}'s: {wanted.weight.describe()})")
    left = list(got.bands)
    for band in wanted.bands:
        found = next((g for g in left if band.same(g)), None)
        if found is None:
            found = next((g for g in left if family(g.statistic) == family(band.statistic)), None)
            if found is None:
                out.append(f"{target} does not zero {band.describe()}")
                continue
            out.append(f"{target} zeroes {found.describe()} ({source}: {band.describe()})")
        left.remove(found)
    out.extend(f"{target} also zeroes {extra.describe()}" for extra in left)
    if wanted.normalize != got.normalize:
        out.append(f"{target} {'does not normalise' if wanted.normalize else 'also normalises'} the weights to mean 1")
    return out or ["differs only in how it computes"]


def _nothing(wanted: Correction, target: Framework) -> str:
    return f"{target.label} has no equivalent of: {wanted.describe()}"
