"""Where a ring's bytes travel: per-link loads of a set of ring instances on the cluster's links.

NCCL builds rings node by node (ranks of one node adjacent). For a ring over N nodes with q_n
ranks on node n, in which every rank sends E bytes to its successor:
- N = 1: q edges, all NVLink: each GPU's NVLink egress carries E.
- N > 1: each node has q_n - 1 NVLink edges and one edge leaving the node; NCCL runs one channel
  per NIC rail in use (k_n = min(q_n, rails)), so the node's E bytes of egress are spread over k_n
  rails (E / k_n each) and its NVLink bytes over its q_n GPUs ((q_n - 1) E / q_n each).
Link classes are per GPU (NVLink egress) and per rail (NIC) position within a node, so rings on
different rails (one per local GPU index, as FedAvg and HSDP use) never compete.
- consecutive nodes in different leaves (fat-tree) or groups (Dragonfly+) push E through the
  source leaf's uplinks or the source group's global links.
Loads of several instances (e.g. the 4 FedAvg rings of FL+FSDP, one per rail) add up on the links
they share; the load per link of a class is the class's bytes over the links the instances use
(uniform spread: exact for the symmetric plans the algorithms use, an average otherwise).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..hardware import Hardware
from .links import GLOBAL, LEAF_UP, NIC, NVLINK, SWITCH


@dataclass(frozen=True, slots=True)
class RingLoad:
    """Loads per byte of E (the bytes each rank sends to its ring successor)."""

    demand_per_E: dict[int, float]  # link class -> bytes over one used link of the class
    bytes_per_E: dict[str, float]  # link kind -> bytes over all links of the cluster
    hop_latency_s: float  # latency of one ring step (slowest hop of any instance)
    ranks: int  # ranks per instance (p)
    instances: int


# (kind, node or -1 for fabric, GPU or rail index within the node) -> link class index
LinkIndex = Callable[[str, int, int], int]


def ring_load(hw: Hardware, instances: Sequence[Sequence[int]], link_index: LinkIndex,
              switch: bool | None = None) -> RingLoad:
    """Aggregate loads of ring instances (each a tuple of global ranks). `switch` adds the
    load on leaf switches' aggregate capacity (default: when the hardware limits it)."""
    switch = hw.switch_Bps > 0 if switch is None else switch
    g = hw.gpus_per_node
    total: dict[int, float] = defaultdict(float)  # class -> bytes per E (demand-weighted)
    used: dict[int, set] = defaultdict(set)  # class -> physical links used (nodes, leaves)
    kind_bytes: dict[str, float] = defaultdict(float)
    hop_s = 0.0
    sizes = {len(inst) for inst in instances}
    p = max(sizes) if sizes else 0
    for inst in instances:
        if len(inst) < 2:
            continue
        by_node: dict[int, list[int]] = defaultdict(list)
        for r in inst:
            by_node[r // g].append(r % g)
        nodes = sorted(by_node)
        if len(nodes) == 1:
            n = nodes[0]
            locals_ = by_node[n]
            q = len(locals_)
            for loc in locals_:  # each GPU's egress carries E
                c = link_index(NVLINK, n, loc)
                total[c] += 1 / hw.nvlink_usable_fraction(q)
                used[c].add(n)
            kind_bytes[NVLINK] += q
            hop_s = max(hop_s, hw.nvlink_latency_s)
            continue
        for n in nodes:
            locals_ = by_node[n]
            q = len(locals_)
            if q > 1:  # (q - 1) E of NVLink hops spread over the node's q GPUs
                for loc in locals_:
                    c = link_index(NVLINK, n, loc)
                    total[c] += (q - 1) / q / hw.nvlink_usable_fraction(q)
                    used[c].add(n)
                kind_bytes[NVLINK] += q - 1
            k = hw.rails_used(q)
            rails = sorted({loc % hw.rails for loc in locals_})
            extra = [r for r in range(hw.rails) if r not in rails]
            rails = rails[:k] + extra[: max(0, k - len(rails))]
            for rail in rails:  # the node's E bytes of egress over k rails
                c = link_index(NIC, n, rail)
                total[c] += 1.0 / k
                used[c].add(n)
            kind_bytes[NIC] += 1.0
            if switch:  # ... all forwarded by its leaf switch
                c = link_index(SWITCH, -1, 0)
                total[c] += 1.0
                used[c].add(hw.fabric_position(n) // hw.nodes_per_leaf)
        hop_s = max(hop_s, hw.nic_latency_s + hw.switch_latency_s)
        if hw.fabric == "ideal":
            continue
        pos = [hw.fabric_position(n) for n in nodes]
        for i, a in enumerate(pos):
            b = pos[(i + 1) % len(pos)]
            if hw.fabric == "dragonfly_plus" and a // hw.nodes_per_group != b // hw.nodes_per_group:
                c = link_index(GLOBAL, -1, 0)
                total[c] += 1.0
                used[c].add(a // hw.nodes_per_group)
                kind_bytes[GLOBAL] += 1.0
                hop_s = max(hop_s, hw.nic_latency_s + 5 * hw.switch_latency_s)
            elif a // hw.nodes_per_leaf != b // hw.nodes_per_leaf:
                c = link_index(LEAF_UP, -1, 0)
                total[c] += 1.0
                used[c].add(a // hw.nodes_per_leaf)
                kind_bytes[LEAF_UP] += 1.0
                hop_s = max(hop_s, hw.nic_latency_s + 3 * hw.switch_latency_s)
    demand = {c: total[c] / len(used[c]) for c in total}
    return RingLoad(
        demand_per_E=demand,
        bytes_per_E=dict(kind_bytes),
        hop_latency_s=hop_s,
        ranks=p,
        instances=sum(1 for inst in instances if len(inst) > 1),
    )
