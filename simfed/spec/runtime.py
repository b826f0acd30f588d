"""The scenario's runtime behaviour: compute, collectives, host and memory settings (what
calibration fits; `simfed.spec.scenario` re-exports every name)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field, PositiveFloat

from .ops import DOMAINS, CollectiveOp, Domain  # noqa: F401 - DOMAINS re-exported
from .schema import param
from .shared_cores import SharedCoresSpec

# NCCL's (algorithm, protocol) choices as "algorithm/protocol" (simfed/collectives/nccl.py)
NcclChoiceKey = Literal["ring/LL", "ring/LL128", "ring/Simple", "tree/LL", "tree/LL128",
                        "tree/Simple", "pat/Simple", "nvls/Simple"]
# one knot of a bandwidth-efficiency curve: message size (bytes), factor on the bandwidth
CurveKnot = tuple[Annotated[float, Field(ge=1)], Annotated[float, Field(gt=0, le=1.2)]]
# a GEMM output tile: rows, cols, efficiency relative to the best tile
GemmTile = tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)],
                 Annotated[float, Field(gt=0, le=1)]]


# ---------------------------------------------------------------------------------------------
# runtime behaviour (what calibration fits)


@dataclass(frozen=True, kw_only=True)
class ComputeRuntime:
    efficiency_forward: float = param(0.5, gt=0, le=1, doc="achieved / peak FLOP/s, forward")
    efficiency_backward: float = param(0.5, gt=0, le=1, doc="achieved / peak FLOP/s, backward")
    optimizer_hbm_efficiency: float = param(0.7, gt=0, le=1, doc="optimizer step: achieved HBM")
    causal_skip: bool = param(True, doc="attention kernels skip the masked half")
    launch_us_per_unit: float = param(0.0, ge=0, doc="host time to launch one unit's kernels")
    unit_overhead_forward_us: float = param(
        0.0, ge=0, doc="fixed device time per unit forward (framework overhead; CPU ranks)")
    unit_overhead_backward_us: float = param(0.0, ge=0, doc="... per unit backward")
    optimizer_overhead_us: float = param(0.0, ge=0, doc="fixed time per optimizer step")
    model: str = param(
        "constant", choices=("constant", "kernels"),
        doc="constant: a unit's FLOPs at efficiency_forward/backward; kernels: each unit as "
        "its kernels (GEMMs by shape at gemm_efficiency with tile and wave quantisation, "
        "attention at attention_efficiency_*, memory-bound kernels at hbm_efficiency)")
    gemm_efficiency: float = param(
        0.8, gt=0, le=1, doc="kernels: a large, well-shaped bf16 GEMM's achieved / peak FLOP/s")
    gemm_tiles: tuple[GemmTile, ...] = param(
        ((256, 128, 1.0), (128, 128, 0.95), (128, 64, 0.85)), min_length=1,
        doc="kernels: output tiles (rows, cols, relative efficiency) a GEMM library picks "
        "from; the best of tile-quantisation x wave-quantisation x relative efficiency wins")
    gemm_efficiency_fp8_relative: float = param(
        0.88, gt=0, le=1.5, doc="kernels, training.float8: a large float8 GEMM's achieved "
        "fraction of the FP8 peak over a bf16 GEMM's of the bf16 peak (stas00/ml-engineering "
        "compute/accelerator/README.md @744d01e, maximum achievable matmul FLOPS, H100 SXM, "
        "torch 2.7.0+cu126: FP8 1402.6 of 1979 = 70.9%, BF16 794.5 of 989 = 80.3%: 0.88)")
    attention_efficiency_forward: float = param(
        0.6, gt=0, le=1, doc="kernels: fused (flash) attention forward, achieved / peak")
    attention_efficiency_backward: float = param(
        0.5, gt=0, le=1, doc="kernels: fused attention backward, achieved / peak")
    triton_attention_slowdown_forward: float = param(
        1.4, ge=1, doc="kernels: time of training.attention=triton's forward / flash's (Dao "
        "2023, FlashAttention-2, sec. 4.1: FlashAttention-2 is 1.3-1.5x faster than "
        "FlashAttention in Triton in the forward pass, A100)")
    triton_attention_slowdown_backward: float = param(
        2.0, ge=1, doc="kernels: ... backward (same source: about 2x in the backward pass)")
    hbm_efficiency: float = param(
        0.8, gt=0, le=1, doc="kernels: memory-bound kernels' achieved / nominal HBM bandwidth")
    kernel_gap_us: float = param(
        0.0, ge=0, doc="kernels: idle GPU time between consecutive kernels of a unit")
    gpu_variation: float = param(
        0.0, ge=0, le=0.5, doc="relative standard deviation of GPU-to-GPU speed of one SKU "
        "(manufacturing and power management); ranks that meet at every step's collectives "
        "wait for their slowest: compute takes 1 + gpu_variation x E[max of n normals] for a "
        "synchronous group of n (a mean-field scale loss; stragglers.jitter simulates draws)")
    fedavg_local_GBps: float = param(
        0.0, ge=0, doc="FedAvg's local work (flatten, cast, divide, copy back) in bytes of the "
        "averaged buffer per second (0 = free)")


@dataclass(frozen=True, kw_only=True)
class CommRuntime:
    collective: str = param(
        "ring", choices=("ring", "hierarchical"),
        doc="collective algorithm of model alpha_beta (simfed.collectives.COLLECTIVES; checked "
        "whatever the model)")
    nvlink_efficiency: float = param(0.8, gt=0, le=1, doc="bus bandwidth / NVLink nominal")
    nic_efficiency: float = param(0.9, gt=0, le=1, doc="bus bandwidth / rail line rate")
    step_latency_us: float = param(5.0, ge=0, doc="software latency per ring step (NCCL)")
    launch_us: float = param(10.0, ge=0, doc="fixed cost per collective")
    model: str = param(
        "alpha_beta", choices=("alpha_beta", "nccl"),
        doc="alpha_beta: launch + steps x slowest hop + bytes over the ring's links; nccl: "
        "NCCL's own tuning model picks algorithm and protocol and charges each ring hop by its "
        "link class (simfed/collectives/nccl.py); bytes still share links in the flow network")
    nccl_version: str = param(
        "2.23", pattern=r"^[0-9]+(\.[0-9]+)+$",
        doc="NCCL release like 2.23 (decides which algorithms exist: PAT from 2.23)")
    nccl_channels: Annotated[int, Field(ge=1)] | Literal["auto"] = param(
        16, doc="NCCL channels (per-channel protocol caps); auto: NCCL's ring channels across "
        "nodes from the cluster's NICs (simfed/spec/nccl_channels.py: 16 on 8 NICs of 200-400 "
        "Gb/s, 8 on 4 NICs of 100-200 Gb/s)")
    nvls_allreduce_gain: float = param(
        1.30, gt=0, doc="NVLS all-reduce bus bandwidth / ring's inside an NVSwitch node")
    nccl_algorithms: tuple[Literal["ring", "tree", "pat", "nvls"], ...] = param(
        ("ring", "tree", "pat", "nvls"), min_length=1,
        doc="algorithms NCCL may pick (NCCL_ALGO)")
    nccl_bw_curve: dict[CollectiveOp, dict[NcclChoiceKey, dict[Literal["intra", "inter"],
                                                                 tuple[CurveKnot, ...]]]] = param(
        None, doc="model: nccl: a size-dependent bandwidth efficiency per collective, NCCL "
        "choice (algorithm/protocol as the model picks it) and domain (intra: one node, inter: "
        "across nodes): knots [size bytes, factor] piecewise-linear in log2(size), held beyond "
        "the first and last knot; the chosen protocol's bandwidth is multiplied by it (not the "
        "latency). Fitted from nccl-tests output by `simfed calibrate` "
        "(simfed/calibration/nccl_tests.py); missing: 1")
    sm_share: Annotated[float, Field(ge=0, le=1)] | Literal["auto"] = param(
        0.0, doc="share of a GPU's compute a running NCCL kernel takes from kernels "
        "overlapping it (its channels' SMs and HBM traffic); compute overlapped by FSDP's "
        "collectives runs 1 / (1 - sm_share x overlapped share) slower; auto: nccl_channels / "
        "cluster.node.gpu.sms (one block on one SM per channel), rounded to 0.001")
    overlap_compute: bool = param(
        True, doc="communication runs on its own streams (GPUs); false: collectives block the "
        "rank, as gloo's do on CPU")
    calls_per_unit: int = param(
        1, ge=1, le=1024, doc="collective calls a unit's all-gather / reduce-scatter / "
        "all-reduce is issued as, back to back (1: one flat buffer per unit, as FSDP; DeepSpeed "
        "ZeRO-3 before its coalesced collectives: one per parameter tensor): each call pays the "
        "collective's latency on its share of the bytes")
    list_copy_us: float = param(
        0.0, ge=0, doc="list-form collectives (torch.distributed.all_gather / reduce_scatter "
        "with a list of one tensor per rank): ProcessGroupNCCL copies each rank's tensor out of "
        "(into) a flat buffer, one copy_ per rank per call on the collective's stream; the cost "
        "of one such copy (0: flat collectives, no copies). A host-side cost that grows with "
        "the ranks of the group")
    latency_growth: bool = param(
        True, doc="model nccl: a ring's latency is its hops' summed (NCCL's model: it grows "
        "with the ranks); false: every ring charged as a ring over two nodes (for measuring "
        "what the growth costs)")
    reduce_scatter_impl: str = param(
        "reduce_scatter", choices=("reduce_scatter", "all_reduce"),
        doc="gloo implements reduce-scatter as a full all-reduce of the input")
    op_bw_factor: dict[CollectiveOp, PositiveFloat | dict[Domain, PositiveFloat]] = param(
        None, doc="per collective: achieved / modelled bandwidth, relative to all-reduce (gloo's "
        "all-gather moves its bytes slower than its all-reduce; realrun's gloo reduce-scatter is "
        "an all-reduce plus copies); a number, or {intra: f, inter: f} for collectives inside "
        "one node (loopback / NVLink) and across nodes, with intra_pair / inter_pair for rings "
        "of two ranks where they differ (gloo: one exchange each way with a single peer); "
        "missing: 1.0 (a pair without its own: the domain's)")

    @staticmethod
    def _per_op(table: dict | None, op: str, intra: bool, default: float,
                pair: bool = False) -> float:
        f = (table or {}).get(op, default)
        if isinstance(f, dict):
            dom = "intra" if intra else "inter"
            return float(f.get(f"{dom}_pair", f.get(dom, default)) if pair
                         else f.get(dom, default))
        return float(f)

    def bw_factor(self, op: str, intra: bool, pair: bool = False) -> float:
        """Achieved-bandwidth factor of collective `op` inside a node (`intra`) or across; a
        ring of two ranks (`pair`) may have its own."""
        return self._per_op(self.op_bw_factor, op, intra, 1.0, pair)


@dataclass(frozen=True, kw_only=True)
class HostRuntime:
    debug_checks: str = param(
        "off", choices=("off", "detail"),
        doc="TORCH_DISTRIBUTED_DEBUG=DETAIL: host-side fingerprint all-gather and monitored "
        "barrier on a gloo group before every collective",
    )
    gloo_hop_us: float = param(30.0, ge=0, doc="one gloo TCP message, one hop")
    gloo_rank0_msg_us: float = param(15.0, ge=0, doc="rank 0's cost per peer in monitoredBarrier")
    sync_per_phase: bool = param(
        True, doc="host waits for the GPU at each phase boundary (per-phase timers)"
    )
    sync_per_collective: bool = param(
        False, doc="host waits for every GPU op it issued before it issues a collective "
        "(torch.cuda.synchronize() before each all-gather call, as DeepSpeed ZeRO-3's "
        "_allgather_param did in 2021): no host run-ahead past a collective")
    step_overhead_ms: float = param(0.0, ge=0, doc="per-step host work (data, logging): Other")
    eager_op_us: float = param(
        5.0, ge=0, doc="one eager tensor op the host issues from Python (dispatch, allocation, "
        "one kernel launch); ASSUMPTION: the 5 us a kernel behind compute.launch_us_per_unit's "
        "60 (12 kernels). Used by the trainer's per-step metric sync "
        "(training.metric_sync_states)")
    sync_before_optimizer: bool = param(
        False, doc="host reads a value of the finished backward before the optimizer step (a "
        "gradient-norm check such as clip_grad_norm_(error_if_nonfinite=True)): it waits for "
        "the backward's last reduction")
    sync_per_step: bool = param(
        False, doc="host reads a result of each step (the loss) once the step is issued: it "
        "waits for the step's GPU work before the next step's host work, which the GPU then "
        "waits for")


@dataclass(frozen=True, kw_only=True)
class MemoryRuntime:
    overhead_GiB: float = param(2.0, ge=0, doc="CUDA context, NCCL buffers, allocator slack")
    fragmentation: float = param(
        0.0, ge=0, le=1, doc="caching-allocator fragmentation: reserved / allocated - 1 of the "
        "activations and unsharded buffers")


@dataclass(frozen=True, kw_only=True)
class RuntimeSpec:
    compute: ComputeRuntime = ComputeRuntime()
    comm: CommRuntime = CommRuntime()
    host: HostRuntime = HostRuntime()
    memory: MemoryRuntime = MemoryRuntime()
    shared_cores: SharedCoresSpec = SharedCoresSpec()  # ranks sharing host cores (CPU testbeds)
    provenance: dict[str, str] = param(None, doc="where each calibrated number came from")
