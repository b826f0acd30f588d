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

import numpy as np

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
              switch: bool | None = None, node_class: Sequence[int] | None = None) -> RingLoad:
    """Aggregate loads of ring instances (each a tuple of global ranks). `switch` adds the
    load on leaf switches' aggregate capacity (default: when the hardware limits it).
    `node_class` (node -> class) says that `link_index` depends on a node only through its
    class, so it is asked once per class rather than once per node. Instances of one size (every
    process-group kind's) take the array path, `_ring_load_arrays`: the same sums in the same
    order as this loop, in numpy, so that 500,000 ranks cost a fraction of a second."""
    switch = hw.switch_Bps > 0 if switch is None else switch
    sizes = set(map(len, instances))
    if len(sizes) == 1 and min(sizes) >= 2 and len(instances) * min(sizes) >= _ARRAY_MIN_RANKS:
        return _ring_load_arrays(hw, instances, link_index, switch, node_class)
    return _ring_load_loop(hw, instances, link_index, switch)


def _ring_load_loop(hw: Hardware, instances: Sequence[Sequence[int]], link_index: LinkIndex,
                    switch: bool) -> RingLoad:
    """`ring_load`, instance by instance and rank by rank (the reference)."""
    g = hw.gpus_per_node
    total: dict[int, float] = defaultdict(float)  # class -> bytes per E (demand-weighted)
    used: dict[int, set] = defaultdict(set)  # class -> physical links used (nodes, leaves)
    kind_bytes: dict[str, float] = defaultdict(float)
    hop_s = 0.0
    p = max((len(inst) for inst in instances), default=0)
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


# below this many ranks the loop is as fast, and it is the reference the array path is tested on
_ARRAY_MIN_RANKS = 256


def _ring_load_arrays(hw: Hardware, instances: Sequence[Sequence[int]], link_index: LinkIndex,
                      switch: bool, node_class: Sequence[int] | None) -> RingLoad:
    """`ring_load` for instances of one size >= 2, in numpy. Every per-class sum adds the same
    terms in the same order as the loop (np.bincount adds its weights in input order), and
    `demand_per_E` lists the classes in the order the loop first touches them, so the results
    are bitwise the loop's."""
    g, rails = hw.gpus_per_node, hw.rails
    ranks = np.asarray(instances, dtype=np.int64)
    n_inst, p = ranks.shape
    node, loc = ranks // g, ranks % g
    if not (node[:, 1:] >= node[:, :-1]).all():  # the loop's nodes ascending, locals kept
        order = np.argsort(node, axis=1, kind="stable")
        node = np.take_along_axis(node, order, axis=1)
        loc = np.take_along_axis(loc, order, axis=1)
    start = np.ones((n_inst, p), dtype=bool)  # the first rank of each (instance, node) run
    start[:, 1:] = node[:, 1:] != node[:, :-1]
    single = start.sum(axis=1) == 1  # instances within one node
    run_of = np.cumsum(start.ravel()) - 1  # element -> run, runs in the loop's order
    run_node = node.ravel()[start.ravel()]
    run_inst = np.nonzero(start)[0]
    q_run = np.bincount(run_of)
    multi_run = ~single[run_inst]
    width = max(p, rails, len(q_run)) + 1

    def seq(run: np.ndarray, part: int, item: np.ndarray, hop: int = 0) -> np.ndarray:
        return (2 * run + hop) * 4 * width + part * width + item
    # link classes: asked once per (kind, node class, position)
    cls_of_node = (np.asarray(node_class, dtype=np.int64) if node_class is not None
                   else np.arange(hw.nodes, dtype=np.int64))
    class_ids, first_node = np.unique(cls_of_node, return_index=True)
    rep = dict(zip(class_ids.tolist(), first_node.tolist(), strict=True))  # class -> a node

    subs = max(g, rails)

    def classes(kind: str, node_ids: np.ndarray, sub: np.ndarray) -> np.ndarray:
        key = cls_of_node[node_ids] * subs + sub
        table = np.zeros(int(key.max()) + 1, dtype=np.int64)
        for k in np.flatnonzero(np.bincount(key)).tolist():
            table[k] = link_index(kind, rep[k // subs], k % subs)
        return table[key]

    # where the loop visits each term: per instance, its node runs in order (NVLink terms,
    # then NIC, then switch), then its fabric hops: seq = (2 run + hop) x 4 W + part x W + item
    # (hop 1 and run = the instance's last run for fabric hops; part 0 NVLink, 1 NIC,
    # 2 switch, 3 fabric; item: the term's place within its part)
    terms: list[tuple[np.ndarray, ...]] = []  # (class, weight, used id, seq)
    kinds: list[str] = []  # each term array's link kind
    kind_bytes: dict[str, float] = {}
    hop_s = 0.0
    # NVLink: each GPU of a one-node instance carries E; on a node of a multi-node ring, each of
    # its q GPUs carries (q - 1) E / q (only when q > 1)
    q_el = q_run[run_of]
    el_multi = ~single.repeat(p)
    frac_table = np.ones(int(q_run.max()) + 1)
    for q in np.unique(q_run).tolist():
        frac_table[q] = hw.nvlink_usable_fraction(int(q))
    nv = ~el_multi | (q_el > 1)
    if nv.any():
        el = np.nonzero(nv)[0]
        nodes_el = node.ravel()[el]
        q = q_el[el]
        weight = np.where(el_multi[el], (q - 1) / q / frac_table[q], 1 / frac_table[q])
        terms.append((classes(NVLINK, nodes_el, loc.ravel()[el]), weight, nodes_el,
                      seq(run_of[el], 0, el % p)))
        kinds.append(NVLINK)
        kind_bytes[NVLINK] = float(single.sum() * p + np.sum((q_run - 1)[multi_run]))
    if single.any():
        hop_s = max(hop_s, hw.nvlink_latency_s)
    if multi_run.any():
        mr = np.nonzero(multi_run)[0]
        # NIC: the node's E over k rails: its GPUs' rails first, then the lowest free ones
        has = np.zeros((len(q_run), rails), dtype=bool)
        el_m = np.nonzero(el_multi)[0]
        has[run_of[el_m], loc.ravel()[el_m] % rails] = True
        pref = np.argsort(np.where(has[mr], 0, rails) + np.arange(rails), axis=1, kind="stable")
        k = np.maximum(1, np.minimum(q_run[mr], rails))
        take = np.arange(rails)[None, :] < k[:, None]
        r_idx, col = np.nonzero(take)
        runs = mr[r_idx]
        rail = pref[r_idx, col]
        terms.append((classes(NIC, run_node[runs], rail), 1.0 / k[r_idx], run_node[runs],
                      seq(runs, 1, col)))
        kinds.append(NIC)
        kind_bytes[NIC] = float(len(mr))
        pos = np.asarray(hw.fabric_position(run_node))  # each run's node's fabric slot
        if switch:
            leaf = pos[mr] // hw.nodes_per_leaf
            c = link_index(SWITCH, -1, 0)
            terms.append((np.full(len(mr), c), np.ones(len(mr)), leaf, seq(mr, 2, 0 * mr)))
            kinds.append(SWITCH)
        hop_s = max(hop_s, hw.nic_latency_s + hw.switch_latency_s)
        if hw.fabric != "ideal":
            # each run's node to the next run's node of its instance (the last to the first)
            # (runs are in instance order, every instance has some: its first and last run)
            first_run = np.flatnonzero(np.r_[True, run_inst[1:] != run_inst[:-1]])
            last_run = np.r_[first_run[1:] - 1, len(q_run) - 1]
            nxt = np.arange(len(q_run)) + 1
            nxt[last_run] = first_run
            hop_run = last_run[run_inst[mr]]  # fabric hops come after the instance's nodes
            a, b = pos[mr], pos[nxt[mr]]
            if hw.fabric == "dragonfly_plus":
                cross = a // hw.nodes_per_group != b // hw.nodes_per_group
                gl = mr[cross]
                if len(gl):
                    c = link_index(GLOBAL, -1, 0)
                    terms.append((np.full(len(gl), c), np.ones(len(gl)),
                                  a[cross] // hw.nodes_per_group,
                                  seq(hop_run[cross], 3, gl, hop=1)))
                    kinds.append(GLOBAL)
                    kind_bytes[GLOBAL] = float(len(gl))
                    hop_s = max(hop_s, hw.nic_latency_s + 5 * hw.switch_latency_s)
                rest = ~cross
            else:
                rest = np.ones(len(mr), dtype=bool)
            up = rest & (a // hw.nodes_per_leaf != b // hw.nodes_per_leaf)
            lu = mr[up]
            if len(lu):
                c = link_index(LEAF_UP, -1, 0)
                terms.append((np.full(len(lu), c), np.ones(len(lu)), a[up] // hw.nodes_per_leaf,
                              seq(hop_run[up], 3, lu, hop=1)))
                kinds.append(LEAF_UP)
                kind_bytes[LEAF_UP] = float(len(lu))
                hop_s = max(hop_s, hw.nic_latency_s + 3 * hw.switch_latency_s)
    # per class, the loop's sum: each class is one kind's, and each kind's terms are listed in
    # the loop's order, so np.bincount (which adds in input order) repeats the loop's sums
    cls = np.concatenate([t[0] for t in terms])
    total = np.bincount(cls, weights=np.concatenate([t[1] for t in terms]).astype(float))
    used_id = np.concatenate([t[2] for t in terms]).astype(np.int64)
    span = int(used_id.max()) + 1
    if len(total) * span <= 1 << 24:  # distinct (class, link) pairs: marks, or a sort
        marks = np.zeros(len(total) * span, dtype=bool)
        marks[cls * span + used_id] = True
        used = marks.reshape(len(total), span).sum(axis=1)
    else:
        used = np.bincount(np.unique(cls * span + used_id) // span, minlength=len(total))
    first = np.full(len(total), np.iinfo(np.int64).max)
    np.minimum.at(first, cls, np.concatenate([t[3] for t in terms]))
    touched = np.flatnonzero(used)
    touched = touched[np.argsort(first[touched], kind="stable")]  # the loop's first touch
    demand = {int(c): float(total[c]) / int(used[c]) for c in touched.tolist()}
    first_of_kind = {kind: int(t[3].min()) for kind, t in zip(kinds, terms, strict=True)
                     if kind != SWITCH}
    ordered_kinds = sorted(first_of_kind, key=first_of_kind.__getitem__)
    return RingLoad(
        demand_per_E=demand,
        bytes_per_E={k: kind_bytes[k] for k in ordered_kinds},
        hop_latency_s=hop_s,
        ranks=p,
        instances=n_inst,
    )
