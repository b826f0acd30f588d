"""A testbed scenario's validation plan (`validation:`, read by `simfed validate`): the fit and
held-out check shapes, launches per shape, benchmark sets and re-benchmarks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

from .schema import param

# the parts of `realrun bench` that measure compute (the rest: comm, checks)
RebenchPart = Literal["compute", "units", "optimizer"]
REBENCH_PARTS = get_args(RebenchPart)
BENCH_PARTS = ("comm", *REBENCH_PARTS, "checks")  # realrun.bench.PARTS


@dataclass(frozen=True, kw_only=True)
class ValidationShape:
    name: str
    set: dict[str, Any] = param(None, doc="dotted overrides of the scenario for this shape")
    algorithms: tuple[str, ...] = ()  # empty: every algorithm of the scenario
    baselines: tuple[str, ...] = param(
        (), doc="algorithms of this shape run only as its speedups' denominators (their "
        "configuration is another shape's): left out of the step-time error statistics")


@dataclass(frozen=True, kw_only=True)
class ValidationSpec:
    shapes: tuple[ValidationShape, ...] = ()  # the fit set's shapes (older scenarios)
    fit: tuple[ValidationShape, ...] = param(
        (), doc="shapes the model may be developed on (reported apart from the check set); "
        "with `shapes`, both are the fit set")
    check: tuple[ValidationShape, ...] = param(
        (), doc="held-out shapes, chosen before any of their results was seen and never tuned "
        "on: the validation's claim is the check set's")
    repeats: int = param(1, ge=1, doc="end-to-end launches per shape (the median is compared)")
    bench_sets: tuple[dict[str, Any], ...] = param(
        (), doc="extra overrides to run the benchmarks at (other layouts, link rates, model "
        "sizes); the key `skip` passes `realrun bench --skip` (e.g. skip: units,optimizer)")
    rebench: tuple[RebenchPart, ...] = param(
        (), doc="compute parts of `realrun bench` (compute, units, optimizer) run again right "
        "before each shape's launches, in its layout; the shape is predicted with them in place "
        "of the first benchmarks' (a host's speed drifts over a long validation)")

    @property
    def fit_shapes(self) -> tuple[ValidationShape, ...]:
        return (*self.shapes, *self.fit)

    def sets(self) -> tuple[tuple[str, ValidationShape], ...]:
        """Every shape with its set ("fit" or "check"), fit set first."""
        return (*(("fit", s) for s in self.fit_shapes), *(("check", s) for s in self.check))
