"""The grid of a sweep: axes of dotted scenario keys and the value grammar
(`V1,V2,...`, `A:B`, `A:B:STEP`, `A:B:xF`)."""

from __future__ import annotations

import itertools
import math
from typing import Any

from pydantic import Field, model_validator

from ..spec import SpecError
from ..spec.models import FrozenModel
from ..spec.yamlio import parse_yaml

MAX_POINTS = 100_000


class Axis(FrozenModel):
    """One grid dimension: keys that vary together, one value per key at each position."""

    keys: tuple[str, ...] = Field(min_length=1, description="dotted scenario keys")
    values: tuple[tuple[Any, ...], ...] = Field(
        description="one tuple per grid position, one value per key")

    @model_validator(mode="after")
    def _one_value_per_key(self) -> Axis:
        if not self.values:
            raise ValueError(f"{'+'.join(self.keys)}: no values")
        for v in self.values:
            if len(v) != len(self.keys):
                raise ValueError(f"{'+'.join(self.keys)}: {len(self.keys)} keys but a value "
                                 f"tuple of {len(v)}")
        return self


class SweepSpec(FrozenModel):
    """A sweep: the scenario file, fixed overrides, the grid axes and the algorithms."""

    scenario: str | dict[str, Any] = Field(
        description="the scenario file to vary, or its data (includes resolved)")
    name: str = Field("", description="names the output files and titles")
    sets: dict[str, Any] = Field(default_factory=dict,
                                 description="fixed overrides (dotted key: value) at every point")
    axes: tuple[Axis, ...] = Field((), description="grid axes, the first varying slowest")
    algorithms: tuple[str, ...] = Field(
        (), description="algorithm names or labels; the first is the speedup baseline")

    @property
    def param_keys(self) -> list[str]:
        return [k for ax in self.axes for k in ax.keys]

    def points(self) -> list[dict[str, Any]]:
        """Every grid point as {dotted key: value}, the first axis varying slowest."""
        out = []
        for combo in itertools.product(*(ax.values for ax in self.axes)):
            point: dict[str, Any] = {}
            for ax, vals in zip(self.axes, combo, strict=True):
                point.update(zip(ax.keys, vals, strict=True))
            out.append(point)
        return out


def _number(text: str) -> int | float:
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        x = float(text)
    except ValueError:
        raise SpecError(f"range bound {text!r} is not a number") from None
    if not math.isfinite(x):  # before: ValueError int(nan) / OverflowError (exit 3)
        raise SpecError(f"range bound {text!r} is not a finite number")
    return x


def _tidy(x: float) -> int | float:
    """Round away float drift (0.1 * 3 = 0.30000000000000004 -> 0.3)."""
    return float(f"{x:.12g}")


def parse_values(raw: Any, where: str = "value") -> list[Any]:
    """A list of values from `V1,V2,...`, `A:B`, `A:B:STEP`, `A:B:xF` or a YAML list; every
    number finite (a NaN or an infinity could not be written to the sweep's JSON)."""
    values = _parse_values(raw, where)
    for v in values:
        if isinstance(v, float) and not math.isfinite(v):
            raise SpecError(f"{where}: {v} is not a finite number")
    return values


def _parse_values(raw: Any, where: str) -> list[Any]:
    if isinstance(raw, (list, tuple)):
        if not raw:
            raise SpecError(f"{where}: empty list of values")
        return list(raw)
    if not isinstance(raw, str):
        return [raw]
    text = raw.strip()
    if not text:
        raise SpecError(f"{where}: no values")
    if ":" in text and "," not in text and not text.startswith(("{", "[", "'", '"')):
        return _parse_range(text, where)
    items = [s.strip() for s in text.split(",")]
    if any(not s for s in items):
        raise SpecError(f"{where}: empty item in {raw!r}")
    values = []
    for s in items:
        values.append(parse_yaml(s, where))  # with simfed.spec.yamlio's limits
    return values


def _parse_range(text: str, where: str) -> list[Any]:
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise SpecError(f"{where}: range {text!r}: expected START:STOP, START:STOP:STEP or "
                        "START:STOP:xFACTOR")
    start, stop = _number(parts[0]), _number(parts[1])
    geometric = len(parts) == 3 and parts[2].strip().lower().startswith("x")
    step_text = parts[2].strip()[1:] if geometric else (parts[2] if len(parts) == 3 else "1")
    step = _number(step_text)
    ints = all(isinstance(v, int) for v in (start, stop, step))
    values: list[Any] = []
    if geometric:
        if step <= 1 or start <= 0 or stop < start:
            raise SpecError(f"{where}: range {text!r}: need 0 < START <= STOP and a factor > 1")
        v: float = start
        while v <= stop * (1 + 1e-12):
            values.append(int(v) if ints else _tidy(v))
            v = v * step
            if len(values) > MAX_POINTS:
                break
    else:
        if step <= 0 or stop < start:
            raise SpecError(f"{where}: range {text!r}: need START <= STOP and a STEP > 0")
        n = math.floor((stop - start) / step + 1e-9) + 1
        if n > MAX_POINTS:
            raise SpecError(f"{where}: range {text!r} has {n:,} values (at most {MAX_POINTS:,})")
        values = [start + i * step if ints else _tidy(start + i * step) for i in range(n)]
    if len(values) > MAX_POINTS:
        raise SpecError(f"{where}: range {text!r} has too many values (at most {MAX_POINTS:,})")
    return values


def parse_vary(item: str) -> Axis:
    """`--vary KEY=VALUES` or `--vary KEY1+KEY2=VALUES` (linked keys, same values)."""
    if "=" not in item:
        raise SpecError(f"--vary {item!r}: expected KEY=V1,V2,... or KEY=START:STOP[:STEP], "
                        "e.g. cluster.nodes=16,32,64")
    lhs, _, rhs = item.partition("=")
    keys = tuple(k.strip() for k in lhs.split("+"))
    if any(not k for k in keys):
        raise SpecError(f"--vary {item!r}: empty key")
    values = parse_values(rhs, f"--vary {lhs.strip()}")
    return Axis(keys=keys, values=tuple((v,) * len(keys) for v in values))


