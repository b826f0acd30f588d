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

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .models import one_line
from .schema import SpecError

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
        """A summary read back (a SpecError of one line naming the row and field otherwise)."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise SpecError(f"{where}: {one_line(exc, cls)}") from None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"meta": dict(self.meta)}
        for table in ("comm", "compute", "checks", "units", "model", "optimizer", "fedavg"):
            out[table] = [r.to_json() for r in getattr(self, table)]
        return out
