"""The scenario's cluster: GPUs, NVLink, NICs, nodes, the fabric, and the host cores an emulated
cluster's ranks share (`simfed.spec.scenario` re-exports every name)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field

from .schema import param

# a knot of fabric.shared_bandwidth: [job nodes >= 1, share of the bandwidth in (0, 1]]
SharedKnot = tuple[Annotated[float, Field(ge=1)], Annotated[float, Field(gt=0, le=1)]]

# ---------------------------------------------------------------------------------------------
# cluster


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    name: str = param("gpu")
    peak_tflops: float = param(gt=0, doc="dense peak TFLOP/s in the model dtype (bf16)")
    peak_tflops_fp32: float = param(0.0, ge=0, doc="dense fp32 peak (informational)")
    peak_tflops_fp8: float = param(
        0.0, ge=0, doc="dense FP8 tensor-core peak TFLOP/s (0: the GPU has no FP8 tensor cores; "
        "training.float8 needs it)")
    memory_GiB: float = param(gt=0)
    hbm_bw_GBps: float = param(gt=0, doc="memory bandwidth")
    sms: int = param(0, ge=0, doc="streaming multiprocessors (GEMM wave quantisation; 0 = "
                     "not modelled)")


@dataclass(frozen=True, kw_only=True)
class NvlinkSpec:
    topology: str = param(
        "switch", choices=("switch", "full_mesh"),
        doc="switch: any GPU pair gets the full bandwidth (NVSwitch); full_mesh: direct links "
        "split evenly among peers (A100 4-GPU boards)",
    )
    bw_GBps: float = param(gt=0, doc="per GPU, per direction, all links together")
    latency_us: float = param(2.0, ge=0)


@dataclass(frozen=True, kw_only=True)
class NicSpec:
    count: int = param(ge=1, doc="NIC rails per node")
    bw_Gbps: float = param(gt=0, doc="line rate per rail")
    latency_us: float = param(2.0, ge=0, doc="one-way latency node to node")


@dataclass(frozen=True, kw_only=True)
class NodeSpec:
    gpus: int = param(ge=1)
    gpu: GpuSpec
    nvlink: NvlinkSpec
    nics: NicSpec
    cpu_cores: int = param(0, ge=0, doc="host cores (0 = plenty); matters for CPU testbeds")


@dataclass(frozen=True, kw_only=True)
class FabricSpec:
    topology: str = param(
        "fat_tree", choices=("ideal", "fat_tree", "dragonfly_plus"),
        doc="ideal: non-blocking; fat_tree: leaves with over-subscribed uplinks; "
        "dragonfly_plus: groups (cells) of nodes joined by global links",
    )
    nodes_per_leaf: int = param(16, ge=1, doc="nodes under one leaf switch")
    oversubscription: float = param(1.0, ge=1, doc="leaf down:up bandwidth ratio")
    nodes_per_group: int = param(180, ge=1, doc="dragonfly_plus: nodes per group (cell)")
    global_taper: float = param(
        1.0, gt=0, doc="dragonfly_plus: global bandwidth leaving a group / its nodes' injection"
    )
    placement: str = param(
        "packed", choices=("packed", "spread"),
        doc="packed: job nodes fill leaves/groups in order; spread: round-robin over them",
    )
    switch_latency_us: float = param(0.5, ge=0, doc="added per switch hop")
    switch_capacity_Gbps: float = param(
        0.0, ge=0, doc="aggregate forwarding capacity of a leaf switch for the inter-node "
        "traffic of its nodes (0 = non-blocking); e.g. a software bridge")
    shared_bandwidth: tuple[SharedKnot, ...] = param(
        (), doc="a fabric shared with other jobs: the share of its quiet inter-node bandwidth a "
        "collective over n nodes gets, as knots [nodes, share] piecewise-linear in log2(nodes) "
        "and held beyond the first and last knot (measured as the ratio of NCCL all-reduce "
        "bandwidth on the default InfiniBand service level to a quiet one); empty: a fabric "
        "the job has to itself")
    loaded_step_us: float = param(
        0.0, ge=0, doc="model nccl: latency each network step of a collective adds beyond NCCL's "
        "tuning model on this fabric under a training job's load (congestion, adaptive routing, "
        "proxy progress), paid per step of the algorithm NCCL picked once it crosses nodes (a "
        "ring over n ranks: n - 1, all-reduce 2(n - 1); a tree over n nodes: 2 log2 n); NCCL "
        "picks without it; see loaded_step_scope. Fitted "
        "from a cluster's published scale studies (0: NCCL's model as is)")
    loaded_step_scope: str = param(
        "leaves", choices=("leaves", "nodes"),
        doc="where loaded_step_us applies: leaves, once a collective's nodes span more than "
        "one leaf switch (packed placement fills a leaf before the next; spread deals nodes "
        "over leaves; an ideal fabric has no leaves): traffic under one leaf switch crosses no "
        "link that other jobs share; nodes: once it crosses nodes")
    tree_level_us: float = param(
        0.0, ge=0, doc="model nccl: latency each level of a tree (PAT, NVLS) across nodes adds "
        "beyond NCCL's tuning model on this fabric even measured alone (2 log2 n levels over n "
        "nodes; rings pay none), from where loaded_step_scope says; a tree pays the larger of "
        "this and loaded_step_us. Fitted from a cluster's NCCL all-reduce by message size "
        "(0: NCCL's model as is)")
    nodes_per_island: int = param(
        0, ge=0, doc="nodes in one island: the part of the fabric below its top switch layer (a "
        "three-layer fat tree's pod); 0: the fabric is one island")
    loaded_step_island_us: float = param(
        0.0, ge=0, doc="model nccl: latency each step of a collective that spans more than one "
        "island adds to loaded_step_us (its traffic crosses the shared top layer); needs "
        "nodes_per_island. Fitted from a cluster's published scale studies")


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    name: str = param("cluster")
    nodes: int = param(ge=1)
    node: NodeSpec
    fabric: FabricSpec = FabricSpec()
    host_cores: int = param(
        0, ge=0, doc="an emulated cluster on one host (realrun testbed): the host's cores, "
        "which node.cpu_cores per node are handed out over in turn; 0 = every node has its own")

    @property
    def world(self) -> int:
        return self.nodes * self.node.gpus

    @property
    def ranks_per_core(self) -> float:
        """Most ranks one host core carries when every rank runs at once (1.0: a core each)."""
        if self.node.cpu_cores <= 0 and self.host_cores <= 0:
            return 1.0
        period = _core_period(self.node.cpu_cores, self.host_cores)
        if not period:  # nodes with cores of their own: all alike, one stands for every node
            return _core_load({0: self.node.gpus}, self.node.cpu_cores, 0)
        per_residue = {m: self.node.gpus * len(range(m, self.nodes, period))
                       for m in range(min(period, self.nodes))}
        return _core_load(per_residue, self.node.cpu_cores, self.host_cores)

    def node_cores(self) -> tuple[frozenset[int], ...]:
        """Per node, the host cores its ranks run on (empty: cores are not modelled). Cores are
        modelled only on an emulated cluster (`host_cores`): nodes with cores of their own share
        none with another node, and federation groups are whole nodes, so no rank ever meets
        another group's ranks on a core (and no per-core structure is built for 10^5 nodes)."""
        if self.host_cores <= 0:
            return ()
        return tuple(node_cores(n, self.node.cpu_cores, self.host_cores)
                     for n in range(self.nodes))


def node_cores(node: int, cpu_cores: int, host_cores: int) -> frozenset[int]:
    """The host cores of a node's ranks: its `cpu_cores` handed out in turn over `host_cores`
    (as `realrun testbed` pins them; a set: more cores than the host has count each once), all
    of the host's when unpinned; empty when neither is given (cores are plenty)."""
    if cpu_cores <= 0:
        return frozenset(range(host_cores))
    first = node * cpu_cores
    return frozenset((first + j) % host_cores if host_cores else first + j
                     for j in range(cpu_cores))


def _core_period(cpu_cores: int, host_cores: int) -> int:
    """Nodes n and n + period run on the same host cores (`node_cores`); 0: never (own cores)."""
    if host_cores <= 0:
        return 0
    if cpu_cores <= 0:
        return 1
    return host_cores // math.gcd(cpu_cores, host_cores)


def _core_load(ranks_by_node: Mapping[int, int], cpu_cores: int, host_cores: int) -> float:
    """Most ranks one core carries, from the count of running ranks per node (per node residue
    modulo `_core_period` on an emulated cluster: those nodes share their cores)."""
    load: dict[int, float] = {}
    for node, count in ranks_by_node.items():
        cores = node_cores(node, cpu_cores, host_cores)
        if not host_cores:  # a node's own cores: evenly loaded, shared with no other node
            load[node] = count / len(cores)
            continue
        for c in cores:
            load[c] = load.get(c, 0.0) + count / len(cores)
    return max([1.0, *load.values()])


def ranks_per_core(ranks: Iterable[int], gpus_per_node: int, cpu_cores: int,
                   host_cores: int) -> float:
    """Most of `ranks` one host core carries when they run at once, each node's ranks spread
    over its cores (`node_cores`); 1.0 at least (a rank never runs faster for having a core to
    itself)."""
    if cpu_cores <= 0 and host_cores <= 0:
        return 1.0
    period = _core_period(cpu_cores, host_cores)
    counts: dict[int, int] = {}
    for r in ranks:
        node = r // gpus_per_node
        key = node % period if period else node
        counts[key] = counts.get(key, 0) + 1
    return _core_load(counts, cpu_cores, host_cores)


def node_block_groups(nodes: int, per_node: int, block: int) -> list[list[int]]:
    """Groups of one rank per node over each block of `block` consecutive nodes (ranks numbered
    node by node): FL+FSDP's shard groups when a federation group of `block` nodes shards with
    one rank per node; blocks in order, then node positions."""
    return [[loc + i * per_node for i in range(blk * block, (blk + 1) * block)]
            for blk in range(nodes // block) for loc in range(per_node)]
