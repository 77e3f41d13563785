"""Values across the process boundary: text in the environment to annotated types, and back.

Params and upstream outputs reach a task as environment text. A parameter annotated `str`
takes the text as it is; any other annotation reads it as JSON first (text that is not JSON
stays text, so `--param city=Lyon` is the string "Lyon") and then converts the value to the
annotation:

- `int`, `float`, `bool` (JSON `true`/`false`), `str`, `None`;
- `Optional[T]`, `Union[...]` (the first member that takes the value), `Literal[...]`;
- `list[T]`, `tuple[...]`, `set[T]`, `frozenset[T]`, `dict[K, V]` and their `typing` forms;
- an `Enum` (by value, then by name);
- `datetime.datetime` and `datetime.date` (ISO 8601 text);
- a dataclass (from a JSON object, each field converted by its own annotation; unknown keys
  and missing required fields are errors);
- a pydantic model (anything with `model_validate`), when pydantic is installed.

`to_json` is the other way: what a function returns (dataclasses, pydantic models, enums,
dates, sets and tuples included) as JSON text.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import datetime
import enum
import json
import types
import typing
from typing import Any, Dict, List, Optional

NoneType = type(None)


class ConversionError(ValueError):
    """A value that does not fit its annotation."""


def from_text(text: str, annotation: Any) -> Any:
    """The value of environment text `text` as `annotation` (None or Any: JSON, else the text).

    Text is what a param is, so where the annotation takes a string the text is tried as it is
    before its JSON reading: `Optional[str]` keeps "1.10" and `Literal["1"]` takes "1"; a union
    tries its other members on the JSON value first (`int | str` reads "3" as 3)."""
    if annotation is str:
        return text
    try:
        value: Any = json.loads(text)
    except ValueError:
        value = text
    origin = typing.get_origin(annotation)
    if origin is typing.Union or isinstance(annotation, types.UnionType):
        members = typing.get_args(annotation)
        if value is None and NoneType in members:
            return None
        for member in members:
            if member is NoneType or _takes_text(member):
                continue
            try:
                return coerce(value, member)
            except ConversionError:
                continue
        for member in members:
            if member is not NoneType and _takes_text(member):
                try:
                    return coerce(text, member)
                except ConversionError:
                    continue
        raise ConversionError(f"expected {type_name(annotation)}, got {_shown(value)}")
    if _takes_text(annotation):
        try:
            return coerce(text, annotation)
        except ConversionError:
            pass
    return coerce(value, annotation)


def _takes_text(annotation: Any) -> bool:
    """A string annotation, a Literal of strings, or an Enum of string values."""
    if annotation is str:
        return True
    if typing.get_origin(annotation) is typing.Literal:
        return any(isinstance(a, str) for a in typing.get_args(annotation))
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return any(isinstance(m.value, str) for m in annotation)
    return False


def coerce(value: Any, annotation: Any) -> Any:
    """`value` (decoded JSON) as `annotation`; raises ConversionError naming what was expected."""
    if annotation is None or annotation is Any or annotation is object:
        return value
    if annotation is NoneType:
        if value is None:
            return None
        raise ConversionError(f"expected null, got {_shown(value)}")
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Union or isinstance(annotation, types.UnionType):
        if value is None and NoneType in args:
            return None
        for member in args:
            if member is NoneType:
                continue
            try:
                return coerce(value, member)
            except ConversionError:
                continue
        raise ConversionError(f"expected {type_name(annotation)}, got {_shown(value)}")
    if origin is typing.Literal:
        # By type as well as value: True is not the literal 1, nor 1 the literal "1".
        if any(value == a and type(value) is type(a) for a in args):
            return value
        raise ConversionError(f"expected one of {', '.join(repr(a) for a in args)}, got {_shown(value)}")
    if origin is not None and origin is getattr(typing, "Annotated", None):
        return coerce(value, args[0])
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise ConversionError(f"expected true or false, got {_shown(value)}")
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise ConversionError(f"expected an integer, got {_shown(value)}")
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                pass
        raise ConversionError(f"expected a number, got {_shown(value)}")
    if annotation is str:
        if isinstance(value, str):
            return value
        # JSON that happened to parse (a param "3" read for a str) goes back to its text.
        return json.dumps(value)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return _enum(value, annotation)
    if annotation is datetime.datetime:
        return _iso(value, datetime.datetime.fromisoformat, "a date and time")
    if annotation is datetime.date:
        return _iso(value, datetime.date.fromisoformat, "a date")
    if origin in (list, set, frozenset) or annotation in (list, set, frozenset):
        container = origin or annotation
        if not isinstance(value, list):
            raise ConversionError(f"expected a list, got {_shown(value)}")
        item = args[0] if args else Any
        return container(_each(value, item))
    if origin in (typing.Sequence, _abc("Sequence"), _abc("Iterable"), _abc("Collection")):
        if not isinstance(value, list):
            raise ConversionError(f"expected a list, got {_shown(value)}")
        return _each(value, args[0] if args else Any)
    if origin is tuple or annotation is tuple:
        if not isinstance(value, list):
            raise ConversionError(f"expected a list, got {_shown(value)}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_each(value, args[0]))
        if args:
            if len(args) != len(value):
                raise ConversionError(f"expected {len(args)} items, got {len(value)}")
            return tuple(coerce(v, a) for v, a in zip(value, args))
        return tuple(value)
    if origin in (dict, _abc("Mapping"), _abc("MutableMapping")) or annotation is dict:
        if not isinstance(value, dict):
            raise ConversionError(f"expected an object, got {_shown(value)}")
        key_type, value_type = args if len(args) == 2 else (Any, Any)
        return {coerce(k, key_type): coerce(v, value_type) for k, v in value.items()}
    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        return _dataclass(value, annotation)
    validate = getattr(annotation, "model_validate", None)
    if callable(validate):
        try:
            return validate(value)
        except ValueError as error:  # pydantic's ValidationError is a ValueError
            raise ConversionError(f"{type_name(annotation)}: {error}") from None
    if isinstance(annotation, type):
        if isinstance(value, annotation):
            return value
        raise ConversionError(f"expected {type_name(annotation)}, got {_shown(value)}")
    # A type form this module does not know (a TypeVar, a Protocol): the value as it is.
    return value


def to_json(value: Any) -> str:
    """`value` as JSON text; raises TypeError naming a value JSON cannot hold."""
    return json.dumps(value, default=_plain, ensure_ascii=False)


def type_name(annotation: Any) -> str:
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"a value of type {type(value).__name__} cannot be written as JSON")


def _each(values: List[Any], item: Any) -> List[Any]:
    out = []
    for index, value in enumerate(values):
        try:
            out.append(coerce(value, item))
        except ConversionError as error:
            raise ConversionError(f"item {index}: {error}") from None
    return out


def _enum(value: Any, annotation: "type[enum.Enum]") -> Any:
    try:
        return annotation(value)
    except ValueError:
        pass
    if isinstance(value, str) and value in annotation.__members__:
        return annotation[value]
    allowed = ", ".join(repr(member.value) for member in annotation)
    raise ConversionError(f"expected {annotation.__name__} ({allowed}), got {_shown(value)}")


def _iso(value: Any, parse: Any, what: str) -> Any:
    if isinstance(value, str):
        try:
            return parse(value)
        except ValueError:
            pass
    raise ConversionError(f"expected {what} in ISO 8601, got {_shown(value)}")


def _dataclass(value: Any, annotation: type) -> Any:
    if not isinstance(value, dict):
        raise ConversionError(f"expected an object for {annotation.__name__}, got {_shown(value)}")
    try:
        hints = typing.get_type_hints(annotation)
    except Exception:  # an annotation that does not resolve converts nothing
        hints = {}
    fields = {f.name: f for f in dataclasses.fields(annotation) if f.init}
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise ConversionError(f"{annotation.__name__} has no field {', '.join(unknown)}")
    arguments: Dict[str, Any] = {}
    for name, field in fields.items():
        if name not in value:
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise ConversionError(f"{annotation.__name__} needs field {name}")
            continue
        try:
            arguments[name] = coerce(value[name], hints.get(name, Any))
        except ConversionError as error:
            raise ConversionError(f"{annotation.__name__}.{name}: {error}") from None
    return annotation(**arguments)


def _abc(name: str) -> Optional[type]:
    found = getattr(collections.abc, name, None)
    return found if isinstance(found, type) else None


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:59] + "…"
