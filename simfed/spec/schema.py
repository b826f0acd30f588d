"""Typed, validated loading of plain data (parsed YAML) into frozen keyword-only dataclasses.

Every configuration class in `simfed.spec` declares its fields with `param(...)`; `build(cls,
data, path)` checks types, ranges, choices and unknown keys, and raises `SpecError` with a one-line
message naming the key path and the offending value ("cluster.node.nvlink.bw_GBps: must be > 0,
got -5").
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, TypeVar, Union, get_args, get_origin

from . import limits

T = TypeVar("T")

# Every number in a spec is finite and at most this large in size; keys with a physical range
# say so with their own bounds (`param(le=...)`). 2**53: integers stay exact as floats, and no
# product of a few such numbers overflows a float.
MAX_INT = 2**53
MAX_FLOAT = 1e15


class SpecError(ValueError):
    """A malformed scenario, profile or plan; the message is one line and names the key path."""


_MISSING = dataclasses.MISSING


def param(
    default: Any = _MISSING,
    *,
    gt: float | None = None,
    ge: float | None = None,
    le: float | None = None,
    choices: typing.Iterable[str] | None = None,
    doc: str = "",
) -> Any:
    """A dataclass field with validation metadata (bounds, choices) and a one-line doc."""
    meta = {"gt": gt, "ge": ge, "le": le, "doc": doc,
            "choices": tuple(choices) if choices else None}
    if default is _MISSING:
        return dataclasses.field(metadata=meta)
    if isinstance(default, (list, dict, set)):
        raise TypeError("use an immutable default (tuple) for a spec field")
    return dataclasses.field(default=default, metadata=meta)


def _fmt(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _fmt_big(value: int | float) -> str:
    """A huge number, briefly (str() of a 10**400 int is long and Python caps the digits)."""
    if isinstance(value, int) and abs(value) > 10**15:
        if abs(value) >= 10**4000:
            return "a huge integer"
        return f"about 10**{len(str(abs(value))) - 1}"
    return _fmt(value)


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _convert(tp: Any, value: Any, path: str) -> Any:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, path)
            except SpecError as exc:
                errors.append(str(exc))
        if len(errors) == 1:
            raise SpecError(errors[0])
        raise SpecError(f"{path}: unexpected value {_fmt(value)}")
    if origin is typing.Literal:
        if value not in get_args(tp):
            valid = ", ".join(map(str, get_args(tp)))
            raise SpecError(f"{path}: must be one of {valid}, got {_fmt(value)}")
        return value
    if origin is tuple:
        args = get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise SpecError(f"{path}: expected a list, got {_fmt(value)}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, _join(path, i)) for i, v in enumerate(value))
        if len(args) != len(value):
            raise SpecError(f"{path}: expected {len(args)} items, got {len(value)}")
        pairs = enumerate(zip(args, value, strict=True))
        return tuple(_convert(a, v, _join(path, i)) for i, (a, v) in pairs)
    if origin is dict or tp is dict:
        kt, vt = get_args(tp) or (str, Any)
        if not isinstance(value, dict):
            raise SpecError(f"{path}: expected a mapping, got {_fmt(value)}")
        # a plain dict (picklable, for process pools); spec objects never mutate it
        return {_convert(kt, k, path): _convert(vt, v, _join(path, str(k)))
                for k, v in value.items()}
    if _is_dataclass_type(tp):
        return build(tp, value, path)
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise SpecError(f"{path}: expected true or false, got {_fmt(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise SpecError(f"{path}: expected an integer, got {_fmt(value)}")
        if abs(value) > MAX_INT:
            raise SpecError(f"{path}: {_fmt_big(value)} is out of range (an integer key is at "
                            f"most 2**53 = {MAX_INT:,} in size)")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SpecError(f"{path}: expected a number, got {_fmt(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise SpecError(f"{path}: must be a finite number, got {value}")
        if abs(value) > MAX_FLOAT:
            raise SpecError(f"{path}: {_fmt_big(value)} is out of range (a number is at most "
                            f"{MAX_FLOAT:g} in size)")
        return float(value)
    if tp is str:
        if isinstance(value, bool):
            hint = ' (YAML reads a bare off/on/no/yes as a boolean: quote it, "off")'
            raise SpecError(f"{path}: expected a string, got {_fmt(value)}{hint}")
        if not isinstance(value, str):
            raise SpecError(f"{path}: expected a string, got {_fmt(value)}")
        return value
    raise TypeError(f"unsupported spec field type {tp!r} at {path}")


def _check_meta(meta: typing.Mapping[str, Any], value: Any, path: str) -> None:
    if value is None:
        return
    if meta.get("gt") is not None and not value > meta["gt"]:
        raise SpecError(f"{path}: must be > {meta['gt']}, got {_fmt(value)}")
    if meta.get("ge") is not None and not value >= meta["ge"]:
        raise SpecError(f"{path}: must be >= {meta['ge']}, got {_fmt(value)}")
    if meta.get("le") is not None and not value <= meta["le"]:
        raise SpecError(f"{path}: must be <= {meta['le']}, got {_fmt(value)}")
    if meta.get("choices") and value not in meta["choices"]:
        raise SpecError(f"{path}: must be one of {', '.join(meta['choices'])}, got {_fmt(value)}")


def build(cls: type[T], data: Any, path: str = "") -> T:
    """Validate `data` (a mapping from YAML) and construct the frozen dataclass `cls`."""
    where = path or "<top level>"
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected a mapping, got {_fmt(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(map(str, data)) - set(fields))
    if unknown:
        raise SpecError(
            f"{_join(path, unknown[0])}: unknown key; valid keys here: {', '.join(sorted(fields))}"
        )
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        sub = _join(path, name)
        if name not in data:
            if f.default is _MISSING and f.default_factory is _MISSING:
                raise SpecError(f"{sub}: missing required key")
            continue
        value = _convert(hints[name], data[name], sub)
        _check_meta(f.metadata, value, sub)
        why = limits.check(sub, name, value)
        if why:
            raise SpecError(f"{sub}: {why}")
        kwargs[name] = value
    try:
        obj = cls(**kwargs)
    except SpecError as exc:
        msg = str(exc)
        raise SpecError(msg if ":" in msg.split(" ")[0] else f"{where}: {msg}") from None
    return obj


def to_plain(obj: Any) -> Any:
    """A dataclass tree back to plain dicts/lists (for JSON output and hashing)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (tuple, list)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, (dict, types.MappingProxyType)):
        return {str(k): to_plain(v) for k, v in obj.items()}
    return obj


def describe(cls: type, indent: int = 0) -> str:
    """Reference of a spec class: keys, types, defaults and docs (for `simfed schema`)."""
    lines = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        default = "" if f.default is _MISSING else f" = {f.default!r}"
        doc = f.metadata.get("doc", "")
        pad = "  " * indent
        if _is_dataclass_type(tp):
            lines.append(f"{pad}{f.name}:{'  # ' + doc if doc else ''}")
            lines.append(describe(tp, indent + 1))
        else:
            tname = getattr(tp, "__name__", str(tp).replace("typing.", ""))
            lines.append(f"{pad}{f.name}: {tname}{default}{'  # ' + doc if doc else ''}")
    return "\n".join(lines)
