"""Reading a scenario: YAML files with their `include:`s resolved, dotted `--set` overrides, a
calibrated profile merged over it, and validation into a `Scenario`."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .messages import shown
from .overrides import set_dotted
from .scenario import Scenario
from .schema import SpecError, build
from .yamlio import MAX_NODES, expanded_size, read_yaml


def _read_yaml(path: Path, where: str) -> Any:
    """One YAML file, with `yamlio`'s limits (size, UTF-8, duplicate keys, nesting, aliases)."""
    return read_yaml(path, where)


def _deep_merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = _deep_merge(base.get(k), v) if k in base else v
        return out
    return copy.deepcopy(over)


# includes: at most this many levels deep and this many files in all (a fan-out of includes
# multiplies; the shipped scenarios use 3 files)
MAX_INCLUDE_DEPTH = 16
MAX_INCLUDE_FILES = 64


def resolve_includes(data: Any, base_dir: Path, where: str = "", depth: int = 0,
                     _chain: tuple[Path, ...] = (), _count: list[int] | None = None) -> Any:
    """Replace every mapping's `include: FILE` by that file's mapping merged with its overrides.
    A cycle is refused with its chain; so are more than MAX_INCLUDE_DEPTH levels and more than
    MAX_INCLUDE_FILES files read in all."""
    count = _count if _count is not None else [0, 0]
    if depth > MAX_INCLUDE_DEPTH:
        raise SpecError(f"{where or '<top level>'}: include nesting deeper than "
                        f"{MAX_INCLUDE_DEPTH}")
    if isinstance(data, list):
        return [resolve_includes(v, base_dir, f"{where}[{i}]", depth, _chain, count)
                for i, v in enumerate(data)]
    if not isinstance(data, dict):
        return data
    out: dict[str, Any] = {}
    if "include" in data:
        ref = data["include"]
        key = f"{where}.include" if where else "include"
        if not isinstance(ref, str) or not ref or "\x00" in ref:
            raise SpecError(f"{key}: expected a file path, got {shown(ref)}")
        path = (base_dir / ref).resolve()
        if path in _chain:
            cycle = " -> ".join(p.name for p in (*_chain[_chain.index(path):], path))
            raise SpecError(f"{key}: include cycle: {cycle}")
        count[0] += 1
        if count[0] > MAX_INCLUDE_FILES:
            raise SpecError(f"{key}: more than {MAX_INCLUDE_FILES} included files in all "
                            f"(at {ref})")
        included = _read_yaml(path, key)
        if not isinstance(included, dict):
            raise SpecError(f"{key}: {ref} does not hold a mapping")
        count[1] += expanded_size(included, str(path))
        if count[1] > MAX_NODES:
            raise SpecError(f"{key}: the included files hold more than {MAX_NODES:,} values "
                            "in all")
        out = resolve_includes(included, path.parent, where, depth + 1, (*_chain, path), count)
    for k, v in data.items():
        if k == "include":
            continue
        sub = f"{where}.{k}" if where else str(k)
        v = resolve_includes(v, base_dir, sub, depth, _chain, count)
        out[k] = _deep_merge(out[k], v) if k in out else v
    return out


def scenario_from_dict(data: Any, *, where: str = "") -> Scenario:
    if not isinstance(data, dict):
        raise SpecError(f"{where or 'scenario'}: expected a mapping at the top level")
    return build(Scenario, data, "")


PROFILE_SECTIONS = ("cluster", "runtime")


def load_profile(path: str | Path) -> dict:
    """A calibrated profile: a partial scenario (cluster and runtime keys only) whose values
    replace the scenario's (measured numbers beat nominal ones)."""
    p = Path(path)
    data = _read_yaml(p, "profile")
    if not isinstance(data, dict):
        raise SpecError(f"{p}: a profile must be a mapping with cluster/runtime sections")
    unknown = sorted(set(data) - set(PROFILE_SECTIONS))
    if unknown:
        raise SpecError(f"{p}: {unknown[0]}: a profile holds only "
                        f"{' and '.join(PROFILE_SECTIONS)} sections")
    return resolve_includes(data, p.parent.resolve(), _chain=(p.resolve(),))


def load_scenario_data(path: str | Path, overrides: Mapping[str, Any] | None = None,
                       profile: str | Path | None = None) -> dict:
    """The scenario file as plain data, includes resolved, then the profile merged over it,
    then overrides applied (not validated)."""
    p = Path(path)
    data = _read_yaml(p, "scenario")
    if not isinstance(data, dict):
        raise SpecError(f"{p}: expected a mapping at the top level, got {type(data).__name__}")
    data = resolve_includes(data, p.parent.resolve(), _chain=(p.resolve(),))
    if profile is not None:
        data = _deep_merge(data, load_profile(profile))
    for dotted, value in (overrides or {}).items():
        set_dotted(data, dotted, value)
    return data


def load_scenario(path: str | Path, overrides: Mapping[str, Any] | None = None,
                  profile: str | Path | None = None) -> Scenario:
    """Parse and validate a scenario file (optionally with a calibrated profile merged over it).
    Raises SpecError with a one-line message."""
    data = load_scenario_data(path, overrides, profile)
    try:
        return scenario_from_dict(data, where=str(path))
    except SpecError as exc:
        if profile is None:
            raise
        # a bad value the profile brought (and no --set replaced): name the profile's file
        key = str(exc).split(":", 1)[0]
        if key in _dotted_keys(load_profile(profile)) and key not in (overrides or {}):
            raise SpecError(f"{profile}: {exc}") from None
        raise


def _dotted_keys(data: Mapping[str, Any], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for k, v in data.items():
        key = f"{prefix}{k}"
        out.add(key)
        if isinstance(v, Mapping):
            out |= _dotted_keys(v, key + ".")
    return out
