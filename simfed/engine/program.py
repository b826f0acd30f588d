"""The per-step program each rank's host thread issues, as FSDP1 or FSDP2 issues it.

An op goes to one GPU stream (compute, or the stream of one process group's communicator: shard,
replicate, fed) in host order; ops on a stream run in issue order; `deps` are cross-stream waits
(CUDA events). Host-only ops model per-step host work and host/GPU synchronisation points.

FSDP1 (FULL_SHARD / HYBRID_SHARD) as the paper's code configures it:
- forward, per unit: all-gather (pre-forward), forward compute, reshard (free) after forward; the
  root unit (embedding, norm, head) stays unsharded until the end of backward (unless
  `reshard_root_after_forward`: then backward gathers it again first). With
  forward_prefetch the next unit's all-gather is issued before this unit's compute.
- backward, per unit in reverse: all-gather (pre-backward hook), backward compute, reduce-scatter
  (post-backward hook); HYBRID_SHARD then all-reduces the gradient shard over the replica group
  on its own stream after the reduce-scatter. Without backward prefetch the next unit's
  all-gather is issued after this unit's reduce-scatter on the same communicator, so it waits for
  it: backward communication serialises with compute. `pre` issues it before this unit's
  compute; `post` after the compute but before the reduce-scatter.
- optimizer step after every gradient is reduced; FedAvg (federated algorithms, every K steps):
  one all-reduce of the local parameter shard over the fed group after the optimizer, blocking;
  with an outer optimizer (DiLoCo), an elementwise Nesterov step on the shard after it.

FSDP2 (`fully_shard`, `training.fsdp_version: 2`; PyTorch 2.13,
torch/distributed/fsdp/_fully_shard/) issues the same collectives in the same order on one
communicator per process group, but limits its all-gathers with CUDA events instead of
FSDP1's CPU-side rate limiter, so the host never waits (`limit_all_gathers` is FSDP1's):
- forward: `FSDPParamGroup.wait_for_unshard` (_fsdp_param_group.py lines 430-432 and 476-485)
  keeps the all-gather result of unit u until the next unit's copy-out and makes the
  all-gather streams wait for unit u-1's copy-out event, so unit u+1's all-gather (issued by
  the implicit or explicit forward prefetch after it) waits for unit u-1's copy-out, the start
  of its forward: two all-gathers in flight ahead of the compute. Here the all-gather of layer
  u depends on the compute op before `forward u-2` on the compute stream.
- backward: in backward `wait_for_unshard` makes the all-gather streams wait for unit u+1's
  copy-out at once (lines 486-487), and `pre_backward` prefetches unit u after it (lines 576-585,
  `_backward_prefetch` lines 795-831): the all-gather of layer u depends on the compute op
  before `backward u+1`.
- the reduce-scatter input buffers (`reduce_scatter_max_input_buffers`, lines 640-658: the
  compute stream waits for the previous unit's reduce-scatter in each post-backward) add no
  wait here: that reduce-scatter precedes the next all-gather the compute waits for on the
  same communicator.
- the root stays unsharded after forward (_fsdp_state.py line 207, `_lazy_init`: "For the
  root, do not reshard after forward"; in 2.13 unless fully_shard was given
  reshard_after_forward for the root, in the 2024 releases always:
  torch/distributed/_composable/fsdp/_fsdp_state.py `_lazy_init` at 325b98f), as FSDP1's
  does here.
With `algorithms[].reshard_last_layer_after_forward: false` (torchtitan's wrap policy,
parallelize_llama.py `apply_fsdp` at eef8bb2, lines 321-323) the last decoder layer is not
resharded after forward and its backward needs no all-gather.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ..spec.plan import FED, REPLICATE, SHARD
from ..spec.scenario import AlgorithmSpec, CommRuntime, HostRuntime
from ..spec.trace import PHASES
from ..spec.units import dtype_nbytes


class OpKind(enum.Enum):
    """What an op of the step program is (not a process-group or a link kind)."""

    COMPUTE = "compute"  # a kernel on the compute stream
    COLLECTIVE = "collective"  # a collective on its process group's stream
    SYNC = "sync"  # the host waits for ops to end (loss.item(), a blocking FedAvg)
    HOST_WORK = "host_work"  # host-only work of a known duration (data loading, logging)


STREAMS = ("compute", SHARD, REPLICATE, FED)
STREAM_OF = {name: i for i, name in enumerate(STREAMS)}
FWD, BWD, OPT, AGG, OTHER = (PHASES.index(p) for p in
                             ("forward", "backward", "optimizer", "aggregation", "other"))


@dataclass(slots=True)
class Op:
    idx: int
    kind: OpKind
    stream: int  # index into STREAMS; -1 for host-only ops
    phase: int
    name: str
    unit: int = -1
    deps: tuple[int, ...] = ()
    waits: tuple[int, ...] = ()  # SYNC: ops the host waits for
    duration_s: float = 0.0  # COMPUTE (before the straggler factor) and HOSTWORK
    host_s: float = 0.0  # host time to issue the op
    collective: str = ""  # COLLECTIVE: all_gather | reduce_scatter | all_reduce
    pg: str = ""  # process-group kind
    nbytes: int = 0  # S: gathered / unreduced / reduced buffer size
    host_waits: int = -1  # the host waits for this op's end before issuing (rate limiter)
    alloc_unit: int = -1  # unsharded buffer of this unit allocated when the op starts
    free_unit: int = -1  # ... and freed when it ends
    after_prev_step: bool = False  # waits for the previous step's last op (parameter update)
    timer_stop: bool = False  # SYNC: a host timer around the step call stops before its wait


@dataclass
class Program:
    ops: list[Op]
    stream_ops: list[list[Op]] = field(default_factory=list)
    last: int = -1  # index of the op that ends the step on the GPU
    _indices: dict[OpKind, tuple[int, ...]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.stream_ops = [[o for o in self.ops if o.stream == s] for s in range(len(STREAMS))]
        self._indices = {kind: tuple(o.idx for o in self.ops if o.kind is kind)
                         for kind in OpKind}
        self.last = max(
            (o.idx for o in self.ops if o.kind in (OpKind.COMPUTE, OpKind.COLLECTIVE)), default=-1
        )

    def indices(self, kind: OpKind) -> tuple[int, ...]:
        """The indices of the ops of this kind, in program order."""
        return self._indices[kind]


@dataclass(frozen=True, kw_only=True)
class StepTimes:
    """What the program builder needs to know about units and the plan."""

    forward_s: tuple[float, ...]  # per unit, root first
    backward_s: tuple[float, ...]
    unit_nbytes: tuple[int, ...]
    optimizer_s: float
    shard: int
    replicate: int
    groups: int
    shard_params: int
    fedavg_local_s: float = 0.0  # flatten/cast/divide/copy-back around the FedAvg all-reduce
    reduce_factor: float = 1.0  # gradient reduce dtype bytes / parameter dtype bytes
    gather_nbytes: tuple[int, ...] = ()  # all-gathered bytes per unit (float8; () = unit_nbytes)
    outer_s: float = 0.0  # the outer optimizer's elementwise step after the average (DiLoCo)
    # the trainer's host-read collectives and metric sync after each step's loss read
    # (training.host_reductions, metric_sync_states): host time with the GPU idle
    trainer_sync_s: float = 0.0


def build_program(
    alg: AlgorithmSpec, t: StepTimes, host: HostRuntime,
    launch_s_per_unit: float, aggregate: bool, comm: CommRuntime | None = None,
    fsdp_version: int = 1,
) -> Program:
    ops: list[Op] = []

    def add(**kw) -> Op:
        op = Op(idx=len(ops), **kw)
        ops.append(op)
        return op

    n_units = len(t.unit_nbytes)
    layers = list(range(1, n_units))
    sharded = t.shard > 1
    hybrid = t.replicate > 1
    # SHARD_GRAD_OP (ZeRO-2): parameters stay gathered from forward to backward (no reshard
    # after forward, no backward all-gather); gradients are still reduce-scattered
    keep = sharded and alg.sharding == "grad_op"
    # the last decoder layer kept unsharded from its forward to its backward (torchtitan)
    keep_last = sharded and not keep and not alg.reshard_last_layer_after_forward
    last_layer = n_units - 1

    gathers: list[Op] = []  # all-gathers in issue order, for the rate limiter

    def all_gather(unit: int, phase: int) -> Op | None:
        """Unshard a unit; the compute op that consumes it frees it (reshard). With
        limit_all_gathers, FSDP1's host waits until the buffer gathered two all-gathers ago
        has been freed (at most two in flight)."""
        if not sharded:
            return None
        # the step's first all-gather reads parameters the previous step's update wrote
        op = add(kind=OpKind.COLLECTIVE, stream=STREAM_OF[SHARD], phase=phase,
                 name=f"all_gather u{unit}",
                 unit=unit, collective="all_gather", pg=SHARD,
                 nbytes=(t.gather_nbytes or t.unit_nbytes)[unit],
                 alloc_unit=unit, after_prev_step=unit == 0 and phase == FWD)
        gathers.append(op)
        return op

    # ---- other: per-step host work (data loading, logging) ----------------------------
    # The trainer's sync after the previous step's loss read (sync_per_step: the GPU has
    # drained) comes first; charged at the start of each step, the steady state is the same.
    if t.trainer_sync_s > 0:
        add(kind=OpKind.HOST_WORK, stream=-1, phase=OTHER, name="trainer sync (metrics)",
            duration_s=t.trainer_sync_s)
    if host.step_overhead_ms > 0:
        add(kind=OpKind.HOST_WORK, stream=-1, phase=OTHER, name="step overhead",
            duration_s=host.step_overhead_ms * 1e-3)

    # ---- forward ------------------------------------------------------------------------
    ag_fwd: dict[int, Op | None] = {0: all_gather(0, FWD)}
    for i in layers:
        if i not in ag_fwd:
            ag_fwd[i] = all_gather(i, FWD)
        if alg.forward_prefetch and i + 1 < n_units and i + 1 not in ag_fwd:
            ag_fwd[i + 1] = all_gather(i + 1, FWD)
        ag = ag_fwd[i]
        kept = keep or (keep_last and i == last_layer)
        add(kind=OpKind.COMPUTE, stream=0, phase=FWD, name=f"forward u{i}", unit=i,
            deps=(ag.idx,) if ag else (), duration_s=t.forward_s[i], host_s=launch_s_per_unit,
            free_unit=i if sharded and not kept else -1)
    ag0 = ag_fwd[0]
    reshard_root = sharded and alg.reshard_root_after_forward
    head = add(kind=OpKind.COMPUTE, stream=0, phase=FWD, name="forward root (head, loss)", unit=0,
               deps=(ag0.idx,) if ag0 else (), duration_s=t.forward_s[0],
               host_s=launch_s_per_unit, free_unit=0 if reshard_root else -1)
    if host.sync_per_phase:
        add(kind=OpKind.SYNC, stream=-1, phase=FWD, name="loss.item()", waits=(head.idx,))

    # ---- backward -----------------------------------------------------------------------
    ag_root = all_gather(0, BWD) if reshard_root else None
    bwd_root = add(kind=OpKind.COMPUTE, stream=0, phase=BWD, name="backward root (head)", unit=0,
                   deps=(ag_root.idx,) if ag_root else (), duration_s=t.backward_s[0],
                   host_s=launch_s_per_unit)
    reduced: list[int] = []
    ag_bwd: dict[int, Op | None] = {}

    def reduce(unit: int, after: Op) -> None:
        if sharded:
            rs = add(kind=OpKind.COLLECTIVE, stream=STREAM_OF[SHARD], phase=BWD,
                     name=f"reduce_scatter u{unit}",
                     unit=unit, deps=(after.idx,), collective="reduce_scatter", pg=SHARD,
                     nbytes=int(t.unit_nbytes[unit] * t.reduce_factor))
            last = rs
        else:
            last = after
        if hybrid:
            ar = add(kind=OpKind.COLLECTIVE, stream=STREAM_OF[REPLICATE], phase=BWD,
                     name=f"all_reduce u{unit}", unit=unit, deps=(last.idx,),
                     collective="all_reduce", pg=REPLICATE,
                     nbytes=int(-(-t.unit_nbytes[unit] // t.shard) * t.reduce_factor))
            last = ar
        reduced.append(last.idx)

    prev_b = bwd_root
    for i in reversed(layers):
        if i not in ag_bwd:
            ag_bwd[i] = None if keep or (keep_last and i == last_layer) else all_gather(i, BWD)
        if alg.backward_prefetch == "pre" and i - 1 >= 1 and i - 1 not in ag_bwd:
            ag_bwd[i - 1] = None if keep else all_gather(i - 1, BWD)
        ag = ag_bwd[i]
        b = add(kind=OpKind.COMPUTE, stream=0, phase=BWD, name=f"backward u{i}", unit=i,
                deps=(ag.idx,) if ag else (), duration_s=t.backward_s[i],
                host_s=launch_s_per_unit, free_unit=i if sharded else -1)
        if alg.backward_prefetch == "post" and i - 1 >= 1 and i - 1 not in ag_bwd:
            ag_bwd[i - 1] = None if keep else all_gather(i - 1, BWD)
        reduce(i, b)
        prev_b = b
    # the root's gradient (embedding, tied head) is complete after the embedding backward
    embed = add(kind=OpKind.COMPUTE, stream=0, phase=BWD, name="backward root (embedding)", unit=0,
                deps=(prev_b.idx,), duration_s=0.0, free_unit=0 if sharded else -1)
    reduce(0, embed)
    if host.sync_per_phase or host.sync_before_optimizer:
        add(kind=OpKind.SYNC, stream=-1, phase=BWD, name="backward done", waits=tuple(reduced))

    # ---- optimizer ----------------------------------------------------------------------
    opt = add(kind=OpKind.COMPUTE, stream=0, phase=OPT, name="optimizer step", deps=tuple(reduced),
              duration_s=t.optimizer_s, host_s=launch_s_per_unit)
    if host.sync_per_phase:
        add(kind=OpKind.SYNC, stream=-1, phase=OPT, name="optimizer done", waits=(opt.idx,))

    # ---- aggregation (FedAvg) -----------------------------------------------------------
    if aggregate and t.groups > 1:
        nbytes = t.shard_params * dtype_nbytes(alg.fedavg_dtype)
        agg = add(kind=OpKind.COLLECTIVE, stream=STREAM_OF[FED], phase=AGG,
                  name="fedavg all_reduce",
                  deps=(opt.idx,), collective="all_reduce", pg=FED, nbytes=nbytes)
        avg = add(kind=OpKind.COMPUTE, stream=0, phase=AGG, name="fedavg divide", deps=(agg.idx,),
                  duration_s=t.fedavg_local_s)
        if t.outer_s > 0:  # Nesterov momentum on the averaged delta, elementwise on the shard
            avg = add(kind=OpKind.COMPUTE, stream=0, phase=AGG, name="outer optimizer (nesterov)",
                      deps=(avg.idx,), duration_s=t.outer_s)
        add(kind=OpKind.SYNC, stream=-1, phase=AGG, name="fedavg done (blocking)", waits=(avg.idx,))
    if host.sync_per_step:  # the trainer reads the loss: the host waits for the whole step
        add(kind=OpKind.SYNC, stream=-1, phase=AGG, name="step done (loss read)",
            waits=tuple(o.idx for o in ops if o.stream >= 0), timer_stop=True)
    if comm is not None and not comm.overlap_compute:
        for op in ops:  # CPU collectives block the rank: one stream for everything
            if op.stream > 0:
                op.stream = 0
    if fsdp_version == 2:
        _fsdp2_gather_waits(ops, gathers)
    elif alg.limit_all_gathers:
        for k, ag in enumerate(gathers):
            if k >= 2 and gathers[k - 2].unit != 0:  # the root stays unsharded
                prev = gathers[k - 2]
                frees = [o for o in ops[prev.idx:] if o.free_unit == prev.unit]
                if frees and frees[0].idx < ag.idx:
                    ag.host_waits = frees[0].idx
    return Program(ops)


def _fsdp2_gather_waits(ops: list[Op], gathers: list[Op]) -> None:
    """FSDP2's all-gather waits (see the module note), as GPU-side dependencies on the compute
    op before a unit's copy-out; the host does not wait.
    - forward: layer u's all-gather waits for unit u-2's copy-out (the root's follows its
      all-gather at once, before the first layer: no wait).
    - backward: an all-gather waits for the latest copy-out before it was issued: that of the
      unit whose backward prefetches it (layer u+1), if that unit was gathered for backward;
      else (the first backward gathers, or after a layer kept unsharded) the last layer's
      forward copy-out, which the root's post-forward makes the all-gather streams wait for
      (_fsdp_state.py lines 335-342)."""
    compute = [o for o in ops if o.stream == 0]
    if any(o.kind is OpKind.COLLECTIVE for o in compute):
        return  # CPU collectives block the rank: one stream, nothing runs ahead anyway
    before: dict[tuple[int, int], Op | None] = {}
    prev: Op | None = None
    for o in compute:
        if o.kind is OpKind.COMPUTE and o.unit > 0 and o.phase in (FWD, BWD):
            before.setdefault((o.phase, o.unit), prev)
        prev = o
    last = max((o.unit for o in gathers if o.phase == FWD), default=0)
    gathered_bwd = {o.unit for o in gathers if o.phase == BWD}
    for ag in gathers:
        if ag.phase == FWD:
            key = (FWD, ag.unit - 2) if ag.unit > 2 else None
        elif ag.unit > 0 and ag.unit + 1 in gathered_bwd:
            key = (BWD, ag.unit + 1)
        else:
            key = (FWD, last) if last > 0 else None
        waited = before.get(key) if key is not None else None
        if waited is not None and waited.idx < ag.idx and waited.idx not in ag.deps:
            ag.deps = (*ag.deps, waited.idx)
