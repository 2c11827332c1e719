"""What a framework module declares (``Framework``), its options (``Option``) and keys (``MetricKey``), and the host
arrays its accumulators read from a block (``TokenRows``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

import numpy as np

from rcdiag.catalogue.metrics import FRAMEWORK_STATS, framework_key
from rcdiag.frameworks.correction import Correction, Form
from rcdiag.metrics.base import Accumulator, MetricValue, Reduce
from rcdiag.runtime.errors import ConfigError

if TYPE_CHECKING:
    from rcdiag.metrics.block import Block

Kind = Literal["bool", "number", "choice", "pair", "text", "block", "blocks"]


@dataclass(frozen=True)
class Option:
    """One option of a framework, keyed as its configuration spells it (dotted where it nests).

    ``kind``: ``bool`` (true/false), ``number`` (an int or float), ``choice`` (one of ``choices``), ``pair`` (two
    numbers), ``text`` (a string or a number, kept as given: verl's thresholds), ``block`` (a nested block of
    ``fields``, given whole as a JSON object, its other fields at their defaults, or one field at a time),
    ``blocks`` (a list of such blocks, given whole as a JSON list: ROLL's filters).
    ``nullable``: ``null`` is a value (a bound that is off, a block that is off)."""

    key: str
    kind: Kind
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    nullable: bool = False
    fields: tuple[Option, ...] = ()

    def field(self, name: str) -> Option | None:
        """A block's field by name."""
        return next((f for f in self.fields if f.key == name), None)

    def block_defaults(self) -> dict[str, Any]:
        """A block's fields at their defaults (what setting one field of a block that is off starts from)."""
        return {f.key: f.default for f in self.fields}

    def accepts(self) -> str:
        """What the option takes, in words."""
        text = {
            "bool": "true or false",
            "number": "a number",
            "choice": " or ".join(", ".join(self.choices).rsplit(", ", 1)),
            "pair": "two numbers [low, high]",
            "text": "a number or a string",
            "block": "a JSON object of " + ", ".join(f.key for f in self.fields),
            "blocks": "a JSON list of objects of " + ", ".join(f.key for f in self.fields),
        }[self.kind]
        return text + (" (or null)" if self.nullable else "")

    def check(self, value: Any, where: str) -> Any:
        """``value`` as this option holds it, or a ``ConfigError`` naming ``where`` (the option as given)."""
        if value is None:
            if self.nullable:
                return None
            raise ConfigError(f"{where}: takes {self.accepts()}, not null")
        if self.kind == "bool" and isinstance(value, bool):
            return value
        if self.kind == "number" and _number(value):
            return float(value)
        if self.kind == "choice" and isinstance(value, str) and value in self.choices:
            return value
        if self.kind == "text" and (isinstance(value, str) or _number(value)):
            return value
        if self.kind == "pair" and isinstance(value, list) and len(value) == 2 and all(map(_number, value)):
            return tuple(float(v) for v in value)
        if self.kind == "block" and isinstance(value, dict):
            return self._block(value, where, self.key)
        if self.kind == "blocks" and isinstance(value, list) and all(isinstance(item, dict) for item in value):
            return [self._block(item, where, f"{self.key}[{i}]") for i, item in enumerate(value)]
        raise ConfigError(f"{where}: takes {self.accepts()}, got {value!r}")

    def _block(self, value: dict[str, Any], where: str, name: str) -> dict[str, Any]:
        """One block: ``value``'s fields checked, the others at their defaults."""
        block = self.block_defaults()
        for key, item in value.items():
            field = self.field(str(key))
            if field is None:
                raise ConfigError(f"{where}: {name} has no field {key!r}; its fields: {_fields(self)}")
            block[field.key] = field.check(item, f"{where} ({name}.{key})")
        return block


def _flag(key: str, value: Any) -> str:
    """One argparse flag: a true ``store_true`` bare, a false one and ``null`` left out, a pair as two values."""
    if value is None or value is False:
        return ""
    if value is True:
        return f"--{key}"
    if isinstance(value, list | tuple):
        return f"--{key} " + " ".join(scalar(v) for v in value)
    return f"--{key} {scalar(value)}"


def _yaml(tree: Mapping[str, Any], depth: int) -> list[str]:
    lines = []
    for key, value in tree.items():
        pad = "  " * depth
        if isinstance(value, Mapping) and value:
            lines.append(f"{pad}{key}:")
            lines.extend(_yaml(value, depth + 1))
        elif isinstance(value, list | tuple) and value and all(isinstance(v, Mapping) for v in value):
            lines.append(f"{pad}{key}:")
            for item in value:  # a list of blocks: each item's first field after its dash
                block = _yaml(item, depth + 2)
                lines.extend([f"{pad}  - {block[0].lstrip()}", *block[1:]] if block else [f"{pad}  - {{}}"])
        elif isinstance(value, list | tuple):
            lines.append(f"{pad}{key}: [{', '.join(scalar(v) for v in value)}]")
        else:
            lines.append(f"{pad}{key}: {scalar(value)}")
    return lines


def _toml(tree: Mapping[str, Any], path: str = "") -> list[str]:
    """TOML: the plain values of a table, then each nested table under its dotted header."""
    lines = [f"{key} = {_toml_value(value)}" for key, value in tree.items() if not isinstance(value, Mapping)]
    for key, value in tree.items():
        if isinstance(value, Mapping):
            name = f"{path}.{key}" if path else key
            plain = [k for k, v in value.items() if not isinstance(v, Mapping)]
            lines.extend([f"[{name}]"] if plain else [])
            lines.extend(_toml(value, name))
    return lines


def _toml_value(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return scalar(value)


def scalar(value: Any) -> str:
    """A YAML scalar: null, true/false, a number as Python writes it, a string quoted unless a plain word."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value)
    return text if text.isidentifier() else f'"{text}"'


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _fields(block: Option) -> str:
    return ", ".join(f.key for f in block.fields)


@dataclass(frozen=True)
class MetricKey:
    """A key a framework logs (or, under ``rcdiag/<name>/``, rcdiag's reading of what its correction does), with
    what it means; ``when`` says when the framework logs it, if not always."""

    key: str
    reading: str
    when: str = ""


INPUT_FLAGS = {"advantages": "--advantages-col", "log_prob": "--current-col"}
"""Each optional loss input (``TokenRows.advantages``, ``TokenRows.current``) -> the flag naming its column."""


@dataclass(frozen=True)
class Needs:
    """Keys a framework logs only from loss inputs a dump may lack (``INPUT_FLAGS``): computed when the dump has
    every one of ``inputs``, else left out with a note naming the columns that would make them computable."""

    keys: tuple[str, ...]
    inputs: tuple[str, ...]

    def note(self) -> str:
        columns = " and ".join(f"'{name}' ({INPUT_FLAGS[name]} NAME)" for name in self.inputs)
        what = (
            "advantages"
            if self.inputs == ("advantages",)
            else "the current policy's log-probs" + (" and the advantages" if "advantages" in self.inputs else "")
        )
        column = "columns" if len(self.inputs) > 1 else "a column"
        return (
            f"left out: {', '.join(self.keys)} need {what}, which this dump lacks: {column} {columns} would make "
            "them computable"
        )


def needs_notes(settings: Settings, computed: Mapping[str, Any]) -> tuple[str, ...]:
    """The notes of ``settings``' ``needs`` (if it has any) whose keys are not among the ``computed`` values."""
    needs: tuple[Needs, ...] = getattr(settings, "needs", lambda: ())()
    return tuple(need.note() for need in needs if not any(key in computed for key in need.keys))


def input_constant_per_row(rows: TokenRows, values: np.ndarray) -> tuple[np.ndarray, int]:
    """Each row's value of a per-token input (0 for an empty row) and how many rows hold more than one value over
    their valid tokens (a per-completion input read per token)."""
    first = np.zeros(rows.n_rows, dtype=np.float32)
    if not rows.n_tokens:
        return first, 0
    nonempty = rows.counts > 0
    first[nonempty] = values[rows._starts]
    varies = rows.row_sum((values != np.repeat(first, rows.counts)).astype(np.float64)) > 0
    return first, int(np.count_nonzero(varies))


class Settings(Protocol):
    """A framework's resolved options: what builds the per-step accumulator. Frozen and picklable (worker
    processes and Ray tasks build their own accumulators from it)."""

    def new_metrics(self) -> Accumulator | None:
        """An empty accumulator of one step's keys; ``None`` when these settings log no key."""
        ...

    def notes(self) -> tuple[str, ...]:
        """What the report says about these settings: keys not logged and why, values that depend on how the
        framework batched (never guessed)."""
        ...

    def to_dict(self) -> dict[str, Any]:
        """Every option by its key, as resolved (the JSON's ``framework.options``)."""
        ...

    def correction(self) -> Correction:
        """What these settings do to a dump's tokens, in the shared vocabulary (``rcdiag.frameworks.correction``):
        what ``translate`` reads a setting of this framework as, and grades another's against."""
        ...


def merge_options(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Option sets as one, or ``None`` where two set one option differently (the framework applies one of them at a
    time): how most frameworks combine two forms."""
    merged: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if key in merged and merged[key] != value:
                return None
            merged[key] = value
    return merged


@dataclass(frozen=True)
class Framework:
    """One framework rcdiag reproduces: its release, options and keys, and ``settings``, which turns checked
    option values (every option present, by key) into its ``Settings``, raising what the framework raises (its own
    message) on a combination it refuses."""

    name: str
    title: str
    release: str
    source: str
    """Where the reproduced code lives in that release (``file:lines``)."""
    options: tuple[Option, ...]
    keys: tuple[MetricKey, ...]
    settings: Callable[[Mapping[str, Any], frozenset[str]], Settings]
    """Checked values of every option (defaults where not given) and the keys given (a block's field as
    ``block.field``) -> the settings."""
    prefixes: tuple[str, ...] = ()
    """Leading parts of option keys a user may leave out (verl's ``algorithm.rollout_correction.``)."""
    batching: str = ""
    """What one dump step stands for in this framework, and what its values depend on beyond the step's rows."""
    left_out: str = ""
    """The keys it logs beside these that a dump cannot give (the current policy's log-probs, advantages), never
    guessed: a note of every report computed ``--as`` it."""
    forms: tuple[Form, ...] = ()
    """How its options write a correction (``rcdiag.frameworks.correction.Form``), in its order of preference: what
    a setting of another framework is translated into."""
    combine: Callable[[Sequence[Mapping[str, Any]]], dict[str, Any] | None] = merge_options
    """Two or more forms' options as one setting, or ``None`` where it cannot hold them together."""
    spelling: Literal["yaml", "flags", "toml"] | Callable[[Mapping[str, Any]], str] = "yaml"
    """How its users write options: ``yaml`` (a config file, nested at the dots), ``toml`` (the same in TOML
    tables), ``flags`` (argparse ``--key value``), or its own function of the options (full keys)."""

    @property
    def label(self) -> str:
        """``TRL 1.16.0``."""
        return f"{self.title} {self.release}"

    def locate(self, key: str) -> tuple[Option, Option | None] | None:
        """The option ``key`` names (with or without one of ``prefixes``) and, for ``block.field``, the field."""
        for candidate in (key, *(prefix + key for prefix in self.prefixes)):
            for option in self.options:
                if candidate == option.key:
                    return option, None
                if option.kind == "block" and candidate.startswith(option.key + "."):
                    field = option.field(candidate[len(option.key) + 1 :])
                    if field is not None:
                        return option, field
        return None

    def defaults(self) -> dict[str, Any]:
        """Every option at this release's default."""
        return {option.key: option.default for option in self.options}

    def paste(self, options: Mapping[str, Any]) -> str:
        """``options`` (keys as ``--as-option`` takes them) as its users write them: YAML nested at the dots, or
        argparse flags; one option per line."""
        full: dict[str, Any] = {}
        for key, value in options.items():
            found = self.locate(key)
            if found is None:
                raise ConfigError(f"{self.label} has no option {key!r}")
            option, field = found
            full[option.key + ("." + field.key if field is not None else "")] = value
        if callable(self.spelling):
            return self.spelling(full)
        if self.spelling == "flags":
            return "\n".join(line for key, value in full.items() if (line := _flag(key, value))) + "\n"
        tree: dict[str, Any] = {}
        for key, value in full.items():
            node = tree
            *path, last = key.split(".")
            for part in path:
                node = node.setdefault(part, {})
            node[last] = value
        return "\n".join(_toml(tree) if self.spelling == "toml" else _yaml(tree, 0)) + "\n"


# ------------------------------------------------------------------------------------------------ host arrays


class TokenRows:
    """A block's valid tokens on the host, float32 as the trainers hold them, with each row's count: what the
    framework accumulators compute from (they run beside verl's, on the host, once per block)."""

    def __init__(self, block: Block) -> None:
        b = block.b
        self.old: np.ndarray = b.to_numpy(block.old)
        self.rollout: np.ndarray = b.to_numpy(block.rollout)
        self.counts: np.ndarray = b.to_numpy(block.row_len).astype(np.int64)
        self.n_tokens = int(self.old.shape[0])
        self.n_rows = int(self.counts.shape[0])
        self._raw = block.raw
        self._inputs = block.loss_inputs

    def _valid_input(self, key: str) -> np.ndarray | None:
        values = self._inputs.get(key)
        if values is None:
            return None
        mask = self._raw[2]
        return np.asarray(values if mask is None else values[np.asarray(mask, dtype=bool)], dtype=np.float32)

    @cached_property
    def advantages(self) -> np.ndarray | None:
        """Each valid token's advantage, float32 (``None``: the dump has no advantages column)."""
        return self._valid_input("advantages")

    @cached_property
    def current(self) -> np.ndarray | None:
        """The current policy's log-prob of each valid token, float32 (``None``: the dump has no such column)."""
        return self._valid_input("log_prob")

    @cached_property
    def raw_counts(self) -> np.ndarray:
        """Each row's length as stored, its masked positions included: what a framework pads its batch to the
        longest of (a padding-dependent value is computed on the step padded to its longest row)."""
        return np.asarray(self._raw[3], dtype=np.int64)

    @cached_property
    def masked(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The masked positions inside the rows as stored: ``(old, rollout, row of each)``, float32; empty when
        every stored position is valid."""
        old, rollout, mask, lengths = self._raw
        if mask is None:
            empty = np.zeros(0, dtype=np.float32)
            return empty, empty, np.zeros(0, dtype=np.int64)
        rows = np.repeat(np.arange(self.n_rows, dtype=np.int64), np.asarray(lengths, dtype=np.int64))
        off = ~np.asarray(mask, dtype=bool)
        return (
            np.asarray(old, dtype=np.float32)[off],
            np.asarray(rollout, dtype=np.float32)[off],
            rows[off],
        )

    @cached_property
    def runs(self) -> np.ndarray:
        """Each valid token's run: a maximal stretch of valid positions inside its row as stored (a masked position
        ends one), numbered from 0 in order (ROLL's segments, an agentic rollout's turns)."""
        if not self.n_tokens:
            return np.zeros(0, dtype=np.int64)
        _, _, mask, lengths = self._raw
        lengths = np.asarray(lengths, dtype=np.int64)
        valid = np.ones(int(lengths.sum()), dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
        where = np.flatnonzero(valid)
        row_start = np.zeros(valid.shape[0], dtype=bool)
        row_start[np.cumsum(lengths)[:-1][lengths[1:] > 0]] = True
        row_start[0] = True
        new = np.ones(where.shape[0], dtype=bool)
        new[1:] = (where[1:] != where[:-1] + 1) | row_start[where[1:]]
        return np.cumsum(new) - 1

    def run_mean(self, values: np.ndarray) -> np.ndarray:
        """Each valid token's run mean of ``values``, float32 (a float32 sum over the run, as torch sums it)."""
        runs = self.runs
        n = int(runs[-1]) + 1 if runs.size else 0
        sums = np.bincount(runs, weights=values.astype(np.float64), minlength=n).astype(np.float32)
        counts = np.bincount(runs, minlength=n).astype(np.float32)
        return (sums / counts)[runs].astype(np.float32)

    def row_any(self, flags: np.ndarray) -> np.ndarray:
        """Per row: does any valid token have ``flags`` set (``False`` for an empty row)."""
        return self.row_sum(flags.astype(np.float64)) > 0

    @cached_property
    def diff(self) -> np.ndarray:
        """``old - rollout`` per token, float32 (log pi_train - log pi_rollout)."""
        return self.old - self.rollout

    @cached_property
    def _starts(self) -> np.ndarray:
        starts = np.zeros(self.n_rows, dtype=np.int64)
        np.cumsum(self.counts[:-1], out=starts[1:])
        return starts[self.counts > 0]

    def row_sum(self, values: np.ndarray) -> np.ndarray:
        """Per-row float64 sums (0 for an empty row)."""
        out = np.zeros(self.n_rows)
        if self.n_tokens:
            out[self.counts > 0] = np.add.reduceat(values.astype(np.float64), self._starts)
        return out

    def row_mean(self, values: np.ndarray, keep: np.ndarray | None = None) -> np.ndarray:
        """Per-row float32 means of ``values`` over the valid tokens (those ``keep`` flags, where given), as torch's
        masked mean with its count clamped to 1: a float32 sum over a float32 count (0 for a row with none)."""
        if keep is None:
            count = np.maximum(self.counts, 1).astype(np.float32)
        else:
            count = np.maximum(self.row_sum(keep), 1.0).astype(np.float32)
            values = np.where(keep, values, np.float32(0.0))
        return self.row_sum(values).astype(np.float32) / count

    def row_max(self, values: np.ndarray, empty: float) -> np.ndarray:
        """Per-row maxima in ``values``' dtype (``empty`` for an empty row; NaN propagates, as torch's max)."""
        out = np.full(self.n_rows, empty, dtype=values.dtype)
        if self.n_tokens:
            out[self.counts > 0] = np.maximum.reduceat(values, self._starts)
        return out

    def per_token(self, per_row: np.ndarray) -> np.ndarray:
        """A per-row value repeated on each of the row's valid tokens."""
        return np.repeat(per_row, self.counts)


def exp32(values: np.ndarray) -> np.ndarray:
    """``exp`` of float32 values as torch's float32 ``exp`` gives them: the float64 exp rounded once to float32.
    numpy's own float32 ``exp`` is up to 2 ulps off and differs from torch's on ~40% of values near 0; this
    differs on ~1% by one ulp, which matters where a framework subtracts (``exp(d) - d - 1``) or bounds a ratio
    within a few ulps of 1."""
    with np.errstate(over="ignore"):
        return np.exp(np.asarray(values).astype(np.float64)).astype(np.float32)


def f32(value: float | None) -> np.float32 | None:
    """A Python bound as a float32 tensor compares with it (torch rounds a scalar to the tensor's dtype)."""
    return None if value is None else np.float32(value)


def weight_keys(name: str, title: str = "", token: str = "", zeroes: str = "") -> tuple[MetricKey, ...]:
    """rcdiag's readings of framework ``name``'s correction, in its words (``title``: the framework; ``token``: what it
    calls a valid token; ``zeroes``: what zeroes one): the same five for every framework, so one dump can be judged
    under several (and a prescription's effect measured under any)."""
    readings = {
        "weight_mean": f"rcdiag's: mean weight {title} puts on a {token}'s loss (1 = no correction)",
        "zeroed_fraction": f"rcdiag's: share of {token}s whose loss {zeroes} zeroes (the gradient lost)",
        "zeroed_response_fraction": f"rcdiag's: share of responses (every row, an empty one too, as verl counts "
        f"them) in which {zeroes} zeroes at least one {token}",
        "truncated_fraction": f"rcdiag's: share of {token}s whose weight {title}'s clamp changed (0 where it only "
        "masks)",
        "ess": f"rcdiag's: effective sample size of {title}'s weights over the {token}s, (sum w)^2 / (N sum w^2)",
    }
    return tuple(MetricKey(framework_key(name, stat), readings[stat]) for stat in FRAMEWORK_STATS)


class FrameworkMetrics(Accumulator):
    """Base of each framework's per-step accumulator: built from its settings (which must match to merge), with
    the states of rcdiag's readings of its correction (``weight_keys``)."""

    OWNER = "framework"
    NAME: ClassVar[str] = ""
    """The framework's ``--as`` name, in rcdiag's keys."""
    WEIGHT_STATES: ClassVar[dict[str, Reduce]] = {
        "tokens": "sum",
        "weight_sum": "sum",
        "zeroed": "sum",
        "weight_sq_sum": "sum",
        "truncated": "sum",
        "responses": "sum",
        "responses_zeroed": "sum",
    }
    STATES: ClassVar[dict[str, Reduce]] = WEIGHT_STATES

    def __init__(self, settings: Any) -> None:
        super().__init__()
        self.settings = settings

    def signature(self) -> tuple:
        return (type(self).__name__, self.settings)

    def add_weights(self, weight: np.ndarray, rows: TokenRows, truncated: np.ndarray | None) -> None:
        """Fold in the weight the framework puts on each valid token's loss (0 where it drops the token), of the
        block's ``rows``, and where its clamp changed the weight (``truncated``; ``None``: it clamps nothing here)."""
        weight64 = weight.astype(np.float64)
        zero = weight == 0
        self.add(
            tokens=float(weight.shape[0]),
            weight_sum=float(weight64.sum()),
            zeroed=float(np.count_nonzero(zero)),
            weight_sq_sum=float(np.square(weight64).sum()),
            truncated=0.0 if truncated is None else float(np.count_nonzero(truncated)),
            responses=float(rows.n_rows),
            responses_zeroed=float(np.count_nonzero(rows.row_any(zero))),
        )

    def add_spread(self, name: str, values: np.ndarray) -> None:
        """Fold in ``values``' count, float64 sum, least and greatest, into those of the states ``{name}_n``,
        ``{name}_sum``, ``{name}_min`` and ``{name}_max`` this accumulator declares (none: the extremes' identities,
        +-inf, which leave a min or max state as it was)."""
        spread = {
            f"{name}_n": float(values.size),
            f"{name}_sum": float(values.astype(np.float64).sum()),
            f"{name}_min": float(values.min()) if values.size else np.inf,
            f"{name}_max": float(values.max()) if values.size else -np.inf,
        }
        declared = {key: value for key, value in spread.items() if key in self.STATES}
        if not declared:  # a misspelt name would otherwise fold nothing, and its keys would read as never seen
            raise KeyError(f"{type(self).__name__} declares none of the states {', '.join(spread)}")
        self.add(**declared)

    def weight_keys(self) -> list[str]:
        return [framework_key(self.NAME, stat) for stat in FRAMEWORK_STATS]

    def weight_values(self) -> dict[str, MetricValue]:
        """rcdiag's readings (``weight_keys``): ``None`` without a valid token (the ESS also when every weight is 0)."""
        st = self.state
        n = st["tokens"]
        mean, zeroed, responses, truncated, ess = self.weight_keys()
        square = st["weight_sq_sum"]
        return {
            mean: st["weight_sum"] / n if n else None,
            zeroed: st["zeroed"] / n if n else None,
            responses: st["responses_zeroed"] / st["responses"] if st["responses"] else None,
            truncated: st["truncated"] / n if n else None,
            ess: st["weight_sum"] ** 2 / (n * square) if n and square else None,
        }
