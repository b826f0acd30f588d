"""The discrete-event run of one algorithm: a host process and GPU stream processes per actor.

Per actor (a class of identical ranks, see `actors.py`):
- the host process walks the step program in order: it pays host costs (kernel launches, the
  TORCH_DISTRIBUTED_DEBUG=DETAIL checks, which first rendezvous with the hosts of every rank in
  the collective's group), blocks at synchronisation points, and otherwise runs ahead of the GPU;
- one process per GPU stream runs the ops issued to it in order, once the host has issued them
  and their cross-stream dependencies are done; a collective starts when every actor of its
  component has reached it, then moves its bytes over the links (`FlowNetwork`).

Time is *determined* before it is *reached*: a compute op's end is known the moment its start
is, so a process records it and moves on without waiting for the clock; processes yield to SimPy
only when they need a time nobody has determined yet (another actor's arrival, a transfer on a
shared link). A collective whose links no other communicator can load ("private" links, found
statically) also has a closed-form duration. Shared links go through the fluid network, which
advances with the clock. This keeps the event count proportional to real interactions, not ops.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

import simpy

from ..collectives import collective_impl
from ..collectives.nccl import NcclModel, engine_cost, nccl_model
from ..hardware import Hardware
from ..network.flow import FlowNetwork
from ..network.geometry import RingLoad, ring_load
from ..network.links import GLOBAL, LEAF_UP, LINK_KINDS, NIC, NVLINK, SWITCH, LinkClass
from ..spec.plan import ParallelPlan
from ..spec.scenario import CommRuntime, HostRuntime
from ..spec.units import us_to_s
from .actors import Partition
from .host import NO_CONTENTION, HostContention
from .intervals import union
from .program import Op, OpKind, Program

COMPUTE, COLLECTIVE, SYNC, HOST_WORK = (OpKind.COMPUTE, OpKind.COLLECTIVE, OpKind.SYNC,
                                        OpKind.HOST_WORK)

_INF = math.inf


@dataclass
class CollectivePlan:
    """A collective of one component, ready to run: phases of (latency, link demands)."""

    phases: list[tuple[float, dict[int, float]]]
    bytes_by_link_kind: dict[str, float]  # over the whole cluster, all instances of the component
    size: int
    private: bool = False  # no other communicator can load its links
    solo_s: float = 0.0  # duration alone on the network (latency + bandwidth terms)
    link_bytes: tuple[tuple[str, float], ...] = ()  # bytes_by_link_kind's non-zero entries

    def __post_init__(self) -> None:
        self.link_bytes = tuple((k, b) for k, b in self.bytes_by_link_kind.items() if b)


@dataclass
class ActorState:
    index: int
    issued: list[list[float]] = field(default_factory=list)  # [step][op] host issue time
    started: list[list[float]] = field(default_factory=list)
    launched: list[list[float]] = field(default_factory=list)  # collectives: all had arrived
    done: list[list[float]] = field(default_factory=list)  # [step][op] completion time
    check_s: list[list[float]] = field(default_factory=list)  # host debug-check wait per op
    waiters: dict[tuple[int, int, int], simpy.Event] = field(default_factory=dict)
    host_end: list[float] = field(default_factory=list)  # [step] host finished the step
    host_start: list[float] = field(default_factory=list)  # [step] host began the step
    # [step] the host's clock when a timer around the step call stops (a timer_stop SYNC's
    # arrival), else when it finished the step
    timer_stop: list[float] = field(default_factory=list)


_ISSUED, _DONE = 0, 1
_RING_LOADS: dict[tuple, RingLoad] = {}  # (links key, instances) -> load, oldest first
_RING_LOADS_KEPT = 16  # one call's algorithms use at most a dozen rings


def forget_ring_loads() -> None:
    """Drop the ring loads kept from earlier simulations (`simfed.engine.run.simulate` calls
    this before and after its algorithms, so they share rings, no call is timed on another's,
    and none is kept after it)."""
    _RING_LOADS.clear()


class _Rendezvous:
    __slots__ = ("arrived", "event", "latest", "result")

    def __init__(self) -> None:
        self.arrived = 0
        self.latest = 0.0
        self.result = _INF
        self.event: simpy.Event | None = None


class Simulation:
    def __init__(self, *, hw: Hardware, plan: ParallelPlan, part: Partition,
                 programs: dict[bool, Program], aggregate_steps: set[int], steps: int,
                 comm: CommRuntime, host: HostRuntime,
                 contention: HostContention = NO_CONTENTION):
        self.env = simpy.Environment()
        self.hw, self.plan, self.part = hw, plan, part
        self.programs = programs
        self.aggregate_steps = aggregate_steps
        self.steps = steps
        self.comm, self.host = comm, host
        self.contention = contention  # what the host adds (engine.host); no-op default
        self.links = self._link_classes()
        self.net = FlowNetwork(self.env, [lc.capacity_Bps for lc in self.links])
        self._loads: dict[tuple, RingLoad] = {}  # per (pg, comp, op, phase)
        # what the link classes and their indices depend on (ring loads are shared by it)
        self._links_key = (hw, tuple(part.node_class), tuple(part.nic_factor_of_class))
        self._coll_cache: dict[tuple, CollectivePlan] = {}
        self._nccl: NcclModel | None = None
        self._rv: dict[tuple, _Rendezvous] = {}
        self.bytes_by_link_kind = dict.fromkeys(LINK_KINDS, 0.0)
        self.states = [ActorState(index=a.index) for a in part.actors]
        self._private_links = self._find_private_links()
        # per process-group kind: host debug-check cost (instances of a kind have one size)
        self._check = {k: self.debug_check_s(c[0].size) for k, c in part.components.items()}
        # per process-group kind: the host's list-form copies per collective (one per rank per
        # call, runtime.comm.list_copy_us), issued by the thread that issues the compute
        self._list_copies = {k: comm.calls_per_unit * c[0].size * us_to_s(comm.list_copy_us)
                             for k, c in part.components.items()}
        # per process-group kind and component: the actors that meet at its collectives
        self._members = {k: [len(c.actors) for c in comps] for k, comps in part.components.items()}

    # ---- links --------------------------------------------------------------------------
    def _link_classes(self) -> list[LinkClass]:
        hw, part = self.hw, self.part
        links: list[LinkClass] = []
        self._link_ix: dict[tuple[str, int], int] = {}
        nclasses = max(part.node_class) + 1
        count = [0] * nclasses
        for c in part.node_class:
            count[c] += 1
        for c in range(nclasses):
            nic_f = part.nic_factor_of_class[c]
            for link_kind, cap, subs in (
                (NVLINK, hw.nvlink_Bps * hw.nvlink_efficiency, hw.gpus_per_node),
                (NIC, hw.rail_Bps * hw.nic_efficiency * nic_f, hw.rails),
            ):
                for sub in range(subs):  # one class per GPU / rail position in the node
                    self._link_ix[(link_kind, c, sub)] = len(links)
                    links.append(LinkClass(len(links), link_kind, c, cap, count[c]))
        leaves = max(1, -(-hw.nodes // hw.nodes_per_leaf))
        groups = max(1, -(-hw.nodes // hw.nodes_per_group))
        for link_kind, cap, n in (
            (LEAF_UP, hw.leaf_uplink_Bps * hw.nic_efficiency, leaves),
            (GLOBAL, hw.group_global_Bps * hw.nic_efficiency, groups),
            (SWITCH, hw.switch_Bps or float("inf"), leaves),
        ):
            self._link_ix[(link_kind, -1, 0)] = len(links)
            links.append(LinkClass(len(links), link_kind, -1, cap, n))
        return links

    def _link_index(self, link_kind: str, node: int, sub: int) -> int:
        if node < 0:
            return self._link_ix[(link_kind, -1, 0)]
        return self._link_ix[(link_kind, self.part.node_class[node], sub)]

    def _find_private_links(self) -> set[int]:
        """Links that only one communicator (process-group kind x component) can load: its
        collectives run one at a time, so they never compete there."""
        users: dict[int, set[tuple[str, int]]] = defaultdict(set)
        for prog in self.programs.values():
            for op in prog.ops:
                if op.kind is not COLLECTIVE:
                    continue
                for comp in self.part.components[op.pg]:
                    plan = self.collective(op.pg, comp.index, op.collective, op.nbytes)
                    for _lat, demand in plan.phases:
                        for link in demand:
                            users[link].add((op.pg, comp.index))
        private = {link for link, who in users.items() if len(who) == 1}
        for plan in self._coll_cache.values():  # every collective the programs can issue
            plan.private = all(link in private for _l, d in plan.phases for link in d)
        return private

    def collective(self, pg: str, comp: int, op: str, nbytes: int) -> CollectivePlan:
        key = (pg, comp, op, nbytes)
        plan = self._coll_cache.get(key)
        if plan is not None:
            return plan
        component = self.part.components[pg][comp]
        nccl = self.comm.model == "nccl" and self.comm.reduce_scatter_impl == "reduce_scatter"
        impl = collective_impl("ring" if nccl else self.comm.collective)
        # gloo has no reduce-scatter: realrun runs a full all-reduce of the input (its own
        # bandwidth factor, keyed by the op asked for, carries the extra copies)
        run_op = "all_reduce" if (op == "reduce_scatter"
                                  and self.comm.reduce_scatter_impl == "all_reduce") else op
        phases = []
        link_bytes = dict.fromkeys(LINK_KINDS, 0.0)
        solo = 0.0
        for i, ph in enumerate(impl(run_op, component.instances, self.hw.gpus_per_node)):
            lkey = (pg, comp, run_op, i)  # phase i of `op` always spans the same instances
            load = self._loads.get(lkey)
            if load is None:  # (hashing the instances for the shared cache costs: once)
                load = self._loads[lkey] = self._ring_load(ph.instances)
            # bytes over the links, slowed by the implementation's achieved-bandwidth factor
            # (per op, inside a node or across nodes)
            intra = not any(b > 0 for k, b in load.bytes_per_E.items() if k != NVLINK)
            fop = op if ph.op == run_op else ph.op
            e_bytes = ph.e_factor * nbytes / self.comm.bw_factor(fop, intra, ph.pair)
            latency = (us_to_s(self.comm.launch_us)
                       + ph.steps * (load.hop_latency_s + us_to_s(self.comm.step_latency_us)))
            calls = self.comm.calls_per_unit  # issued as `calls` collectives back to back
            if nccl:  # NCCL's algorithm/protocol choice: its latency, its bandwidth
                latency, factor = engine_cost(self._nccl_model(), run_op, nbytes / calls,
                                              ph.instances)
                e_bytes *= factor
            latency *= calls  # each call pays the latency
            # on a fabric shared with other jobs the network links give this collective only
            # a share of their bandwidth (fabric.shared_bandwidth, by the nodes it spans)
            share = (self.hw.shared_bandwidth_share(self.hw.nodes_spanned(ph.instances))
                     if self.hw.shared_bandwidth else 1.0)
            demand = {c: d * e_bytes / (1.0 if self.links[c].kind == NVLINK else share)
                      for c, d in load.demand_per_E.items()}
            # host work per byte (copies, reductions, the kernel's network stack): gloo does it
            # between its transfers, so it adds to the wire time
            latency += self.contention.collective_host_s(fop, intra, ph.e_factor * nbytes)
            phases.append((latency, demand))
            solo += latency + self.net.solo_time_s(demand)
            for k, b in load.bytes_per_E.items():
                link_bytes[k] += b * e_bytes
        plan = CollectivePlan(phases, link_bytes, component.size, solo_s=solo)
        self._coll_cache[key] = plan
        return plan

    def _ring_load(self, instances: tuple[tuple[int, ...], ...]) -> RingLoad:
        """Where a ring over these instances puts its bytes: a function of the instances, the
        hardware and the node classes only, so kept for every simulation of this process (the
        algorithms of one scenario share many rings, e.g. a node's ranks)."""
        key = (self._links_key, instances)
        load = _RING_LOADS.get(key)
        if load is None:
            load = ring_load(self.hw, instances, self._link_index,
                             node_class=self.part.node_class)
            _RING_LOADS[key] = load
            while len(_RING_LOADS) > _RING_LOADS_KEPT:
                del _RING_LOADS[next(iter(_RING_LOADS))]
        return load

    def _nccl_model(self) -> NcclModel:
        if self._nccl is None:
            self._nccl = nccl_model(self.hw, self.comm)
        return self._nccl

    def debug_check_s(self, size: int) -> float:
        """Host cost of TORCH_DISTRIBUTED_DEBUG=DETAIL before one collective over `size` ranks:
        a gloo all-gather of the op fingerprint (ring: size-1 hops) and a monitored barrier
        (rank 0 receives from and answers every other rank in turn, then one round trip)."""
        if self.host.debug_checks != "detail" or size < 2:
            return 0.0
        hop = us_to_s(self.host.gloo_hop_us)
        rank0 = us_to_s(self.host.gloo_rank0_msg_us)
        return (size - 1) * hop + 2 * (size - 1) * rank0 + 2 * hop

    # ---- determined times ---------------------------------------------------------------
    def _wait(self, st: ActorState, table: int, step: int, idx: int) -> simpy.Event:
        """An event that fires when the op's issue (_ISSUED) or end (_DONE) time is set."""
        key = (table, step, idx)
        ev = st.waiters.get(key)
        if ev is None:
            ev = st.waiters[key] = self.env.event()
        return ev

    def program(self, step: int) -> Program:
        """The program the actors run at this step (with FedAvg after it or not)."""
        return self.programs[step in self.aggregate_steps]

    # ---- processes ----------------------------------------------------------------------
    # The loops below read a time straight from the tables when it is already determined (the
    # common case) and wait (`_wait`) only when nobody has determined it yet; setting a time
    # fires its waiters.
    def _host(self, st: ActorState) -> Iterator[simpy.Event]:
        h = 0.0  # the host thread's clock: it may run ahead of the simulation clock
        sync_all = self.host.sync_per_collective
        issued_rows, done_rows, waiters = st.issued, st.done, st.waiters
        for step in range(self.steps):
            prog = self.program(step)
            n = len(prog.ops)
            issued, done, started = [_INF] * n, [_INF] * n, [_INF] * n
            issued_rows.append(issued)
            started_row = started
            st.started.append(started)
            st.launched.append([_INF] * n)
            done_rows.append(done)
            st.check_s.append([0.0] * n)
            synced = 0  # ops before this one are known done (sync_per_collective)
            st.host_start.append(h)
            stop = None
            for op in prog.ops:
                idx = op.idx
                h += op.host_s
                if op.host_waits >= 0:  # FSDP1 rate limiter: an older buffer must be freed
                    t = done[op.host_waits]
                    if t == _INF:
                        yield self._wait(st, _DONE, step, op.host_waits)
                        t = done[op.host_waits]
                    if t > h:
                        h = t
                kind = op.kind
                if kind is SYNC:
                    if op.timer_stop:
                        stop = h
                    for w in op.waits:
                        t = done[w]
                        if t == _INF:
                            yield self._wait(st, _DONE, step, w)
                            t = done[w]
                        if t > h:
                            h = t
                    issued[idx] = started_row[idx] = h
                    done[idx] = h
                    continue
                if kind is HOST_WORK:
                    issued[idx] = started_row[idx] = h
                    h += op.duration_s
                    done[idx] = h
                    continue
                if kind is COLLECTIVE:
                    if sync_all:  # torch.cuda.synchronize(): everything issued so far done
                        while synced < idx:
                            t = done[synced]
                            if t == _INF:
                                yield self._wait(st, _DONE, step, synced)
                                t = done[synced]
                            if t > h:
                                h = t
                            synced += 1
                    check = self._check[op.pg]
                    if check:
                        comp = self.part.component_of[op.pg][st.index]
                        arrive = h
                        rv, last = self._arrive(("host", op.pg, comp, step, idx), op.pg,
                                                comp, h)
                        if last:  # everyone's host is here: fingerprint + monitored barrier
                            self._resolve(rv, rv.latest + check)
                        if rv.result == _INF:
                            yield self._rv_event(rv)
                        h = rv.result
                        st.check_s[step][idx] = h - arrive
                    h += self._list_copies[op.pg]
                issued[idx] = h
                if waiters:
                    ev = waiters.pop((_ISSUED, step, idx), None)
                    if ev is not None:
                        ev.succeed()
            st.host_end.append(h)
            st.timer_stop.append(h if stop is None else stop)
        # the host's last clock reading is a time in the future of the GPU work it issued

    def _stream(self, st: ActorState, stream: int) -> Iterator[simpy.Event]:
        factors = [float(f) for f in self.part.actors[st.index].factors]
        compute_factor = self.contention.compute_factor(st.index)  # host contention: 1.0
        arrivals = self.contention.arrivals(st.index)  # ... None: members arrive as simulated
        component_of, members = self.part.component_of, self._members
        bytes_by_link_kind, contended = self.bytes_by_link_kind, self.contention.active
        issued_rows, done_rows, waiters = st.issued, st.done, st.waiters
        free = 0.0  # the stream's own clock: when its last op ends
        for step in range(self.steps):
            prog = self.program(step)
            for op in prog.stream_ops[stream]:
                idx = op.idx
                t = issued_rows[step][idx] if step < len(issued_rows) else _INF
                if t == _INF:
                    yield self._wait(st, _ISSUED, step, idx)
                    t = issued_rows[step][idx]
                start = t if t > free else free
                if op.deps or op.after_prev_step:
                    done = done_rows[step] if step < len(done_rows) else None
                    for d in op.deps:
                        t = done[d] if done is not None else _INF
                        if t == _INF:
                            yield self._wait(st, _DONE, step, d)
                            done = done_rows[step]
                            t = done[d]
                        if t > start:
                            start = t
                    if op.after_prev_step and step > 0:
                        last = self.program(step - 1).last
                        t = done_rows[step - 1][last]
                        if t == _INF:
                            yield self._wait(st, _DONE, step - 1, last)
                            t = done_rows[step - 1][last]
                        if t > start:
                            start = t
                if op.kind is COMPUTE:
                    st.started[step][idx] = start
                    duration = op.duration_s * factors[step] * compute_factor
                    end = start + duration
                    if arrivals is not None:
                        arrivals.computed(duration)
                else:
                    comp = component_of[op.pg][st.index]
                    st.started[step][idx] = start  # it waits inside for the others
                    if arrivals is not None:  # the group's expected latest arrival
                        start += arrivals.wait_s(
                            op.pg, self.part.components[op.pg][comp].size, start)
                    plan = self._coll_cache.get((op.pg, comp, op.collective, op.nbytes))
                    if plan is not None and plan.private and members[op.pg][comp] == 1:
                        # alone, on links of its own: its end is known now (as `_launch`)
                        for k, b in plan.link_bytes:
                            bytes_by_link_kind[k] += b
                        extra = (self.contention.extra_collective_s(op.pg, comp, plan.solo_s)
                                 if contended else 0.0)
                        end = start + plan.solo_s + extra
                        st.launched[step][idx] = start
                    else:
                        rv, last = self._arrive(("gpu", op.pg, comp, step, idx), op.pg, comp,
                                                start)
                        if last:
                            self._launch(rv, op, comp)
                        if rv.result == _INF:
                            yield self._rv_event(rv)
                        end = rv.result
                        st.launched[step][idx] = rv.latest
                    if arrivals is not None:
                        solo_s = self.collective(op.pg, comp, op.collective, op.nbytes).solo_s
                        arrivals.collective_done(op.pg, end, solo_s)
                free = end
                done_rows[step][idx] = end
                if waiters:
                    ev = waiters.pop((_DONE, step, idx), None)
                    if ev is not None:
                        ev.succeed()

    # ---- rendezvous and collectives -----------------------------------------------------
    def _arrive(self, key: tuple, pg: str, comp: int, t: float) -> tuple[_Rendezvous, bool]:
        """Join a rendezvous at time t; True when this arrival completes it."""
        members = self._members[pg][comp]
        if members == 1:
            rv = _Rendezvous()
            rv.arrived, rv.latest = 1, t
            return rv, True
        rv = self._rv.get(key)
        if rv is None:
            rv = self._rv[key] = _Rendezvous()
        rv.arrived += 1
        rv.latest = max(rv.latest, t)
        if rv.arrived == members:
            del self._rv[key]
            return rv, True
        return rv, False

    def _rv_event(self, rv: _Rendezvous) -> simpy.Event:
        if rv.event is None:
            rv.event = self.env.event()
        return rv.event

    def _resolve(self, rv: _Rendezvous, t: float) -> None:
        rv.result = t
        if rv.event is not None and not rv.event.triggered:
            rv.event.succeed()

    def _launch(self, rv: _Rendezvous, op: Op, comp: int) -> None:
        """Everyone has joined (at rv.latest): run the collective."""
        plan = self._coll_cache.get((op.pg, comp, op.collective, op.nbytes))
        if plan is None:
            plan = self.collective(op.pg, comp, op.collective, op.nbytes)
        bytes_by_link_kind = self.bytes_by_link_kind
        for k, b in plan.link_bytes:
            bytes_by_link_kind[k] += b
        extra = (self.contention.extra_collective_s(op.pg, comp, plan.solo_s)
                 if self.contention.active else 0.0)
        if plan.private:
            self._resolve(rv, rv.latest + plan.solo_s + extra)
            return
        rv.event = rv.event or self.env.event()
        self.env.process(self._transfer(rv, plan, extra))

    def _transfer(self, rv: _Rendezvous, plan: CollectivePlan, extra_s: float = 0.0
                  ) -> Iterator[simpy.Event]:
        env = self.env
        if rv.latest > env.now:
            yield env.timeout(rv.latest - env.now)
        for latency, demand in plan.phases:
            if latency > 0:
                yield env.timeout(latency)
            yield self.net.transfer(demand)
        if extra_s > 0:
            yield env.timeout(extra_s)
        self._resolve(rv, env.now)

    # ---- run ----------------------------------------------------------------------------
    @property
    def actors(self) -> int:
        return len(self.states)

    def busy_share(self, actor: int) -> float:
        """Share of the run the actor's rank is busy on its core: computing, doing host work or
        running a collective (from its launch: a rank waiting for its peers is idle)."""
        st = self.states[actor]
        spans = []
        for step in range(self.steps):
            prog = self.program(step)
            started, launched, done = st.started[step], st.launched[step], st.done[step]
            for kind in (OpKind.COMPUTE, OpKind.HOST_WORK):
                spans.extend((started[i], done[i]) for i in prog.indices(kind))
            spans.extend((launched[i], done[i]) for i in prog.indices(OpKind.COLLECTIVE))
        end = max(max(row) for row in st.done) if st.done else 0.0
        return sum(e - s for s, e in union(spans)) / end if end > 0 else 0.0

    def run(self) -> None:
        used_streams = sorted({o.stream for p in self.programs.values() for o in p.ops
                               if o.stream >= 0})
        for st in self.states:
            self.env.process(self._host(st))
            for s in used_streams:
                self.env.process(self._stream(st, s))
        self.env.run()
        for st in self.states:
            if len(st.host_end) != self.steps or any(math.isinf(t) for t in st.done[-1]):
                raise RuntimeError(f"simulation deadlocked (actor {st.index})")
