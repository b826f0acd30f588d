"""Actors: classes of ranks whose timelines are identical, simulated once each.

A homogeneous cluster has one actor per algorithm however many GPUs it has: every rank computes
the same units in the same time and takes part in symmetric collectives. Stragglers, jitter and
degraded links break that symmetry; the partition is then refined (as in bisimulation) until two
ranks share an actor only if they have the same compute factors and their process groups contain
the same actors. Collectives rendezvous per *component*: the actors joined by the instances of one
process-group kind.

Ranks of one shard group run in lockstep: every unit's all-gather and reduce-scatter joins them,
so the slowest member reaches every one of them last (all durations grow with the compute factor
and every rendezvous takes the latest arrival). They are simulated as one actor whose compute
factor at each step is the slowest member's; so FSDP with per-GPU jitter is one actor.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from ..spec.plan import PG_KINDS, ParallelPlan
from ..spec.scenario import StragglerSpec


@dataclass
class Actor:
    index: int
    ranks: tuple[int, ...]
    factors: np.ndarray  # compute-time multiplier per step

    @property
    def rank(self) -> int:
        return self.ranks[0]

    @property
    def multiplicity(self) -> int:
        return len(self.ranks)


@dataclass
class Component:
    """Actors that rendezvous on a process-group kind, and the group instances they form."""

    kind: str
    index: int
    actors: tuple[int, ...]
    instances: tuple[tuple[int, ...], ...]
    size: int  # ranks per instance


@dataclass
class Partition:
    actors: list[Actor]
    actor_of_rank: list[int]
    node_class: list[int]  # node -> class of equivalent nodes (for link classes)
    nic_factor_of_class: list[float]
    components: dict[str, list[Component]] = field(default_factory=dict)
    component_of: dict[str, list[int]] = field(default_factory=dict)  # kind -> actor -> comp


def rank_factors(plan: ParallelPlan, strag: StragglerSpec, steps: int, seed: int,
                 lockstep: bool = True) -> tuple[list[tuple], dict[tuple, np.ndarray]]:
    """Per rank, a hashable key of its compute-factor sequence, and the sequences by key."""
    if not (strag.slow_nodes or strag.slow_gpus or strag.jitter.sigma > 0):
        key = (1.0, None)  # every rank at factor 1 (what the loops below give, without them)
        return [key] * plan.world, {key: np.full(steps, 1.0)}
    node_f = defaultdict(lambda: 1.0)
    for s in strag.slow_nodes:
        node_f[s.node] *= s.factor
    gpu_f = defaultdict(lambda: 1.0)
    for s in strag.slow_gpus:
        gpu_f[s.rank] *= s.factor
    j = strag.jitter
    draws: dict[int, np.ndarray] = {}
    if j.sigma > 0:
        rng = np.random.default_rng(seed)
        count = plan.world if j.level == "gpu" else plan.nodes
        if j.distribution == "lognormal":
            # mean-one lognormal: exp(N(-sigma^2/2, sigma))
            m = rng.normal(-j.sigma**2 / 2, j.sigma, size=(count, steps))
            table = np.exp(m)
        else:
            table = rng.uniform(1 - j.sigma, 1 + j.sigma, size=(count, steps))
            table = np.maximum(table, 1e-3)
        draws = {i: table[i] for i in range(count)}
    own: list[tuple] = []
    seqs: dict[tuple, np.ndarray] = {}
    for r in range(plan.world):
        node = plan.node_of(r)
        static = node_f[node] * gpu_f[r]
        jid = (r if j.level == "gpu" else node) if draws else None
        key = (static, jid)
        if key not in seqs:
            base = np.full(steps, static)
            seqs[key] = base * draws[jid] if jid is not None else base
        own.append(key)
    if not lockstep:
        return own, seqs
    # lockstep shard groups: each member takes the slowest member's factor at every step
    keys: list[tuple] = [()] * plan.world
    for inst in plan.process_groups["shard"]:
        members = tuple(sorted(set(own[r] for r in inst)))
        key = members[0] if len(members) == 1 else ("max", *members)
        if key not in seqs:
            seqs[key] = np.max(np.stack([seqs[m] for m in members]), axis=0)
        for r in inst:
            keys[r] = key
    return keys, seqs


def factor_table(plan: ParallelPlan, strag: StragglerSpec, steps: int, seed: int
                 ) -> np.ndarray:
    """Every rank's compute factor at every step, (world, steps): the same draws and products
    as `rank_factors` (so both methods see one realisation of the jitter)."""
    node_f = np.ones(plan.nodes)
    for s in strag.slow_nodes:
        node_f[s.node] *= s.factor
    gpu_f = np.ones(plan.world)
    for s in strag.slow_gpus:
        gpu_f[s.rank] *= s.factor
    node_of = np.arange(plan.world) // plan.gpus_per_node
    static = node_f[node_of] * gpu_f
    j = strag.jitter
    if j.sigma <= 0:
        return np.repeat(static[:, None], steps, axis=1)
    rng = np.random.default_rng(seed)
    count = plan.world if j.level == "gpu" else plan.nodes
    if j.distribution == "lognormal":
        table = np.exp(rng.normal(-j.sigma**2 / 2, j.sigma, size=(count, steps)))
    else:
        table = np.maximum(rng.uniform(1 - j.sigma, 1 + j.sigma, size=(count, steps)), 1e-3)
    draws = table if j.level == "gpu" else table[node_of]
    return static[:, None] * draws


def group_factors(plan: ParallelPlan, table: np.ndarray) -> np.ndarray:
    """Per federation group and step, (groups, steps): the slowest rank's factor. A shard group
    runs in lockstep at its slowest member's pace (see the module note); the replicas of an HSDP
    group meet at every unit's all-reduce and again before the optimizer, so every one of them
    waits for the slowest replica at each step. A rank's timeline within a step is a
    nondecreasing function of its factor, so for ranks that all start the step together the
    latest arrival at every rendezvous is the one with the largest factor."""
    steps = table.shape[1]
    t = table.reshape(plan.groups, plan.replicate, plan.shard, steps)
    return t.max(axis=2).max(axis=1)


def round_slowest(per_group: np.ndarray, agg_steps: set[int]) -> np.ndarray:
    """The factor sequence of the group that sets each FedAvg round's pace: per round (the
    steps up to an aggregation), the group whose factors sum highest over the round (a step's
    time grows about linearly with its factor, so that group arrives last at FedAvg; the
    blocking all-reduce starts every group's next round together). Ties: the lowest group."""
    groups, steps = per_group.shape
    if groups == 1:
        return per_group[0].copy()
    out = np.empty(steps)
    start = 0
    ends = sorted(s for s in agg_steps if s < steps)
    if not ends or ends[-1] != steps - 1:
        ends.append(steps - 1)
    for end in ends:
        seg = per_group[:, start:end + 1]
        g = int(np.argmax(seg.sum(axis=1)))
        out[start:end + 1] = seg[g]
        start = end + 1
    return out


def collapsed_factors(plan: ParallelPlan, strag: StragglerSpec, steps: int, seed: int,
                      agg_steps: set[int]) -> np.ndarray:
    """The order-statistics method: one factor sequence that sets the pace of the whole run
    (the slowest shard group within a federation group at every step, the slowest federation
    group in every FedAvg round), computed from the whole (world, steps) factor table in numpy
    instead of simulating one actor per distinct rank."""
    return round_slowest(group_factors(plan, factor_table(plan, strag, steps, seed)), agg_steps)


def partition(plan: ParallelPlan, strag: StragglerSpec, steps: int, seed: int,
              kinds: tuple[str, ...] = PG_KINDS, lockstep: bool = True,
              agg_steps: set[int] | None = None) -> Partition:
    """Actors of a plan; `lockstep=False` keeps every shard-group member apart (slow; tests).
    With `stragglers.method: order_stats` (the default) and compute heterogeneity, every rank
    takes the collapsed factor sequence (`collapsed_factors`; `agg_steps`: the FedAvg steps), so
    only links (degraded NICs) still split ranks into actors; `per_rank` simulates every class
    of ranks with distinct factors (the exact reference)."""
    if (strag.method == "order_stats" and lockstep
            and (strag.slow_nodes or strag.slow_gpus or strag.jitter.sigma > 0)):
        key: tuple = ("order_stats",)
        keys: list[tuple] = [key] * plan.world
        seqs = {key: collapsed_factors(plan, strag, steps, seed, agg_steps or set())}
    else:
        keys, seqs = rank_factors(plan, strag, steps, seed, lockstep)
    nic_f = defaultdict(lambda: 1.0)
    for d in strag.degraded_nics:
        nic_f[d.node] *= d.factor
    world = plan.world
    if not nic_f and keys.count(keys[0]) == world:  # homogeneous: one actor, one node class
        part = Partition(actors=[Actor(index=0, ranks=tuple(range(world)), factors=seqs[keys[0]])],
                         actor_of_rank=[0] * world, node_class=[0] * plan.nodes,
                         nic_factor_of_class=[1.0])
        for k in kinds:
            insts = plan.process_groups[k]
            part.components[k] = [Component(kind=k, index=0, actors=(0,), instances=insts,
                                            size=len(insts[0]))]
            part.component_of[k] = [0]
        return part
    # initial classes: compute factors and the NIC health of the rank's node
    label = _relabel([(keys[r], nic_f[plan.node_of(r)]) for r in range(world)])
    while max(label) > 0:  # refine: same class only if the process groups hold the same classes
        sig: list[list] = [[lab] for lab in label]
        for k in kinds:
            for inst in plan.process_groups[k]:
                held = tuple(sorted({label[x] for x in inst}))
                for r in inst:
                    sig[r].append(held)
        new = _relabel([tuple(x) for x in sig])
        if max(new) == max(label):
            break
        label = new
    by_label: dict[int, list[int]] = defaultdict(list)
    for r, lab in enumerate(label):
        by_label[lab].append(r)
    actors = []
    actor_of_rank = [0] * world
    for i, lab in enumerate(sorted(by_label, key=lambda x: by_label[x][0])):
        ranks = tuple(by_label[lab])
        for r in ranks:
            actor_of_rank[r] = i
        actors.append(Actor(index=i, ranks=ranks, factors=seqs[keys[ranks[0]]]))
    # node classes: nodes holding the same actors with the same NIC health
    gpn = plan.gpus_per_node
    node_sig = [
        (tuple(sorted({actor_of_rank[n * gpn + i] for i in range(gpn)})), nic_f[n])
        for n in range(plan.nodes)
    ]
    node_class = _relabel(node_sig)
    nic_of_class = [1.0] * (max(node_class) + 1)
    for n, c in enumerate(node_class):
        nic_of_class[c] = nic_f[n]
    part = Partition(actors=actors, actor_of_rank=actor_of_rank, node_class=node_class,
                     nic_factor_of_class=nic_of_class)
    for k in kinds:
        _components(part, plan, k)
    return part


def _relabel(items: list) -> list[int]:
    ids: dict = {}
    return [ids.setdefault(x, len(ids)) for x in items]


def _components(part: Partition, plan: ParallelPlan, kind: str) -> None:
    """Union-find actors over the instances of a process-group kind."""
    parent = list(range(len(part.actors)))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    instances = plan.process_groups[kind]
    for inst in instances:
        first = find(part.actor_of_rank[inst[0]])
        for r in inst[1:]:
            other = find(part.actor_of_rank[r])
            if other != first:
                parent[other] = first
    comp_insts: dict[int, list[tuple[int, ...]]] = defaultdict(list)
    for inst in instances:
        comp_insts[find(part.actor_of_rank[inst[0]])].append(inst)
    comps = []
    comp_of = [0] * len(part.actors)
    for ci, root in enumerate(sorted(comp_insts)):
        members = tuple(sorted({a for a in range(len(part.actors)) if find(a) == root}))
        for a in members:
            comp_of[a] = ci
        insts = tuple(comp_insts[root])
        comps.append(Component(kind=kind, index=ci, actors=members, instances=insts,
                               size=len(insts[0])))
    part.components[kind] = comps
    part.component_of[kind] = comp_of
