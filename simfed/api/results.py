"""Typed results whose fields are the `simfed run --json` contract, with the same names.

`SimulationResult.from_dict(out)` reads the engine's JSON-ready result; `to_dict()` gives it back
unchanged (a key the result did not have stays absent; a key these classes do not name is kept
in `extra`), so `to_json()` is byte for byte what `simfed run --json` writes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..spec.trace import Span
from ..sweep.output import scalar_columns


class _Record:
    """A frozen record read from a JSON object: declared fields, `extra` for the rest, and
    `_absent` for declared optional fields the object did not have."""

    _nested: ClassVar[dict[str, type[_Record]]] = {}
    _optional: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Any:
        names = _json_fields(cls)
        kw: dict[str, Any] = {}
        absent = []
        for name in names:
            if name not in data:
                if name not in cls._optional:
                    raise KeyError(f"{cls.__name__}: the result has no {name!r}")
                absent.append(name)
                kw[name] = None
                continue
            value = data[name]
            sub = cls._nested.get(name)
            if sub is not None and value is not None:
                value = (tuple(sub.from_dict(v) for v in value) if isinstance(value, list)
                         else sub.from_dict(value))
            kw[name] = value
        extra = {k: v for k, v in data.items() if k not in names}
        return cls(**kw, extra=extra, _absent=frozenset(absent))  # type: ignore[call-arg]

    def to_dict(self) -> dict[str, Any]:
        """The JSON object this record was read from (plain dicts and lists)."""
        out: dict[str, Any] = {}
        for name in _json_fields(type(self)):
            if name in self._absent:  # type: ignore[attr-defined]
                continue
            value = getattr(self, name)
            if isinstance(value, _Record):
                value = value.to_dict()
            elif isinstance(value, tuple) and value and isinstance(value[0], _Record):
                value = [v.to_dict() for v in value]
            out[name] = value
        out.update(self.extra)  # type: ignore[attr-defined]
        return out


def _json_fields(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)  # type: ignore[arg-type]
            if f.metadata.get("json", True)]


def _local(**kw: Any) -> Any:
    """A field that is not part of the JSON object."""
    return field(repr=False, compare=False, metadata={"json": False}, **kw)


def _record(cls: type) -> type:
    """A frozen keyword-only dataclass with the `extra` and `_absent` bookkeeping fields."""
    cls.__annotations__ = {**cls.__annotations__, "extra": "dict[str, Any]",
                           "_absent": "frozenset[str]"}
    cls.extra = _local(default_factory=dict)  # type: ignore[attr-defined]
    cls._absent = _local(default=frozenset())  # type: ignore[attr-defined]
    return dataclass(frozen=True, kw_only=True)(cls)


@_record
class Plan(_Record):
    """The parallel plan: federation groups x replicas x shard size = world."""

    groups: int
    replicate: int
    shard: int
    world: int


@_record
class Phases(_Record):
    """Seconds per step in each phase (they sum to the step time)."""

    forward: float
    backward: float
    optimizer: float
    aggregation: float
    other: float


@_record
class ClusterInfo(_Record):
    name: str
    nodes: int
    gpus_per_node: int
    world: int
    gpu: str


@_record
class ModelInfo(_Record):
    name: str
    params: int


@_record
class AlgorithmResult(_Record):
    """One algorithm's simulated run (an item of the result's `algorithms`)."""

    _nested: ClassVar[dict[str, type[_Record]]] = {"plan": Plan, "phases_s": Phases}
    _optional: ClassVar[frozenset[str]] = frozenset(
        {"speedup", "epoch_speedup", "steps_to_target", "tokens_to_target", "time_to_target_s",
         "time_to_target_interval_s", "steps_to_target_interval", "tokens_to_target_interval",
         "fedavg_to_reach_target", "convergence", "fl_rounds"})

    name: str
    label: str
    summary: str
    plan: Plan
    models: int
    global_batch_sequences: int
    aggregate_every: int
    aggregations: int
    steps: int
    step_time_s: float
    step_times_s: list[float]
    total_time_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    samples_per_s: float
    mfu: float
    phases_s: Phases
    aggregation_per_event_s: float
    compute_s: float
    exposed_comm_s: float
    debug_checks_s: float
    bytes_by_link: dict[str, float]
    bytes_by_link_per_gpu: dict[str, float]
    peak_memory_bytes: int
    memory_bytes: dict[str, int]
    memory_capacity_bytes: int
    fits: bool
    steps_per_epoch: float
    epoch_time_s: float
    actors: int
    critical_rank: int
    sim_ops: int
    speedup: float | None = None
    epoch_speedup: float | None = None
    # time to the scenario's target loss (a convergence profile and a target in the scenario)
    steps_to_target: int | None = None
    tokens_to_target: int | None = None
    time_to_target_s: float | None = None
    time_to_target_interval_s: list[float | None] | None = None
    steps_to_target_interval: list[int | None] | None = None  # [p10, p90]
    tokens_to_target_interval: list[int | None] | None = None
    # a federated run whose groups' mean reaches the target between FedAvg rounds pays one more
    fedavg_to_reach_target: bool | None = None
    convergence: dict[str, Any] | None = None  # predicted loss curve and its band
    fl_rounds: dict[str, Any] | None = None  # time-budgeted or deadline FedAvg rounds


@_record
class SimulationResult(_Record):
    """Every algorithm of a scenario simulated: what `simfed run --json` writes. Speedups are
    against the first algorithm (`baseline`)."""

    _nested: ClassVar[dict[str, type[_Record]]] = {
        "cluster": ClusterInfo, "model": ModelInfo, "algorithms": AlgorithmResult}
    _optional: ClassVar[frozenset[str]] = frozenset({"convergence", "robustness"})

    scenario: str
    description: str
    seed: int
    cluster: ClusterInfo
    model: ModelInfo
    tokens_per_step: int
    baseline: str
    algorithms: tuple[AlgorithmResult, ...]
    simulated_ops: int
    convergence: dict[str, Any] | None = None  # the target and which algorithm reaches it first
    robustness: dict[str, Any] | None = None  # simulate(..., robustness=True)
    spans: dict[str, list[Span]] = _local(default_factory=dict)  # simulate(..., trace=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any],
                  spans: dict[str, list[Span]] | None = None) -> SimulationResult:
        res = super().from_dict(data)
        if spans:
            object.__setattr__(res, "spans", spans)
        return res

    def how_sure(self, scenario: Any) -> list[str]:
        """The "how sure" lines `simfed run` prints for this result of `scenario` (kernel compute
        model, no calibrated profile; [] otherwise): the published check set's error, widened
        for what the validated runs do not cover, per algorithm the bound of the check runs that
        lean as much on their collectives, for an algorithm whose predicted peak memory lies
        within the published peaks' error of its GPU's capacity that whether it fits is not
        settled, and the HYBRID / FULL pairs' ratio bounds for a replicating HSDP it compares
        (simfed/calibration/envelope.py, docs/accuracy.md)."""
        from ..calibration.envelope import for_run

        return for_run(scenario, out=self.to_dict())

    def to_json(self) -> str:
        """Strict, deterministic JSON: byte for byte what `simfed run --json` writes."""
        from ..analysis.report import dumps

        return dumps(self.to_dict())

    def write_json(self, path: str | Path) -> Path:
        """Write `to_json()` atomically (a crash never leaves half a file)."""
        from ..analysis.report import write_json

        return write_json(path, self.to_dict())

    def write_traces(self, directory: str | Path) -> list[Path]:
        """Per algorithm a JSONL trace and a Chrome/Perfetto trace (simulate(..., trace=True))."""
        if not self.spans:
            raise ValueError("no spans: simulate the scenario with trace=True")
        from ..analysis.report import write_traces

        return write_traces(directory, self.to_dict(), self.spans)

    def algorithm(self, name: str) -> AlgorithmResult:
        """The algorithm with this name or label."""
        for a in self.algorithms:
            if name in (a.name, a.label):
                return a
        have = ", ".join(a.label for a in self.algorithms)
        raise KeyError(f"no algorithm {name!r} in this result; it has: {have}")

    @property
    def first_to_target(self) -> str | None:
        """The label of the algorithm that reaches the target loss first among those that fit
        their GPUs' memory (None: no target, or none of them reaches it)."""
        return (self.convergence or {}).get("first_to_target")

    def to_frame(self) -> Any:
        """A pandas DataFrame, one row per algorithm, scalar fields as dotted columns (the
        columns of a sweep's CSV; arrays stay in `to_dict()`). Needs pandas."""
        pd = _pandas()
        return pd.DataFrame([scalar_columns(a.to_dict()) for a in self.algorithms])


@_record
class CollectiveRow(_Record):
    """One message size of `collective()`: as nccl-tests prints it, and NCCL's choice."""

    size_bytes: int
    time_us: float
    algbw_GBps: float
    busbw_GBps: float
    algorithm: str
    protocol: str


@dataclass(frozen=True, kw_only=True)
class CollectiveTable:
    """An nccl-tests-style table from NCCL's tuning model for the scenario's cluster."""

    op: str
    nodes: int
    gpus_per_node: int
    nccl_version: str
    cluster: str
    rows: tuple[CollectiveRow, ...]

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "nodes": self.nodes, "gpus_per_node": self.gpus_per_node,
                "ranks": self.ranks, "nccl_version": self.nccl_version,
                "cluster": self.cluster, "rows": [r.to_dict() for r in self.rows]}

    def to_frame(self) -> Any:
        """A pandas DataFrame, one row per size. Needs pandas."""
        return _pandas().DataFrame([r.to_dict() for r in self.rows])


def _pandas() -> Any:
    try:
        import pandas as pd
    except ImportError:
        raise ImportError("to_frame() needs pandas: pip install 'simfed[frames]'") from None
    return pd


__all__ = ["AlgorithmResult", "ClusterInfo", "CollectiveRow", "CollectiveTable", "ModelInfo",
           "Phases", "Plan", "SimulationResult"]
