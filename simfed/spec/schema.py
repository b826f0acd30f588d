"""Typed, validated loading of plain data (parsed YAML) into frozen keyword-only dataclasses, on
pydantic v2.

Every configuration class in `simfed.spec` is a frozen keyword-only dataclass that declares its
fields with `param(...)`: a default, bounds (gt/ge/le), choices, a pattern and a one-line doc.
`build(cls, data, path)` validates with pydantic: a pydantic model is derived once per class from
those declarations (extra keys forbidden, the bounds as Field constraints, choices as Literal
types, the doc as the Field description, `limits` as an after-validator) and cached with its
TypeAdapter. The validated values then construct the real frozen dataclass, whose
`__post_init__` holds the cross-field rules: it runs inside pydantic's validation, so its error
carries the key path too. The objects the rest of simfed sees stay plain frozen dataclasses
(hashable, picklable, `dataclasses.replace` works, no validation cost after loading).

Errors stay one line naming the key path and the value ("cluster.node.nvlink.bw_GBps: must be >
0, got -5.0"): `SpecError`, translated from pydantic's first error. The same models give the
scenario's JSON Schema (`json_schema`, `simfed schema --json`).

Scalars follow YAML's types strictly (pydantic's lax mode would read "5" as 5 and "yes" as
true): an integer key takes an integer (or an integral float), a number key an integer or float,
a string key a string (a bare YAML off/on is a boolean: the error says to quote it), a boolean
key true or false. Every number is finite and at most MAX_INT / MAX_FLOAT in size.

Other modules with their own files to validate (sweeps, testbeds) can declare their sections the
same way and call `build`, or call `validate(tp, data, where)` for any type (a `tuple[...]`, a
`dict[...]`, a Literal) with the same rules and messages.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import annotated_types
import pydantic
from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, TypeAdapter
from pydantic_core import PydanticCustomError, PydanticUndefined

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
    pattern: str | None = None,
    min_length: int | None = None,
    doc: str = "",
) -> Any:
    """A dataclass field with validation metadata and a one-line doc. The metadata is pydantic's
    Field vocabulary (gt, ge, le, pattern, min_length, description), so pydantic reads it from
    the dataclass field as it is; `choices` become a Literal type in `build`'s model."""
    meta = {"gt": gt, "ge": ge, "le": le, "pattern": pattern, "min_length": min_length,
            "description": doc or None, "doc": doc,
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


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


# ---------------------------------------------------------------------------------------------
# scalars as YAML types them


def _refuse(why: str) -> typing.NoReturn:
    raise PydanticCustomError("spec", "{why}", {"why": why})


def _as_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        _refuse(f"expected true or false, got {_fmt(value)}")
    return value


def _as_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            _refuse(f"expected an integer, got {_fmt(value)}")
    if abs(value) > MAX_INT:
        _refuse(f"{_fmt_big(value)} is out of range (an integer key is at most 2**53 = "
                f"{MAX_INT:,} in size)")
    return value


def _as_float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _refuse(f"expected a number, got {_fmt(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        _refuse(f"must be a finite number, got {value}")
    if abs(value) > MAX_FLOAT:
        _refuse(f"{_fmt_big(value)} is out of range (a number is at most {MAX_FLOAT:g} in size)")
    return float(value)


def _as_str(value: Any) -> str:
    if isinstance(value, bool):
        _refuse(f'expected a string, got {_fmt(value)} (YAML reads a bare off/on/no/yes as a '
                'boolean: quote it, "off")')
    if not isinstance(value, str):
        _refuse(f"expected a string, got {_fmt(value)}")
    return value


def _as_list(value: Any) -> Any:
    if not isinstance(value, (list, tuple)):
        _refuse(f"expected a list, got {_fmt(value)}")
    return value


def _as_mapping(value: Any) -> Any:
    if not isinstance(value, dict):
        _refuse(f"expected a mapping, got {_fmt(value)}")
    return value


def _as_section(value: Any) -> Any:
    """A spec section: an empty one in YAML (`stragglers:`, null) takes every default."""
    return _as_mapping({} if value is None else value)


_SCALARS: dict[Any, Any] = {bool: _as_bool, int: _as_int, float: _as_float, str: _as_str}


# ---------------------------------------------------------------------------------------------
# pydantic models derived from the dataclasses


_CONFIG = ConfigDict(extra="forbid", protected_namespaces=(), defer_build=True)


def _spec_type(tp: Any, path: str, checks: tuple = ()) -> Any:
    """The pydantic annotation that validates a value of declared type `tp` at `path` (list
    items and mapping values share their list's / mapping's path: limits are by key name), with
    `checks` (constraints, validators) on the value once it has its type. A scalar's YAML-type
    check runs first (a BeforeValidator), then pydantic's type and the constraints."""
    if tp in _SCALARS:
        return Annotated[(tp, *checks, BeforeValidator(_SCALARS[tp]))]
    if tp is Any or tp is type(None):
        return Annotated[(tp, *checks)] if checks else tp
    if _is_dataclass_type(tp):
        model = _spec_model(tp, path)
        return Annotated[(model, *checks)] if checks else model
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        return _spec_type(args[0], path, (*tp.__metadata__, *checks))
    if origin is Literal:  # choices: a value of the choices' type (true is not the choice 1)
        strings = all(isinstance(a, str) for a in args)
        ints = all(isinstance(a, int) and not isinstance(a, bool) for a in args)
        before = [BeforeValidator(_as_str if strings else _as_int)] if strings or ints else []
        return Annotated[(tp, *checks, *before)] if before or checks else tp
    if origin in (Union, types.UnionType):
        union = Union[tuple(_spec_type(a, path) for a in args)]  # noqa: UP007
        return Annotated[(union, *checks)] if checks else union
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            inner = tuple[_spec_type(args[0], path), ...]  # type: ignore[misc]
        else:
            inner = tuple[tuple(_spec_type(a, path) for a in args)]  # type: ignore[misc]
        return Annotated[(inner, *checks, BeforeValidator(_as_list))]
    if origin is dict or tp is dict:
        kt, vt = args or (str, Any)
        inner = dict[_spec_type(kt, path), _spec_type(vt, path)]  # type: ignore[misc]
        return Annotated[(inner, *checks, BeforeValidator(_as_mapping))]
    raise TypeError(f"unsupported spec field type {tp!r} at {path}")


def _limits_applying(path: str, name: str) -> bool:
    import re

    return path in limits.PATH_LIMITS or any(re.search(p, name) for p, _ in limits.UNIT_RANGES)


def _check_limits(path: str, name: str, value: Any) -> Any:
    why = limits.check(path, name, value)
    if why:
        _refuse(why)
    return value


def _construct(cls: type, model: pydantic.BaseModel) -> Any:
    """The real frozen dataclass from a validated model: the keys given (the dataclass supplies
    its own defaults); its `__post_init__` (the cross-field rules) runs here, inside pydantic."""
    given = model.model_fields_set
    return cls(**{k: v for k, v in model.__dict__.items() if k in given})


@functools.cache
def _spec_model(cls: type, path: str) -> Any:
    """The pydantic model of spec dataclass `cls` at `path` (a dotted path without list indices),
    wrapped to take null as an empty mapping and to return the real dataclass."""
    hints = typing.get_type_hints(cls, include_extras=True)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        sub = f"{path}.{f.name}" if path else f.name
        meta = f.metadata
        tp = hints[f.name]
        if meta.get("choices"):
            tp = Literal[meta["choices"]]
        checks: list[Any] = []
        for key, make in (("gt", annotated_types.Gt), ("ge", annotated_types.Ge),
                          ("le", annotated_types.Le), ("min_length", annotated_types.MinLen)):
            if meta.get(key) is not None:
                checks.append(make(meta[key]))
        if meta.get("pattern"):
            checks.append(pydantic.StringConstraints(pattern=meta["pattern"]))
        extra: dict[str, Any] = {}
        if _limits_applying(sub, f.name) and not _is_dataclass_type(tp):
            checks.append(AfterValidator(functools.partial(_check_limits, sub, f.name)))
            hi = _limit_hi(sub, f.name)
            if hi is not None and tp in (int, float):
                extra["maximum"] = min(hi, meta.get("le") or hi)
        if f.default is not _MISSING:
            default = f.default
        elif f.default_factory is not _MISSING:
            default = f.default_factory()
        else:
            default = PydanticUndefined
        annotation = _spec_type(tp, sub, tuple(checks))
        fields[f.name] = (annotation, Field(default, description=meta.get("doc") or None,
                                            json_schema_extra=extra or None))
    doc = cls.__doc__ if not (cls.__doc__ or "").startswith(f"{cls.__name__}(") else None
    model = pydantic.create_model(cls.__name__, __config__=_CONFIG, __doc__=doc, **fields)
    model.__spec_class__ = cls  # type: ignore[attr-defined]
    return Annotated[model, BeforeValidator(_as_section),
                     AfterValidator(functools.partial(_construct, cls))]


def _limit_hi(path: str, name: str) -> float | None:
    import re

    his = [r.hi for pat, r in limits.UNIT_RANGES if re.search(pat, name)]
    if path in limits.PATH_LIMITS:
        his.append(limits.PATH_LIMITS[path].hi)
    return min(his) if his else None


def _plain(path: str) -> str:
    import re

    return re.sub(r"\[\d+\]", "", path)


@functools.cache
def _adapter(tp: Any, path: str) -> TypeAdapter:
    return TypeAdapter(_spec_type(tp, path))


# ---------------------------------------------------------------------------------------------
# pydantic's errors as one line


def _unwrap(tp: Any) -> Any:
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    return tp


def _model_of(tp: Any) -> type[pydantic.BaseModel] | None:
    tp = _unwrap(tp)
    return tp if isinstance(tp, type) and issubclass(tp, pydantic.BaseModel) else None


def _fits(tp: Any, rest: tuple) -> bool:
    """Whether the rest of an error's location can lie inside a value of type `tp`."""
    tp = _unwrap(tp)
    if not rest:
        return True
    model = _model_of(tp)
    if model is not None:
        return isinstance(rest[0], str)
    return get_origin(tp) in (tuple, dict)


class _Where(typing.NamedTuple):
    path: str  # dotted, list items as [i], union tags dropped
    tp: Any  # the declared (pydantic) type there
    holder: Any  # the model holding the last key (for unknown keys)
    union: tuple[int, str, Any] | None  # the first union on the way: loc index, path, type
    field: Any  # the FieldInfo of the last model key


def _locate(tp: Any, loc: tuple, prefix: str) -> _Where:
    """Where pydantic's error location `loc` points, under a value of type `tp` at `prefix`."""
    path, holder, union, field = prefix, None, None, None
    tp = _unwrap(tp)
    i = 0
    while i < len(loc):
        item = loc[i]
        origin = get_origin(tp)
        model = _model_of(tp)
        if origin in (Union, types.UnionType):
            members = [a for a in get_args(tp) if a is not type(None)]
            if len(members) > 1:  # pydantic names the member tried: skip its tag
                if union is None:
                    union = (i, path, tp)
                rest = loc[i + 1:]
                tp = _unwrap(next((m for m in members if _fits(m, rest)), members[0]))
                i += 1
            else:
                tp = _unwrap(members[0])
            continue
        if model is not None:
            holder = model
            path = f"{path}.{item}" if path else str(item)
            field = model.model_fields.get(item) if isinstance(item, str) else None
            tp = _unwrap(field.annotation) if field is not None else None
        elif origin is tuple:
            args = get_args(tp)
            path = f"{path}[{item}]"
            if len(args) == 2 and args[1] is Ellipsis:
                tp = _unwrap(args[0])
            else:
                tp = _unwrap(args[item]) if isinstance(item, int) and item < len(args) else None
        elif origin is dict:
            kt, vt = get_args(tp)
            path = f"{path}.{item}" if path else str(item)
            if i + 1 < len(loc) and loc[i + 1] == "[key]":  # the key itself is wrong
                tp = _unwrap(kt)
                i += 1
            else:
                tp = _unwrap(vt)
        else:
            path = f"{path}[{item}]" if isinstance(item, int) else f"{path}.{item}"
            tp = None
        i += 1
    return _Where(path, tp, holder, union, field)


def _first(errors: list[dict], root: Any, prefix: str) -> str:
    """The one line to report: pydantic's first error, unless an unknown key sits on its way
    there (the unknown key is the likelier cause: a misspelt key also leaves the right one
    missing). A value no member of a union takes is named with every member; a value one member
    took partly (a mapping with a bad entry) is reported inside that member."""
    first = errors[0]
    unknown = [e for e in errors if e["type"] == "extra_forbidden"
               and tuple(first["loc"][:len(e["loc"]) - 1]) == tuple(e["loc"][:-1])]
    if unknown:
        return _message(min(unknown, key=lambda e: len(e["loc"])), root, prefix)
    where = _locate(root, tuple(first["loc"]), prefix)
    if where.union is not None:
        k, path, union = where.union
        base = tuple(first["loc"][:k])
        mine = [e for e in errors if tuple(e["loc"][:k]) == base]
        deep = max(mine, key=lambda e: len(e["loc"]))
        if len(deep["loc"]) > k + 1:
            return _message(deep, root, prefix)
        members = [_describe(a) for a in get_args(union) if a is not type(None)]
        return f"{path or '<top level>'}: expected {' or '.join(members)}, got " \
               f"{_fmt(first.get('input'))}"
    return _message(first, root, prefix)


def _bounds(tp: Any) -> str:
    """The bounds an Annotated type's metadata sets, in words (" >= 1", " from 0 to 1")."""
    lo = hi = None
    while get_origin(tp) is Annotated:
        for m in tp.__metadata__:
            for c in (*getattr(m, "metadata", ()), m):
                lo = getattr(c, "ge", None) if getattr(c, "ge", None) is not None else lo
                hi = getattr(c, "le", None) if getattr(c, "le", None) is not None else hi
        tp = get_args(tp)[0]
    if lo is not None and hi is not None:
        return f" from {_fmt(lo)} to {_fmt(hi)}"
    return f" >= {_fmt(lo)}" if lo is not None else f" <= {_fmt(hi)}" if hi is not None else ""


def _describe(tp: Any) -> str:
    """What a value of type `tp` is, in a few words (for union errors)."""
    bounds = _bounds(tp)
    tp = _unwrap(tp)
    if get_origin(tp) is Literal:
        return f"one of {', '.join(map(str, get_args(tp)))}"
    if get_origin(tp) is tuple:
        return "a list"
    if get_origin(tp) is dict or _model_of(tp) is not None:
        return "a mapping"
    return {bool: "true or false", int: "an integer", float: "a number",
            str: "a string"}.get(tp, getattr(tp, "__name__", str(tp))) + bounds


def _message(err: dict, root: Any, prefix: str) -> str:
    path, tp, holder, _, field = _locate(root, tuple(err["loc"]), prefix)
    where = path or "<top level>"
    kind, ctx, value = err["type"], err.get("ctx") or {}, err.get("input")
    if kind == "value_error" and isinstance(ctx.get("error"), Exception):
        msg = str(ctx["error"])
        return msg if ":" in msg.split(" ")[0] else f"{where}: {msg}"
    if kind == "spec":
        return f"{where}: {ctx['why']}"
    if kind in ("extra_forbidden", "invalid_key"):
        cls = getattr(holder, "__spec_class__", None)
        valid = sorted(f.name for f in dataclasses.fields(cls) if f.init) if cls else []
        return f"{where}: unknown key; valid keys here: {', '.join(valid)}"
    if kind == "missing":
        if isinstance(err["loc"][-1], int):  # a fixed-length list one short
            parent = _locate(root, tuple(err["loc"][:-1]), prefix)
            return (f"{parent.path}: expected {len(get_args(parent.tp))} items, got "
                    f"{err['loc'][-1]}")
        return f"{where}: missing required key"
    if kind == "too_long" and ctx.get("field_type") == "Tuple":
        return f"{where}: expected {ctx.get('max_length')} items, got {ctx.get('actual_length')}"
    if kind == "too_short":
        return (f"{where}: expected at least {ctx.get('min_length')} item(s), got "
                f"{ctx.get('actual_length')}")
    if kind == "literal_error":
        valid = ", ".join(map(str, get_args(tp))) if get_origin(tp) is Literal else \
            ctx.get("expected", "")
        return f"{where}: must be one of {valid}, got {_fmt(value)}"
    if kind.startswith(("greater", "less")) and isinstance(value, (int, float)):
        value = _as_float(value) if tp is float else _as_int(value) if tp is int else value
    for key, op in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
        if key in ctx and kind.startswith(("greater", "less")):
            bound = ctx[key]
            if isinstance(bound, float) and bound.is_integer():
                bound = int(bound)  # as declared: gt=0 on a float key is "> 0"
            return f"{where}: must be {op} {bound}, got {_fmt(value)}"
    if kind == "string_pattern_mismatch":
        doc = f" ({field.description})" if field is not None and field.description else ""
        return f"{where}: {_fmt(value)} does not match {ctx.get('pattern')}{doc}"
    if kind in ("model_type", "dict_type", "model_attributes_type", "dataclass_type"):
        return f"{where}: expected a mapping, got {_fmt(value)}"
    if kind in ("tuple_type", "list_type", "iterable_type"):
        return f"{where}: expected a list, got {_fmt(value)}"
    return f"{where}: {err['msg']}, got {_fmt(value)}"


def validate(tp: Any, data: Any, where: str = "") -> Any:
    """Validate `data` as declared type `tp` (a spec dataclass, a tuple, dict, Literal or
    scalar type) with the rules of spec files; raises a one-line SpecError naming the key path
    under `where`."""
    adapter = _adapter(tp, _plain(where))
    try:
        return adapter.validate_python(data)
    except pydantic.ValidationError as exc:
        raise SpecError(_first(exc.errors(include_url=False), _spec_type(tp, _plain(where)),
                               where)) from None


def build(cls: type[T], data: Any, path: str = "") -> T:
    """Validate `data` (a mapping from YAML) and construct the frozen dataclass `cls`."""
    return validate(cls, data, path)


def json_schema(cls: type, title: str = "", resolved: bool = False) -> dict[str, Any]:
    """The JSON Schema (2020-12) of a file holding a `cls` mapping: keys with their types,
    bounds, choices, defaults and docs. As a file is written (`resolved` False), any mapping
    may say `include: FILE` (`simfed.spec.loader.resolve_includes`) and take keys from there,
    so no key is required; `resolved`: the data after includes, with its required keys."""
    schema = _adapter(cls, "").json_schema(mode="validation")
    include = {"type": "string", "description": "a YAML file (relative to this one) whose "
               "mapping this one starts from; the keys here override it"}
    if not resolved:
        for node in [schema, *schema.get("$defs", {}).values()]:
            if "properties" in node:
                node["properties"]["include"] = include
                node.pop("required", None)
    out = {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
    if title:
        out["title"] = title
    return out


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
