"""Sweep files: YAML with one top-level `sweep:` mapping, read into a SweepSpec."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationInfo, field_validator

from ..spec import SpecError
from ..spec.models import FrozenModel
from ..spec.scenario import LABEL_RE
from ..spec.yamlio import read_yaml
from .grid import Axis, SweepSpec, parse_values

SWEEP_KEY = "sweep"


def is_sweep_file(path: str | Path) -> bool:
    try:
        data = read_yaml(path, "sweep")  # bounded: not /dev/zero forever
    except SpecError:
        return False
    return isinstance(data, dict) and SWEEP_KEY in data


class SweepBody(FrozenModel):
    """The `sweep:` mapping of a sweep file."""

    scenario: str = Field(description="the scenario file to vary, relative to the sweep file")
    sets: dict[str, Any] = Field(default_factory=dict, alias="set",
                                 description="fixed overrides (dotted key: value) at every point")
    vary: dict[str, Any] = Field(
        default_factory=dict,
        description="one grid axis per key, in this order: a list or V1,V2 / A:B[:STEP] / A:B:xF")
    linked: list[Annotated[dict[str, Any], Field(min_length=1)]] = Field(
        default_factory=list,
        description="axes of keys that vary together: mappings of keys to equally long lists")
    algorithms: tuple[str, ...] = Field(
        (), description="only these algorithms (names or labels); the first is the baseline")
    name: str | None = Field(None, description="names the output files [default: file stem]")

    @field_validator("sets", "vary", "linked", "algorithms", mode="before")
    @classmethod
    def _empty_is_default(cls, v: Any, info: ValidationInfo) -> Any:
        empty: dict[str, Any] = {"sets": {}, "vary": {}, "linked": [], "algorithms": ()}
        return empty[str(info.field_name)] if v is None else v

    @field_validator("algorithms", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        if isinstance(v, str):
            return (v,)
        return tuple(map(str, v)) if isinstance(v, (list, tuple)) else v

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, v: Any) -> Any:
        if v is None or v == "":
            return None
        name = str(v)
        if not LABEL_RE.fullmatch(name) or ".." in name:  # it names the sweep's output files
            raise ValueError(f"{name!r} is not a name (letters, digits, space, + . _ ( ) -, "
                             "no '..')")
        return name


class SweepFile(FrozenModel):
    """A sweep file: one top-level `sweep:` mapping (so it is never mistaken for a scenario)."""

    sweep: SweepBody


def load_sweep_file(path: str | Path) -> SweepSpec:
    """Parse a sweep file (see the module docstring); the scenario path is made absolute."""
    p = Path(path)
    data = read_yaml(p, "sweep file")
    if not isinstance(data, dict) or SWEEP_KEY not in data:
        raise SpecError(f"{p}: a sweep file has a top-level `sweep:` mapping")
    sw = SweepFile.parse(data, str(p)).sweep
    axes: list[Axis] = []
    for key, raw in sw.vary.items():
        keys = tuple(k.strip() for k in str(key).split("+"))
        vals = parse_values(raw, f"sweep.vary.{key}")
        axes.append(Axis(keys=keys, values=tuple((v,) * len(keys) for v in vals)))
    for i, group in enumerate(sw.linked):
        cols = {str(k): parse_values(v, f"sweep.linked[{i}].{k}") for k, v in group.items()}
        lengths = {k: len(v) for k, v in cols.items()}
        if len(set(lengths.values())) != 1:
            raise SpecError(f"{p}: sweep.linked[{i}]: keys vary together, so they need equally "
                            f"many values; got {lengths}")
        axes.append(Axis(keys=tuple(cols), values=tuple(zip(*cols.values(), strict=True))))
    return SweepSpec(scenario=str((p.parent / sw.scenario).resolve()), name=sw.name or p.stem,
                     sets=sw.sets, axes=tuple(axes), algorithms=sw.algorithms)
