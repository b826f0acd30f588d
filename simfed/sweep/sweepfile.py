"""Sweep files: YAML with one top-level `sweep:` mapping, read into a SweepSpec."""

from __future__ import annotations

from pathlib import Path

from ..spec import SpecError
from ..spec.scenario import LABEL_RE
from ..spec.yamlio import read_yaml
from .grid import Axis, SweepSpec, parse_values

SWEEP_KEY = "sweep"

_SWEEP_FILE_KEYS = ("scenario", "set", "vary", "linked", "algorithms", "name")

def is_sweep_file(path: str | Path) -> bool:
    try:
        data = read_yaml(path, "sweep")  # bounded: not /dev/zero forever
    except SpecError:
        return False
    return isinstance(data, dict) and SWEEP_KEY in data


def load_sweep_file(path: str | Path) -> SweepSpec:
    """Parse a sweep file (see the module docstring); the scenario path is made absolute."""
    p = Path(path)
    data = read_yaml(p, "sweep file")
    if not isinstance(data, dict) or SWEEP_KEY not in data:
        raise SpecError(f"{p}: a sweep file has a top-level `sweep:` mapping")
    extra = sorted(set(data) - {SWEEP_KEY})
    if extra:
        raise SpecError(f"{p}: {extra[0]}: unknown top-level key; a sweep file has only `sweep:`")
    sw = data[SWEEP_KEY]
    if not isinstance(sw, dict):
        raise SpecError(f"{p}: sweep: expected a mapping")
    unknown = sorted(set(map(str, sw)) - set(_SWEEP_FILE_KEYS))
    if unknown:
        raise SpecError(f"{p}: sweep.{unknown[0]}: unknown key; valid keys: "
                        f"{', '.join(_SWEEP_FILE_KEYS)}")
    if not isinstance(sw.get("scenario"), str):
        raise SpecError(f"{p}: sweep.scenario: the scenario file to vary (relative to {p.name})")
    scenario = (p.parent / sw["scenario"]).resolve()
    sets = sw.get("set") or {}
    if not isinstance(sets, dict):
        raise SpecError(f"{p}: sweep.set: expected a mapping of dotted keys to values")
    axes: list[Axis] = []
    vary = sw.get("vary") or {}
    if not isinstance(vary, dict):
        raise SpecError(f"{p}: sweep.vary: expected a mapping of dotted keys to value lists")
    for key, raw in vary.items():
        keys = tuple(k.strip() for k in str(key).split("+"))
        vals = parse_values(raw, f"sweep.vary.{key}")
        axes.append(Axis(keys=keys, values=tuple((v,) * len(keys) for v in vals)))
    linked = sw.get("linked") or []
    if not isinstance(linked, list):
        raise SpecError(f"{p}: sweep.linked: expected a list of mappings")
    for i, group in enumerate(linked):
        if not isinstance(group, dict) or not group:
            raise SpecError(f"{p}: sweep.linked[{i}]: expected a mapping of keys to value lists")
        cols = {str(k): parse_values(v, f"sweep.linked[{i}].{k}") for k, v in group.items()}
        lengths = {k: len(v) for k, v in cols.items()}
        if len(set(lengths.values())) != 1:
            raise SpecError(f"{p}: sweep.linked[{i}]: keys vary together, so they need equally "
                            f"many values; got {lengths}")
        axes.append(Axis(keys=tuple(cols), values=tuple(zip(*cols.values(), strict=True))))
    algs = sw.get("algorithms") or []
    if isinstance(algs, str):
        algs = [algs]
    name = str(sw.get("name") or p.stem)
    if not LABEL_RE.fullmatch(name) or ".." in name:  # it names the sweep's output files
        raise SpecError(f"{p}: sweep.name: {name!r} is not a name (letters, digits, space, "
                        "+ . _ ( ) -, no '..')")
    return SweepSpec(scenario=str(scenario), name=name, sets=sets,
                     axes=tuple(axes), algorithms=tuple(map(str, algs)))


