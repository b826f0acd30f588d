"""The rows of `realrun bench`'s summary (DIR/bench-summary.json), declared once: realrun.bench
writes them (`summarize`), simfed.calibration reads them (`read_bench`). One model per table;
times in seconds (`_s`), sizes in bytes (`nbytes`), rates in Gb/s (`_Gbps`) or GFLOP/s.

Every time is, per repetition, the slowest rank (a collective ends when its last rank does),
then the median over repetitions; `min_time_s` the fastest repetition, `samples` how many.
`to_json` gives the dict the summary holds: a field that is absent from a row (an optional one
left unset, e.g. `beside` of a row measured in step) stays absent, so the JSON written is the
same as before the rows were typed, and summaries written since then load.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .limits import MAX_TIME_S, MAX_WORLD
from .models import one_line
from .schema import SpecError

MIN_LINK_GBPS, MAX_LINK_GBPS = 1e-3, 1e5  # 1 Mb/s (a shaped testbed link) to 100 Tb/s

Number = int | float  # as the trace attributes hold it (kept as written: 1000000 stays an int)


class BenchRow(BaseModel):
    """A frozen row; unknown fields are refused (a new one is declared here first). The fields
    calibration reads are required; the others may be absent (older summaries, hand-made test
    summaries)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(exclude_unset=True)


class CommRow(BenchRow):
    """A collective case: op over `group_size` ranks on `nodes` nodes, `concurrent_groups`
    groups at once; nbytes is the full buffer (all-gather output, reduce-scatter input,
    all-reduce buffer)."""

    op: str = Field(description="all_gather | reduce_scatter | all_reduce")
    group: str = Field(description="intra | inter | world | nodes{b}: blocks of b nodes")
    group_size: int
    nodes: int | None = None
    concurrent_groups: int = 1
    nbytes: int
    impl: str = Field("", description="gloo_allgather | gloo_allreduce")
    time_s: float
    min_time_s: float | None = None
    samples: int = 0
    algbw_Gbps: float | None = Field(None, description="nbytes / time_s")
    busbw_Gbps: float | None = Field(
        None, description="algbw x (p-1)/p (all-gather, reduce-scatter) or 2(p-1)/p (all-reduce)")
    rank_cv: float | None = Field(
        None, description="a rank's standard deviation within a repetition over the mean time; "
        "null with one rank per group")
    beside: str | None = Field(
        None, description="busy: one group ran it beside a training-like loop out of step with "
        "it (absent: every group in step)")


class ComputeRow(BenchRow):
    """The plain matmul block (not the model): forward, backward, or forward_backward over 256
    tokens with half of the ranks sharing cores with the other half."""

    phase: Literal["forward", "backward", "forward_backward"]
    concurrent: int = 1
    flops: Number
    hidden: int | None = None
    ffn_hidden: int | None = None
    time_s: float
    gflops_per_s: float | None = None
    samples: int | None = None
    rank_cv: float | None = None
    beside: str | None = None


class LoopRow(BenchRow):
    """The training-like loop (the block, then an all-gather of nbytes in its own group,
    free-running) beside idle ranks or beside the other half's loop."""

    phase: Literal["loop"]
    concurrent: int
    flops: Number
    hidden: int | None = None
    ffn_hidden: int | None = None
    beside: str = Field(description="idle | busy")
    nbytes: int
    time_s: float = Field(description="the block")
    gflops_per_s: float | None = None
    coll_time_s: float = Field(description="the all-gather, waits included")
    samples: int | None = None
    arrival_sd_s: float | None = Field(
        description="how far apart the group's ranks reached each all-gather (a rank's "
        "standard deviation)")


class DriftRow(BenchRow):
    """Two federation groups on cores of their own run the loop loop_iters times, free, from a
    common barrier: how far apart they end."""

    phase: Literal["drift"]
    concurrent: int | None = None
    flops: Number
    hidden: int | None = None
    ffn_hidden: int | None = None
    nbytes: int
    group_size: int | None = None
    loop_iters: int
    time_s: float = Field(description="a round: a group's last member's end from the barrier")
    gflops_per_s: float | None = None
    samples: int = 0
    drift_rms_s: float = Field(description="root mean square of group 0's end minus group 1's")
    drift_mean_abs_s: float | None = Field(
        None, description="mean size of the difference (absent in the first version)")
    drift_mean_s: float | None = Field(None, description="mean difference: group 0 - group 1")


class CheckRow(BenchRow):
    """Host costs of TORCH_DISTRIBUTED_DEBUG=DETAIL for a group of group_size ranks."""

    group_size: int
    nodes: int | None = None
    all_gather_tiny_s: float | None = None
    all_reduce_tiny_detail_s: float | None = None
    all_reduce_tiny_off_s: float | None = None
    monitored_barrier_s: float | None = None
    detail_check_s: float | None = Field(
        None, description="all_reduce_tiny_detail_s - all_reduce_tiny_off_s")


class UnitRow(BenchRow):
    """One FSDP unit of the scenario's model as training wraps it, on a 1-rank mesh."""

    unit: int | None = Field(
        None, description="ModelSpec.units index: 0 = root, 1.. = decoder layers")
    name: str | None = None
    kind: str = Field("unit", description="root | layer")
    phase: str = Field(description="forward | backward")
    params: int | None = None
    flops: Number = Field(description="ModelSpec.units FLOPs x tokens")
    tokens: int | None = Field(None, description="micro_batch x seq_len")
    time_s: float = Field(description="wall")
    min_time_s: float | None = None
    cpu_time_s: float | None = Field(None, description="process CPU time")
    samples: int = 0
    gflops_per_s: float | None = None
    ranks_per_node: int | None = None
    cores: int | None = Field(None, description="per rank")
    concurrent: int | None = Field(None, description="ranks computing at once")
    alone_time_s: float | None = Field(
        None, description="one rank per node computing, the others idle")
    alone_cpu_time_s: float | None = None


class ModelRow(BenchRow):
    """The whole model, plain and with the unit hooks."""

    phase: str
    params: int | None = None
    flops: Number | None = None
    time_s: float | None = Field(None, description="plain whole-model pass, no hooks")
    samples: int | None = None
    cpu_time_s: float | None = None
    hooked_time_s: float | None = Field(None, description="whole pass with the unit hooks")
    units_sum_s: Number | None = Field(None, description="sum of the units' time_s")
    alone_time_s: float | None = Field(None, description="hooked, one rank per node")
    units_sum_ratio: float | None = Field(None, description="units_sum_s / time_s")


class OptimizerRow(BenchRow):
    """The optimizer step + LR step + zero_grad of one rank's shard."""

    shard: int | None = None
    params: int = Field(description="one rank's local parameters")
    tensors: int | None = None
    time_s: float
    min_time_s: float | None = None
    cpu_time_s: float | None = None
    samples: int = 0
    first_time_s: float | None = Field(
        None, description="the first step: state allocation and DTensor's cold caches")


class FedavgRow(BenchRow):
    """FedAvg's local work besides its all-reduce (flatten, divide, copy back)."""

    shard: int | None = None
    nbytes: int = Field(description="the FedAvg buffer")
    params: int | None = None
    tensors: int | None = None
    fedavg_dtype: str | None = None
    time_s: float
    min_time_s: float | None = None
    cpu_time_s: float | None = None
    samples: int = 0


AnyComputeRow = Annotated[ComputeRow | LoopRow | DriftRow, Field(discriminator="phase")]


class BenchSummary(BenchRow):
    """The whole summary: rank 0's trace header (plus bench_wall_s) and the tables."""

    meta: dict[str, Any] = Field(default_factory=dict)
    comm: list[CommRow] = Field(default_factory=list)
    compute: list[AnyComputeRow] = Field(default_factory=list)
    checks: list[CheckRow] = Field(default_factory=list)
    units: list[UnitRow] = Field(default_factory=list)
    model: list[ModelRow] = Field(default_factory=list)
    optimizer: list[OptimizerRow] = Field(default_factory=list)
    fedavg: list[FedavgRow] = Field(default_factory=list)

    @classmethod
    def parse(cls, data: Any, where: str) -> BenchSummary:
        """A summary read back (a SpecError of one line naming the row and field otherwise):
        typed rows whose numbers are ones calibration can use (`check_read`)."""
        try:
            summary = cls.model_validate(data)
        except ValidationError as exc:
            raise SpecError(f"{where}: {one_line(exc, cls)}") from None
        summary.check_read(where)
        return summary

    def check_read(self, where: str) -> None:
        """The numbers of a summary read back, as calibration divides by and fits them: every
        one finite; counts, sizes, FLOPs and measured times above zero; the geometry in `meta`
        (nodes, ranks_per_node, cores) whole numbers in range; no group larger than the world.
        The writer (realrun.bench_summary) is not held to this: a run's odd measurement still
        lands in its summary, and reading it back names the row and field."""
        world = _check_meta(self.meta, where)
        for table in ("comm", "compute", "checks", "units", "model", "optimizer", "fedavg"):
            for i, row in enumerate(getattr(self, table)):
                for name in type(row).model_fields:
                    v = getattr(row, name)
                    if isinstance(v, bool) or not isinstance(v, int | float):
                        continue
                    bad = _bad_number(name, v)
                    if bad:
                        raise SpecError(f"{where}: {table}[{i}].{name}: {bad}, got {v!r}")
                size = getattr(row, "group_size", None)
                if world and size is not None and size > world:
                    raise SpecError(f"{where}: {table}[{i}].group_size: {size} ranks in a "
                                    f"bench of {world} (meta: nodes x ranks_per_node)")


MAX_NBYTES = 2**50  # 1 PiB: far above any buffer a bench moves, small enough to stay finite
MAX_FLOPS = 1e21
MIN_TIME_S = 1e-9  # no clock a bench reads is finer than a nanosecond
# counts and sizes: whole and at least 1 (with the most a summary may hold)
_COUNTS = {"group_size": MAX_WORLD, "nodes": MAX_WORLD, "concurrent_groups": MAX_WORLD,
           "concurrent": MAX_WORLD, "ranks_per_node": MAX_WORLD, "shard": MAX_WORLD,
           "nbytes": MAX_NBYTES, "params": 1e15, "tensors": 1e9, "tokens": 1e12,
           "loop_iters": 1e9, "hidden": 2**24, "ffn_hidden": 2**24, "cores": 1024}
_DIFFERENCES = {"drift_mean_s", "detail_check_s"}  # times that may be below zero


def _bad_number(name: str, v: float) -> str:
    """Why a row's number cannot be used ("" when it can)."""
    if not math.isfinite(v):
        return "not a finite number"
    if name in _COUNTS:
        return "" if 1 <= v <= _COUNTS[name] else f"expected 1 to {_COUNTS[name]:.4g}"
    if name == "flops":
        return "" if 0 < v <= MAX_FLOPS else f"expected above 0 and at most {MAX_FLOPS:.4g}"
    if name in ("time_s", "coll_time_s"):  # a measured time
        return "" if MIN_TIME_S <= v <= MAX_TIME_S else \
            f"expected a measured time of {MIN_TIME_S:g} to {MAX_TIME_S:g} s"
    if name.endswith("_s") and "_per_" not in name:  # a time (not a rate: gflops_per_s)
        lo = -MAX_TIME_S if name in _DIFFERENCES else 0.0
        return "" if lo <= v <= MAX_TIME_S else f"expected {lo:g} to {MAX_TIME_S:g} s"
    if v < 0:  # samples, rates, ratios, indices
        return "expected 0 or more"
    return ""


def _check_meta(meta: dict[str, Any], where: str) -> int:
    """The bench's geometry in `meta` (each key optional): nodes, ranks_per_node and world_size
    whole numbers from 1, cores and host_cores whole numbers from 0, the link rate finite and 0
    or more. Returns the world size (0 when meta does not say)."""
    def whole(key: str, lo: int, hi: int) -> int | None:
        v = meta.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
                or v != int(v) or not lo <= v <= hi:
            raise SpecError(f"{where}: meta.{key}: expected a whole number from {lo} to "
                            f"{hi:,}, got {v!r}")
        return int(v)

    nodes = whole("nodes", 1, MAX_WORLD)
    world_size = whole("world_size", 1, MAX_WORLD)
    per_node = whole("ranks_per_node", 1, MAX_WORLD)
    whole("cores", 0, 1024)
    whole("host_cores", 0, 1024)
    rate = meta.get("link_rate_Gbps")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float)
                             or not math.isfinite(rate)
                             or not (rate == 0 or MIN_LINK_GBPS <= rate <= MAX_LINK_GBPS)):
        raise SpecError(f"{where}: meta.link_rate_Gbps: expected 0 or null (the scenario's) or "
                        f"a rate from {MIN_LINK_GBPS:g} to {MAX_LINK_GBPS:,g} Gb/s, got {rate!r}")
    if nodes is not None and per_node is not None:
        if nodes * per_node > MAX_WORLD:
            raise SpecError(f"{where}: meta: {nodes} nodes x {per_node} ranks is more than "
                            f"{MAX_WORLD:,} ranks")
        return nodes * per_node
    return world_size or 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"meta": dict(self.meta)}
        for table in ("comm", "compute", "checks", "units", "model", "optimizer", "fedavg"):
            out[table] = [r.to_json() for r in getattr(self, table)]
        return out
