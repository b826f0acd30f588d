"""The discrete-event run of one algorithm: a host process and GPU stream processes per actor.

Per actor (a class of identical ranks, see `actors.py`):
- the host process walks the step program in order: it pays host costs (kernel launches, the
  TORCH_DISTRIBUTED_DEBUG=DETAIL checks, which first rendezvous with the hosts of every rank in
  the collective's group), blocks at synchronisation points, and otherwise runs ahead of the GPU;
- one process per GPU stream runs the ops issued to it in order, once the host has issued them
  and their cross-stream dependencies are done; a collective starts when every actor of its
  component has reached it, then moves its bytes over the shared links (`FlowNetwork`).
Done/issued times are kept in arrays; SimPy events are created only when a process must wait.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import simpy

from ..collectives import collective_impl
from ..hardware import Hardware
from ..network.flow import FlowNetwork
from ..network.geometry import RingLoad, ring_load
from ..network.links import GLOBAL, LEAF_UP, LINK_KINDS, NIC, NVLINK, LinkClass
from ..spec.plan import ParallelPlan
from ..spec.scenario import CommRuntime, HostRuntime
from ..spec.trace import Span
from ..spec.units import us_to_s
from .actors import Partition
from .program import COLL, COMPUTE, HOSTWORK, STREAMS, SYNC, Op, Program

_INF = math.inf


@dataclass
class CollectivePlan:
    """A collective of one component, ready to run: phases of (latency, link demands)."""

    phases: list[tuple[float, dict[int, float]]]
    bytes_by_kind: dict[str, float]  # over the whole cluster, all instances of the component
    size: int


@dataclass
class ActorState:
    index: int
    issued: list[list[float]] = field(default_factory=list)  # [step][op] host issue time
    started: list[list[float]] = field(default_factory=list)
    done: list[list[float]] = field(default_factory=list)  # [step][op] completion time
    waiters: dict[tuple[str, int, int], simpy.Event] = field(default_factory=dict)
    host_end: list[float] = field(default_factory=list)  # [step] host finished the step
    # exposed-communication accounting (comm active while the compute stream idles)
    compute_busy: bool = False
    comm_active: int = 0
    last_s: float = 0.0
    exposed_comm_s: float = 0.0
    compute_s: float = 0.0
    # unsharded-parameter buffers alive (FSDP all-gathers running ahead)
    live_units: int = 0
    live_bytes: float = 0.0
    peak_live_bytes: float = 0.0


class Simulation:
    def __init__(self, *, hw: Hardware, plan: ParallelPlan, part: Partition,
                 programs: dict[bool, Program], aggregate_steps: set[int], steps: int,
                 comm: CommRuntime, host: HostRuntime, trace: bool = False,
                 trace_steps: int | None = None):
        self.env = simpy.Environment()
        self.hw, self.plan, self.part = hw, plan, part
        self.programs = programs
        self.aggregate_steps = aggregate_steps
        self.steps = steps
        self.comm, self.host = comm, host
        self.trace = trace
        self.trace_steps = steps if trace_steps is None else trace_steps
        self.spans: list[Span] = []
        self.links = self._link_classes()
        self.net = FlowNetwork(self.env, [lc.capacity_Bps for lc in self.links])
        self._loads: dict[tuple, RingLoad] = {}
        self._coll_cache: dict[tuple, CollectivePlan] = {}
        self._rv: dict[tuple, list] = {}
        self.bytes_by_kind = dict.fromkeys(LINK_KINDS, 0.0)
        self.events_collectives = 0
        self.states = [ActorState(index=a.index) for a in part.actors]
        self.unit_nbytes: dict[int, int] = {}

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
            for kind, cap, n in (
                (NVLINK, hw.nvlink_Bps * hw.nvlink_efficiency, count[c] * hw.gpus_per_node),
                (NIC, hw.rail_Bps * hw.nic_efficiency * nic_f, count[c] * hw.rails),
            ):
                self._link_ix[(kind, c)] = len(links)
                links.append(LinkClass(len(links), kind, c, cap, n))
        leaves = max(1, -(-hw.nodes // hw.nodes_per_leaf))
        groups = max(1, -(-hw.nodes // hw.nodes_per_group))
        for kind, cap, n in (
            (LEAF_UP, hw.leaf_uplink_Bps * hw.nic_efficiency, leaves),
            (GLOBAL, hw.group_global_Bps * hw.nic_efficiency, groups),
        ):
            self._link_ix[(kind, -1)] = len(links)
            links.append(LinkClass(len(links), kind, -1, cap, n))
        return links

    def _link_index(self, kind: str, node: int) -> int:
        if node < 0:
            return self._link_ix[(kind, -1)]
        return self._link_ix[(kind, self.part.node_class[node])]

    def collective(self, kind: str, comp: int, op: str, nbytes: int) -> CollectivePlan:
        key = (kind, comp, op, nbytes)
        plan = self._coll_cache.get(key)
        if plan is not None:
            return plan
        component = self.part.components[kind][comp]
        impl = collective_impl(self.comm.collective)
        phases = []
        kinds = dict.fromkeys(LINK_KINDS, 0.0)
        for ph in impl(op, component.instances, self.hw.gpus_per_node):
            lkey = (kind, comp, ph.instances)
            load = self._loads.get(lkey)
            if load is None:
                load = self._loads[lkey] = ring_load(self.hw, ph.instances, self._link_index)
            e_bytes = ph.e_factor * nbytes
            latency = (us_to_s(self.comm.launch_us)
                       + ph.steps * (load.hop_latency_s + us_to_s(self.comm.step_latency_us)))
            phases.append((latency, {c: d * e_bytes for c, d in load.demand_per_E.items()}))
            for k, b in load.bytes_per_E.items():
                kinds[k] += b * e_bytes
        plan = self._coll_cache[key] = CollectivePlan(phases, kinds, component.size)
        return plan

    def debug_check_s(self, size: int) -> float:
        """Host cost of TORCH_DISTRIBUTED_DEBUG=DETAIL before one collective over `size` ranks:
        a gloo all-gather of the op fingerprint (ring: size-1 hops) and a monitored barrier
        (rank 0 receives from and answers every other rank in turn, then one round trip)."""
        if self.host.debug_checks != "detail" or size < 2:
            return 0.0
        hop = us_to_s(self.host.gloo_hop_us)
        rank0 = us_to_s(self.host.gloo_rank0_msg_us)
        return (size - 1) * hop + 2 * (size - 1) * rank0 + 2 * hop

    # ---- waiting helpers ----------------------------------------------------------------
    def _wait(self, st: ActorState, table: str, step: int, idx: int) -> simpy.Event | None:
        arr = getattr(st, table)
        if step < len(arr) and arr[step][idx] <= self.env.now and arr[step][idx] < _INF:
            return None
        key = (table, step, idx)
        ev = st.waiters.get(key)
        if ev is None:
            ev = st.waiters[key] = self.env.event()
        return ev

    def _mark(self, st: ActorState, table: str, step: int, idx: int) -> None:
        getattr(st, table)[step][idx] = self.env.now
        ev = st.waiters.pop((table, step, idx), None)
        if ev is not None:
            ev.succeed()

    def _tick(self, st: ActorState) -> None:
        now = self.env.now
        if not st.compute_busy and st.comm_active > 0:
            st.exposed_comm_s += now - st.last_s
        st.last_s = now

    # ---- processes ----------------------------------------------------------------------
    def _program(self, step: int) -> Program:
        return self.programs[step in self.aggregate_steps]

    def _host(self, st: ActorState) -> Iterator[simpy.Event]:
        env = self.env
        for step in range(self.steps):
            prog = self._program(step)
            n = len(prog.ops)
            st.issued.append([_INF] * n)
            st.started.append([_INF] * n)
            st.done.append([_INF] * n)
            for op in prog.ops:
                if op.host_s:
                    yield env.timeout(op.host_s)
                if op.kind == SYNC:
                    for w in op.waits:
                        ev = self._wait(st, "done", step, w)
                        if ev is not None:
                            yield ev
                    st.issued[step][op.idx] = st.done[step][op.idx] = env.now
                    continue
                if op.kind == HOSTWORK:
                    start = env.now
                    yield env.timeout(op.duration_s)
                    st.started[step][op.idx] = start
                    st.done[step][op.idx] = env.now
                    st.issued[step][op.idx] = start
                    self._span(st, step, op, start, env.now, "host")
                    continue
                if op.kind == COLL:
                    comp = self.part.component_of[op.pg][st.index]
                    size = self.part.components[op.pg][comp].size
                    check = self.debug_check_s(size)
                    if check:
                        yield self._rendezvous(("host", op.pg, comp, step, op.idx), st,
                                               lambda c=check: env.timeout(c))
                        self._span(st, step, op, env.now - check, env.now, "host",
                                   name="debug check " + op.name)
                self._mark(st, "issued", step, op.idx)
            st.host_end.append(env.now)

    def _stream(self, st: ActorState, stream: int) -> Iterator[simpy.Event]:
        env = self.env
        factors = [float(f) for f in self.part.actors[st.index].factors]
        for step in range(self.steps):
            prog = self._program(step)
            for op in prog.stream_ops[stream]:
                ev = self._wait(st, "issued", step, op.idx)
                if ev is not None:
                    yield ev
                for d in op.deps:
                    ev = self._wait(st, "done", step, d)
                    if ev is not None:
                        yield ev
                if op.after_prev_step and step > 0:
                    prev = self._program(step - 1)
                    ev = self._wait(st, "done", step - 1, prev.last)
                    if ev is not None:
                        yield ev
                start = env.now
                st.started[step][op.idx] = start
                if op.alloc_unit >= 0:
                    st.live_units += 1
                    st.live_bytes += op.nbytes
                    st.peak_live_bytes = max(st.peak_live_bytes, st.live_bytes)
                if op.kind == COMPUTE:
                    dur = op.duration_s * factors[step]
                    self._tick(st)
                    st.compute_busy = True
                    if dur > 0:
                        yield env.timeout(dur)
                    self._tick(st)
                    st.compute_busy = False
                    st.compute_s += dur
                else:
                    comp = self.part.component_of[op.pg][st.index]
                    self._tick(st)
                    st.comm_active += 1
                    yield self._rendezvous(("gpu", op.pg, comp, step, op.idx), st,
                                           lambda o=op, c=comp: self._run_collective(o, c))
                    self._tick(st)
                    st.comm_active -= 1
                if op.free_unit >= 0:
                    st.live_units -= 1
                    st.live_bytes -= self.unit_nbytes.get(op.free_unit, 0)
                self._mark(st, "done", step, op.idx)
                self._span(st, step, op, start, env.now, STREAMS[stream])

    def _rendezvous(self, key: tuple, st: ActorState, start) -> simpy.Event:
        """All actors of the component arrive, then `start()` runs once; everyone waits on
        the event it returns."""
        pg, comp = key[1], key[2]
        members = self.part.components[pg][comp].actors
        if len(members) == 1:
            return start()
        rv = self._rv.get(key)
        if rv is None:
            rv = self._rv[key] = [0, self.env.event()]
        rv[0] += 1
        if rv[0] == len(members):
            del self._rv[key]
            inner = start()
            done = rv[1]
            inner.callbacks.append(lambda _e, d=done: d.succeed())
        return rv[1]

    def _run_collective(self, op: Op, comp: int) -> simpy.Event:
        plan = self.collective(op.pg, comp, op.coll, op.nbytes)
        self.events_collectives += 1
        for k, b in plan.bytes_by_kind.items():
            self.bytes_by_kind[k] += b
        if len(plan.phases) == 1 and plan.phases[0][0] == 0:
            return self.net.transfer(plan.phases[0][1])
        return self.env.process(self._phases(plan))

    def _phases(self, plan: CollectivePlan) -> Iterator[simpy.Event]:
        for latency, demand in plan.phases:
            if latency > 0:
                yield self.env.timeout(latency)
            yield self.net.transfer(demand)

    def _span(self, st: ActorState, step: int, op: Op, start: float, end: float, stream: str,
              name: str | None = None) -> None:
        if not self.trace or step >= self.trace_steps:
            return
        cat = {COMPUTE: "compute", COLL: "comm"}.get(op.kind, "host")
        if name is not None:
            cat = "host"
        self.spans.append(Span(
            name=name or op.name, cat=cat, rank=self.part.actors[st.index].rank, step=step,
            start_s=start, dur_s=end - start,
            nbytes=op.nbytes if op.kind == COLL and name is None else 0,
            group=op.pg, stream=stream,
            attrs={"actor": st.index, "ranks": self.part.actors[st.index].multiplicity},
        ))

    # ---- run ----------------------------------------------------------------------------
    def run(self) -> None:
        used_streams = sorted({o.stream for p in self.programs.values() for o in p.ops
                               if o.stream >= 0})
        for st in self.states:
            self.env.process(self._host(st))
            for s in used_streams:
                self.env.process(self._stream(st, s))
        self.env.run()
        for st in self.states:
            if len(st.host_end) != self.steps or any(
                    math.isinf(t) for t in st.done[-1] if t is not None):
                raise RuntimeError(f"simulation deadlocked (actor {st.index})")
