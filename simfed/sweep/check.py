"""Checking a sweep before running it: every key names a scenario field, every algorithm is
in the scenario, the grid is not too large."""

from __future__ import annotations

import copy
import math
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from ..spec import SpecError
from .grid import MAX_POINTS, SweepSpec


def _unwrap(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else Any
    return tp


def check_key(key: str) -> None:
    """Raise SpecError when a dotted key names no scenario field (typos fail before the run)."""
    import dataclasses

    from ..spec.scenario import Scenario

    tp: Any = Scenario
    parts = key.split(".")
    for i, part in enumerate(parts):
        tp = _unwrap(tp)
        where = ".".join(parts[:i]) or "the top level"
        if dataclasses.is_dataclass(tp):
            hints = typing.get_type_hints(tp)
            names = [f.name for f in dataclasses.fields(tp) if f.init]
            if part not in names:
                raise SpecError(f"{key}: unknown key {part!r} under {where}; valid keys there: "
                                f"{', '.join(sorted(names))}")
            tp = hints[part]
        elif typing.get_origin(tp) is tuple:
            args = typing.get_args(tp)
            tp = args[0] if args else Any  # a list item, by name, label or index
        elif tp is Any or typing.get_origin(tp) is dict or tp is dict:
            return
        else:
            raise SpecError(f"{key}: {where} is a value, not a mapping")


def select_algorithms(data: Mapping[str, Any], wanted: Sequence[str]) -> list[dict[str, Any]]:
    """The scenario's algorithm items named (by name or label) in `wanted`, in that order;
    all of them when `wanted` is empty."""
    items = data.get("algorithms")
    if not isinstance(items, list) or not items:
        raise SpecError("algorithms: at least one algorithm is required")
    if not wanted:
        return list(items)
    out = []
    for w in wanted:
        match = [it for it in items if isinstance(it, dict) and w in (it.get("name"),
                                                                         it.get("label"))]
        if not match:
            have = ", ".join(str(it.get("label") or it.get("name")) for it in items
                             if isinstance(it, dict))
            raise SpecError(f"algorithm {w!r} is not in this scenario; it has: {have}")
        out.append(match[0])
    return out


def scenario_data(scenario: str | Mapping[str, Any],
                  overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The scenario as plain data with the overrides applied (not validated): read from its
    file (includes resolved), or a copy of data whose includes are resolved already."""
    from ..spec import load_scenario_data
    from ..spec.overrides import set_dotted

    if not isinstance(scenario, Mapping):
        return load_scenario_data(scenario, overrides)
    data = copy.deepcopy(dict(scenario))
    for key, value in (overrides or {}).items():
        set_dotted(data, key, value)
    return data


def algorithm_ident(item: Mapping[str, Any]) -> str:
    return str(item.get("label") or item.get("name"))


def prepare(spec: SweepSpec) -> tuple[list[str], list[dict[str, Any]]]:
    """Check keys and algorithms against the scenario; return the algorithm identifiers (label
    or name) and the list of points. Raises SpecError on a mistake in the sweep itself."""
    from ..spec.overrides import set_dotted

    keys = spec.param_keys
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:
        raise SpecError(f"{dup[0]}: varied by more than one axis")
    for key in list(keys) + list(spec.sets):
        check_key(key)
    n = math.prod(len(ax.values) for ax in spec.axes) if spec.axes else 1
    if n > MAX_POINTS:
        raise SpecError(f"the grid has {n:,} points (at most {MAX_POINTS:,})")
    base = scenario_data(spec.scenario, spec.sets)
    chosen = select_algorithms(base, spec.algorithms)
    idents = [algorithm_ident(it) for it in chosen]
    if len(set(idents)) != len(idents):
        raise SpecError(f"algorithms: {idents} names one algorithm twice")
    for ax in spec.axes:  # list items exist (algorithms.NAME.key)
        for key, value in zip(ax.keys, ax.values[0], strict=True):
            set_dotted(copy.deepcopy(base), key, value)
    return idents, spec.points()


