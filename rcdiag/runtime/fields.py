"""Type and range checks for values read from a file (a saved state, a TOML configuration).

A file may hold anything: ``"12"`` where a count belongs, ``-5`` rows, ``0.5`` as a step, ``"no"`` as a boolean.
Every value is checked against the type and range its field declares before an object is built from it, and a
value that does not fit is a ``FieldError`` naming the field; nothing is coerced (``int("12")``, ``bool("no")``).
Dataclasses are checked against their annotations (``dataclass_from``); arrays against a dtype, a shape and, for
counts, a sign (``reals``, ``counts``).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import TYPE_CHECKING, Any

from rcdiag.runtime.printable import printable

if TYPE_CHECKING:
    import numpy as np

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
UINT64_MAX = 2**64 - 1
STEP_RANGE = (INT64_MIN, UINT64_MAX)
"""A training step is any value of an integer column (int8 to int64, uint8 to uint64): kept exact as a Python int
from the reader to the report and in state files, so its range is the union of int64's and uint64's."""


class FieldError(ValueError):
    """A value that does not fit its field's declared type or range; the message names the field."""


def shown(value: Any) -> str:
    """A value as an error shows it: its repr (shortened, control characters escaped) and its type."""
    text = printable(repr(value))
    return f"{text if len(text) <= 40 else text[:37] + '...'} ({type(value).__name__})"


def _fail(field: str, expected: str, value: Any) -> FieldError:
    return FieldError(f"{field} must be {expected}, got {shown(value)}")


def integer(value: Any, field: str, *, low: int = 0, high: int = INT64_MAX) -> int:
    """An ``int`` (never a bool, a float or a string) in ``[low, high]``: by default a count."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        expected = "a count (an integer >= 0)" if (low, high) == (0, INT64_MAX) else f"an integer in [{low}, {high}]"
        raise _fail(field, expected, value)
    return value


def step(value: Any, field: str = "step") -> int | None:
    """A training step: ``None`` or an integer of an int64 or uint64 column (``STEP_RANGE``)."""
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int) or not STEP_RANGE[0] <= value <= STEP_RANGE[1]
    ):
        raise _fail(field, "a step (an integer in int64's or uint64's range, or null)", value)
    return value


def real(value: Any, field: str, *, nonnegative: bool = False) -> float:
    """A float (an int is one too; a bool or a string is not; NaN and infinities as saved); ``nonnegative``: a
    weight or count, finite and >= 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(field, "a number", value)
    number = float(value)
    if nonnegative and not (math.isfinite(number) and number >= 0):
        raise _fail(field, "a finite number >= 0", value)
    return number


def _array(value: Any, field: str, shape: tuple[int, ...] | None, kinds: str, expected: str) -> np.ndarray:
    import numpy as np  # here: the CLI checks a configuration before it loads numpy

    if not isinstance(value, list) or any(v is True or v is False for v in value):  # numpy would take a bool as 1
        raise _fail(field, expected, value)
    try:
        array = np.asarray(value)
    except ValueError:  # ragged nesting
        raise _fail(field, expected, value) from None
    if array.size and array.dtype.kind not in kinds:
        raise FieldError(f"{field} must be {expected}, holds {array.dtype.kind!r}-kind values")
    if shape is not None and array.size != math.prod(shape):
        raise FieldError(f"{field} must hold {math.prod(shape)} values, holds {array.size}")
    return array


def reals(value: Any, field: str, shape: tuple[int, ...] | None = None, *, nonnegative: bool = False) -> np.ndarray:
    """A list of numbers as a float64 array of ``shape`` (flat in the file); ``nonnegative``: finite and >= 0."""
    array = _array(value, field, shape, "iuf", "a list of numbers").astype("float64")
    if nonnegative and array.size and not (array.min() >= 0 and array.max() < math.inf):
        raise FieldError(f"{field} must hold finite numbers >= 0 (counts), holds {array.min()}")
    return array.reshape(shape) if shape is not None else array


def counts(value: Any, field: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """A list of counts (integers >= 0) as an int64 array of ``shape``."""
    array = _array(value, field, shape, "iu", "a list of counts (integers >= 0)")
    if array.size and ((array.dtype == "uint64" and array.max() > INT64_MAX) or array.min() < 0):
        raise FieldError(f"{field} must hold counts (integers >= 0 in int64), holds {array.min()}..{array.max()}")
    array = array.astype("int64")
    return array.reshape(shape) if shape is not None else array


def checked(value: Any, annotation: Any, field: str, *, signed: bool = False) -> Any:
    """``value`` if it fits ``annotation`` (str, int, float, bool, None, unions, ``dict[K, V]``, ``list[T]``,
    ``Any``), else a ``FieldError``; an int is a count unless ``signed`` (then any value a step may take,
    ``STEP_RANGE``: steps are the signed fields of saved records)."""
    origin = typing.get_origin(annotation)
    if annotation is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in (o for o in options if o is not type(None)):
            result = _attempt(value, option, field, signed)
            if not isinstance(result, FieldError):
                return result
            errors.append(result)
        if len(errors) == 1:
            raise errors[0]
        names = " or ".join(getattr(o, "__name__", str(o)) for o in options)
        raise _fail(field, names.replace("NoneType", "null"), value)
    if origin is dict:
        key_type, value_type = typing.get_args(annotation)
        if not isinstance(value, dict):
            raise _fail(field, "a table (a JSON object)", value)
        return {
            checked(k, key_type, f"{field} key"): checked(v, value_type, f"{field}[{printable(k)!r}]", signed=signed)
            for k, v in value.items()
        }
    if origin is list:
        (item_type,) = typing.get_args(annotation)
        if not isinstance(value, list):
            raise _fail(field, "a list", value)
        return [checked(v, item_type, f"{field}[{i}]", signed=signed) for i, v in enumerate(value)]
    if annotation is bool:
        if not isinstance(value, bool):
            raise _fail(field, "true or false", value)
        return value
    if annotation is int:
        return integer(value, field, low=STEP_RANGE[0], high=STEP_RANGE[1]) if signed else integer(value, field)
    if annotation is float:
        return real(value, field)
    if annotation is str:
        if not isinstance(value, str):
            raise _fail(field, "a string", value)
        return value
    if annotation is type(None):
        if value is not None:
            raise _fail(field, "null", value)
        return None
    raise TypeError(f"rcdiag.runtime.fields cannot check {annotation!r}")  # a new annotation: a bug, found by the tests


def _attempt(value: Any, annotation: Any, field: str, signed: bool) -> Any:
    try:
        return checked(value, annotation, field, signed=signed)
    except FieldError as exc:
        return exc


def check_dataclass(instance: Any, where: str = "", *, signed: tuple[str, ...] = ()) -> None:
    """Check every field of a dataclass instance against its annotation (``signed``: int fields that may be < 0)."""
    hints = typing.get_type_hints(type(instance))
    for f in dataclasses.fields(instance):
        checked(getattr(instance, f.name), hints[f.name], f"{where}{f.name}", signed=f.name in signed)


def dataclass_from(cls: type, data: Any, where: str, *, signed: tuple[str, ...] = ()) -> Any:
    """A dataclass built from a mapping read from a file: no field missing or unknown, each of its declared type."""
    if not isinstance(data, dict):
        raise _fail(where.rstrip(". ") or cls.__name__, "a table (a JSON object)", data)
    names = {f.name for f in dataclasses.fields(cls)}
    required = {
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    unknown, missing = sorted(set(data) - names), sorted(required - set(data))
    if unknown or missing:
        raise FieldError(
            f"{where.rstrip('. ') or cls.__name__} has unknown field(s) {[printable(u) for u in unknown]}"
            if unknown
            else f"{where.rstrip('. ') or cls.__name__} lacks field(s) {missing}"
        )
    hints = typing.get_type_hints(cls)
    values = {k: checked(v, hints[k], f"{where}{k}", signed=k in signed) for k, v in data.items()}
    return cls(**values)
