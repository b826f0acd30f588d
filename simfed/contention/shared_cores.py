"""Ranks that share host CPU cores (the emulated CPU testbed: `realrun testbed` pins the ranks
of several emulated nodes to the same few cores).

Mechanisms, each fitted by `simfed calibrate` from `realrun bench` and each switched by its own
key of `runtime.shared_cores` (`simfed.spec.shared_cores`):

- slowdown: federation groups on shared cores meet only at FedAvg, so between rounds a rank
  shares its core with ranks out of step with it. Its compute takes 1 + compute_slowdown x w
  times as long, where w is the share of time those ranks are busy (independent phases: the
  mean field), and a collective of its group loses comm_slowdown x w x its time alone;
- spread: beside them, compute (compute_cv) and collective (comm_cv) times vary from rank to
  rank; the variance a rank's arrival gathers since its group last met becomes, at the group's
  next collective, a wait for its latest member (E[max of n normals] x sd). A collective of one
  group does not bring the members of another into step;
- group_drift: federation groups on cores of their own drift apart between FedAvg rounds as a
  random walk (group_drift_ms_per_sqrt_s), which the FedAvg all-reduce waits for;
- host_work: a collective's host work per byte (copies, reductions, the kernel's network stack),
  times the ranks sharing a core, added to each phase's wire time;
- core_stack: a host core that carries the ranks of several nodes runs all their network stacks
  (veth, TCP), so their flows share its capacity (core_stack_Gbps): a collective across nodes
  whose ranks' nodes share cores moves its bytes at the lower of the link's rate and the core's
  share (`core_stack_s`). With one node per core the link binds first; with two (4 nodes of one
  rank on 2 cores) the core can.

How busy the out-of-step ranks are depends on the collectives they slow, so `simulate` iterates
the run to a fixed point of each actor's busy share (3-4 passes).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar

from ..spec.stats import expected_max_normal

BUSY_PASSES = 8  # fixed-point passes over the busy shares (converges in 3-4)
BUSY_TOL = 1e-4


class _Run(Protocol):
    """What `SharedCores.simulate` needs of a run (the engine's `SimulatedRun`)."""

    @property
    def actors(self) -> int: ...

    def run(self) -> None: ...

    def busy_share(self, actor: int) -> float: ...


R = TypeVar("R", bound=_Run)


class SharedCores:
    """The engine's host-contention interface (`simfed.engine.host.HostContention`) for ranks
    that share host cores; it satisfies that Protocol without importing the engine."""

    def __init__(self, spec: Any, hw: Any, plan: Any, part: Any,
                 busy: dict[int, float] | None = None):
        self.spec, self.hw, self.plan, self.part = spec, hw, plan, part
        self.compute_slowdown = spec.compute_slowdown_on
        self.compute_cv = spec.compute_cv_on
        self.comm_slowdown = spec.comm_slowdown_on
        self.comm_cv = spec.comm_cv_on
        self.group_drift_s = spec.group_drift_s_per_sqrt_s
        self.host_work = bool(spec.host_work and spec.host_us_per_MB)
        # most nodes one host core carries (every node's ranks take part in training's
        # collectives across nodes), and the core's network-stack time per byte
        self.core_nodes = nodes_per_core(hw.node_cores)
        self.core_s_per_byte = (8e-9 / spec.core_stack_Gbps
                                if spec.core_stack and spec.core_stack_Gbps > 0
                                and self.core_nodes > 1 else 0.0)
        rate = hw.rail_Bps * hw.nic_efficiency
        self.link_s_per_byte = 1.0 / rate if rate > 0 else 0.0
        self.ranks_per_core = hw.ranks_per_core
        # per (kind, actor), the actors of ranks out of step with it on its cores
        out_of_step = (self.comm_slowdown, self.comm_cv, self.compute_slowdown, self.compute_cv)
        self.core_mates = self._find_core_mates() if any(out_of_step) else {}
        self.busy = busy or {}  # per actor: share of the run it is busy
        # federation groups on cores of their own drift apart between their meetings: a
        # random walk of group_drift_s s per sqrt(s) for the process groups that join them
        self.drifting = self._drifting_kinds() if self.group_drift_s > 0 else set()
        # per actor: how often out-of-step ranks on its cores are busy (the mean field)
        self.out_of_step = [self._mates_busy({b for (_k, a), m in self.core_mates.items()
                                              if a == actor.index for b in m})
                            for actor in part.actors]
        self.active = bool(self.core_mates or self.drifting or self.host_work
                           or self.core_s_per_byte)

    def with_busy(self, busy: dict[int, float]) -> SharedCores:
        """The same model for a pass whose out-of-step ranks are busy these shares of the run."""
        return SharedCores(self.spec, self.hw, self.plan, self.part, busy)

    # ---- who shares cores with whom ----------------------------------------------------
    def _find_core_mates(self) -> dict[tuple[str, int], tuple[int, ...]]:
        """Per (process-group kind, actor): the actors of the ranks that share a host core with
        the actor's rank, belong to another federation group and are not in the collective.
        Federation groups meet only at FedAvg, so between rounds such a rank is out of step
        with the collective (a rank's own group is in step with it: its collectives join
        them)."""
        cores = self.hw.node_cores
        if not cores or self.plan.groups < 2:
            return {}
        plan, part = self.plan, self.part
        on_core: dict[int, list[int]] = defaultdict(list)
        for r in range(plan.world):
            for c in cores[plan.node_of(r)]:
                on_core[c].append(r)
        mates: dict[tuple[str, int], tuple[int, ...]] = {}
        for kind in part.components:
            for actor in part.actors:
                r = actor.rank
                inst = set(plan.group_of(kind, r))
                group = plan.coords(r)[0]
                found = {part.actor_of_rank[q] for c in cores[plan.node_of(r)] for q in on_core[c]
                         if q not in inst and plan.coords(q)[0] != group}
                if found:
                    mates[(kind, actor.index)] = tuple(sorted(found))
        return mates

    def _drifting_kinds(self) -> set[str]:
        """Process-group kinds whose collectives join ranks of different federation groups
        that share no host core (cores not modelled: none shared). Groups on shared cores are
        out of step there instead (`_find_core_mates`)."""
        plan, cores = self.plan, self.hw.node_cores
        kinds = set()
        for kind, comps in self.part.components.items():
            for comp in comps:
                for inst in comp.instances:
                    groups = {plan.coords(r)[0] for r in inst}
                    shared = bool(cores) and any(
                        plan.coords(a)[0] != plan.coords(b)[0]
                        and cores[plan.node_of(a)] & cores[plan.node_of(b)]
                        for a in inst for b in inst if a < b)
                    if len(groups) > 1 and not shared:
                        kinds.add(kind)
        return kinds

    def _mates_busy(self, mates: Iterable[int]) -> float:
        """Share of time at least one of these (independent) actors is busy."""
        free = 1.0
        for b in mates:
            free *= 1.0 - self.busy.get(b, 0.0)
        return 1.0 - free

    # ---- the engine's calls ------------------------------------------------------------
    def compute_factor(self, actor: int) -> float:
        return 1.0 + self.compute_slowdown * self.out_of_step[actor]

    def collective_host_s(self, op: str, intra: bool, ring_bytes: float) -> float:
        host = 0.0
        if self.host_work:
            host = ring_bytes * self.spec.host_s_per_byte(op, intra) * self.ranks_per_core
        if self.core_s_per_byte and not intra:
            host += core_stack_s(ring_bytes, self.core_nodes, self.core_s_per_byte,
                                 self.link_s_per_byte)
        return host

    def extra_collective_s(self, pg: str, comp: int, solo_s: float) -> float:
        """Time a collective of a component loses to out-of-step ranks on its ranks' cores:
        each member meets their work (compute, their own collectives) for the share of time
        they are busy, and the collective ends with its slowest member. The collective's own
        time is what in-step ranks give it (the collective fit's samples ran every group at
        once from a barrier)."""
        if not self.core_mates:
            return 0.0
        worst = max(self._mates_busy(self.core_mates.get((pg, a), ()))
                    for a in self.part.components[pg][comp].actors)
        return self.comm_slowdown * worst * solo_s

    def arrivals(self, actor: int) -> _Arrivals | None:
        compute_sd = self.compute_cv * self.out_of_step[actor]
        comm_sd = {pg: self.comm_cv * self._mates_busy(self.core_mates[(pg, actor)])
                   for pg in self.part.component_of
                   if self.comm_cv > 0 and (pg, actor) in self.core_mates}
        if not (compute_sd or comm_sd or self.drifting):
            return None
        return _Arrivals(list(self.part.component_of), compute_sd, comm_sd, self.drifting,
                         self.group_drift_s ** 2)

    def simulate(self, build: Callable[[SharedCores], R]) -> R:
        """Run to the fixed point of each actor's busy share: how busy the out-of-step ranks
        are depends on the collectives they slow."""
        model = self
        sim = build(model)
        sim.run()
        for _ in range(BUSY_PASSES):
            if not self.core_mates:
                break
            share = {a: sim.busy_share(a) for a in range(sim.actors)}
            moved = max(abs(v - model.busy.get(a, 0.0)) for a, v in share.items())
            if moved < BUSY_TOL:
                break
            model = self.with_busy(share)
            sim = build(model)
            sim.run()
        return sim


class _Arrivals:
    """Per GPU stream: the variance of the rank's arrival gathered since each process group
    last met, turned into a wait for the group's latest member at its next collective."""

    __slots__ = ("comm_sd", "compute_sd", "drift_var_per_s", "last_met", "since_met")

    def __init__(self, kinds: list[str], compute_sd: float, comm_sd: dict[str, float],
                 drifting: set[str], drift_var_per_s: float):
        self.compute_sd = compute_sd  # relative sd of a compute op's time
        self.comm_sd = comm_sd  # per process-group kind: relative sd of its collectives' time
        # per kind: the variance gathered since that group last met (a collective of one group
        # does not bring the members of another into step: FL groups drift apart over the K
        # steps between FedAvg rounds)
        self.since_met = dict.fromkeys(kinds, 0.0)
        self.last_met = dict.fromkeys(drifting, 0.0)  # when each drifting group last met
        self.drift_var_per_s = drift_var_per_s

    def computed(self, duration_s: float) -> None:
        if self.compute_sd:
            var = (self.compute_sd * duration_s) ** 2
            for k in self.since_met:
                self.since_met[k] += var

    def wait_s(self, pg: str, size: int, start: float) -> float:
        if pg in self.last_met:  # the groups' drift since they last met
            self.since_met[pg] += self.drift_var_per_s * max(start - self.last_met[pg], 0.0)
        var = self.since_met[pg]
        if var > 0:  # the group's expected latest arrival
            self.since_met[pg] = 0.0
            return expected_max_normal(size) * math.sqrt(var)
        return 0.0

    def collective_done(self, pg: str, end: float, solo_s: float) -> None:
        sd = self.comm_sd.get(pg)
        if sd:
            # where this rank's end falls among its members': apart from the group just met,
            # and further apart from the others
            var = (sd * solo_s) ** 2
            for k in self.since_met:
                self.since_met[k] = var if k == pg else self.since_met[k] + var
        if pg in self.last_met:
            self.last_met[pg] = end


def nodes_per_core(cores_of_nodes: Iterable[frozenset[int]]) -> float:
    """Most nodes one host core carries, given each node's cores (a node spread over k cores
    counts 1/k on each); 1.0 at least."""
    load: dict[int, float] = defaultdict(float)
    for cores in cores_of_nodes:
        for c in cores:
            load[c] += 1.0 / len(cores)
    return max([1.0, *load.values()])


def core_stack_s(ring_bytes: float, core_nodes: float, core_s_per_byte: float,
                 link_s_per_byte: float) -> float:
    """What a collective phase across nodes loses to the host core's network stack: each of
    its ranks moves `ring_bytes` over its node's link, and a core carrying `core_nodes` nodes
    moves all their flows' bytes at `core_s_per_byte`; beyond the link's own time the core
    binds. (The calibration fits `core_s_per_byte` with this same function.)"""
    if core_nodes <= 1 or core_s_per_byte <= 0:
        return 0.0
    return max(0.0, ring_bytes * (core_nodes * core_s_per_byte - link_s_per_byte))
