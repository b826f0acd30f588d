"""Hardware in SI units: a GPU's FLOP/s and memory, a node's NVLink and NIC rails, the fabric.

Built once from the scenario's cluster section and runtime efficiencies; every number downstream
is in bytes, seconds, FLOP/s and bytes per second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .spec.scenario import ClusterSpec, RuntimeSpec
from .spec.units import GBps_to_Bps, GiB_to_bytes, gbps_to_Bps, tflops_to_flops, us_to_s


@dataclass(frozen=True, kw_only=True)
class Hardware:
    nodes: int
    gpus_per_node: int
    gpu_name: str
    peak_flops: float  # dense, model dtype
    memory_bytes: float
    hbm_Bps: float
    nvlink_topology: str  # "switch" | "full_mesh"
    nvlink_Bps: float  # per GPU, per direction, all links, nominal
    nvlink_latency_s: float
    rails: int
    rail_Bps: float  # per rail, nominal
    nic_latency_s: float
    nvlink_efficiency: float
    nic_efficiency: float
    fabric: str
    nodes_per_leaf: int
    oversubscription: float
    nodes_per_group: int
    global_taper: float
    placement: str
    switch_latency_s: float
    switch_Bps: float = 0.0  # leaf switch aggregate capacity (0: non-blocking)
    ranks_per_core: float = 1.0  # CPU testbeds: ranks sharing a host core when all run
    node_cores: tuple[frozenset[int], ...] = ()  # CPU testbeds: a node's host cores (or none)
    sms: int = 0  # streaming multiprocessors (0: not modelled)
    peak_flops_fp8: float = 0.0  # dense FP8 tensor-core peak (0: no FP8)
    # fabric shared with other jobs: (nodes, share of the quiet inter-node bandwidth) knots,
    # sorted by nodes
    shared_bandwidth: tuple[tuple[float, float], ...] = ()
    loaded_step_us: float = 0.0  # fabric.loaded_step_us
    loaded_step_scope: str = "leaves"  # fabric.loaded_step_scope
    tree_level_us: float = 0.0  # fabric.tree_level_us
    nodes_per_island: int = 0  # fabric.nodes_per_island (0: one island)
    loaded_step_island_us: float = 0.0  # fabric.loaded_step_island_us

    @classmethod
    def from_spec(cls, cluster: ClusterSpec, runtime: RuntimeSpec) -> Hardware:
        n = cluster.node
        f = cluster.fabric
        return cls(
            nodes=cluster.nodes,
            gpus_per_node=n.gpus,
            gpu_name=n.gpu.name,
            peak_flops=tflops_to_flops(n.gpu.peak_tflops),
            peak_flops_fp8=tflops_to_flops(n.gpu.peak_tflops_fp8),
            memory_bytes=GiB_to_bytes(n.gpu.memory_GiB),
            hbm_Bps=GBps_to_Bps(n.gpu.hbm_bw_GBps),
            nvlink_topology=n.nvlink.topology,
            nvlink_Bps=GBps_to_Bps(n.nvlink.bw_GBps),
            nvlink_latency_s=us_to_s(n.nvlink.latency_us),
            rails=n.nics.count,
            rail_Bps=gbps_to_Bps(n.nics.bw_Gbps),
            nic_latency_s=us_to_s(n.nics.latency_us),
            nvlink_efficiency=runtime.comm.nvlink_efficiency,
            nic_efficiency=runtime.comm.nic_efficiency,
            fabric=f.topology,
            nodes_per_leaf=f.nodes_per_leaf,
            oversubscription=f.oversubscription,
            nodes_per_group=f.nodes_per_group,
            global_taper=f.global_taper,
            placement=f.placement,
            switch_latency_s=us_to_s(f.switch_latency_us),
            switch_Bps=gbps_to_Bps(f.switch_capacity_Gbps),
            ranks_per_core=cluster.ranks_per_core,
            node_cores=cluster.node_cores(),
            sms=n.gpu.sms,
            shared_bandwidth=tuple(sorted((float(a), float(b)) for a, b in f.shared_bandwidth)),
            loaded_step_us=f.loaded_step_us,
            loaded_step_scope=f.loaded_step_scope,
            tree_level_us=f.tree_level_us,
            nodes_per_island=f.nodes_per_island,
            loaded_step_island_us=f.loaded_step_island_us,
        )

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    def nvlink_usable_fraction(self, local_ranks: int) -> float:
        """Share of a GPU's NVLink egress a collective with `local_ranks` GPUs of one node can
        use: all of it behind an NVSwitch; on a full mesh only the links to its peers,
        (q-1)/(g-1) of them (two GPUs of a 4-GPU A100 board share 4 of 12 links)."""
        if self.nvlink_topology == "switch" or self.gpus_per_node <= 1 or local_ranks <= 1:
            return 1.0
        return (local_ranks - 1) / (self.gpus_per_node - 1)

    def rails_used(self, local_ranks: int) -> int:
        """NIC rails a collective's ring uses on one node: one per participating GPU (NCCL
        picks the NIC nearest each GPU), at most the node's rail count."""
        return max(1, min(local_ranks, self.rails))

    def shared_bandwidth_share(self, nodes: int) -> float:
        """Share of the quiet inter-node bandwidth a collective over `nodes` nodes gets on a
        fabric shared with other jobs (`fabric.shared_bandwidth`): 1 inside a node or on a
        fabric of its own; else the knots, piecewise-linear in log2(nodes), held at the ends."""
        if nodes <= 1 or not self.shared_bandwidth:
            return 1.0
        pts = self.shared_bandwidth
        return float(np.interp(math.log2(nodes), [math.log2(a) for a, _ in pts],
                               [f for _, f in pts]))

    def loaded_step_s(self, nodes: int) -> float:
        """The latency each step of a collective over `nodes` nodes pays under a training job's
        load (fabric.loaded_step_us), from where fabric.loaded_step_scope says (more than one
        leaf switch, or more than one node), with the island term once it spans more than one
        island (fabric.loaded_step_island_us; nodes fill islands in order)."""
        if not self._beyond_scope(nodes):
            return 0.0
        us = self.loaded_step_us
        if self.nodes_per_island and nodes > self.nodes_per_island:
            us += self.loaded_step_island_us
        return us * 1e-6

    def tree_level_s(self, nodes: int) -> float:
        """The latency each level of a tree over `nodes` nodes pays beyond NCCL's model even
        measured alone (fabric.tree_level_us), from where fabric.loaded_step_scope says."""
        return self.tree_level_us * 1e-6 if self._beyond_scope(nodes) else 0.0

    def _beyond_scope(self, nodes: int) -> bool:
        """Whether a collective over `nodes` nodes reaches where the fabric's latencies beyond
        NCCL's model start (fabric.loaded_step_scope: past one leaf switch, or past one node)."""
        return self.loaded_step_scope != "leaves" or self.spans_leaves(nodes)

    def spans_leaves(self, nodes: int) -> bool:
        """Whether `nodes` job nodes (the first ones) sit under more than one leaf switch:
        `packed` fills a leaf before the next (a job's first node starts a leaf, as nodes fill
        islands in order), `spread` deals nodes round-robin over leaves; an `ideal` fabric
        has none, so any two nodes count."""
        if nodes <= 1:
            return False
        if self.fabric == "ideal" or self.placement == "spread":
            return True
        return nodes > self.nodes_per_leaf

    def nodes_spanned(self, instances) -> int:
        """The most nodes any of a collective's ring instances spans."""
        g = self.gpus_per_node
        return max(len({r // g for r in inst}) for inst in instances)

    # fabric capacities (nominal x efficiency), per link of each class
    @property
    def node_injection_Bps(self) -> float:
        return self.rails * self.rail_Bps

    @property
    def leaf_uplink_Bps(self) -> float:
        return self.nodes_per_leaf * self.node_injection_Bps / self.oversubscription

    @property
    def group_global_Bps(self) -> float:
        return self.nodes_per_group * self.node_injection_Bps * self.global_taper

    def fabric_position(self, node: int) -> int:
        """Physical slot of a job node: `packed` fills leaves/groups in order, `spread`
        deals nodes round-robin over as many leaves (or groups) as the job spans."""
        if self.placement == "packed":
            return node
        domain = self.nodes_per_group if self.fabric == "dragonfly_plus" else self.nodes_per_leaf
        domains = max(1, -(-self.nodes // domain))
        return (node % domains) * domain + node // domains
