"""Reading an actor's simulated timeline: phase boundaries, spans, overlap and live buffers.

The engine records, per actor, step and op, when the host issued it and when it started and
ended on its stream; everything users see is derived here after the run.
"""

from __future__ import annotations

from typing import NamedTuple

from ..spec.trace import PHASES, Span
from .intervals import union
from .program import STREAMS, OpKind
from .sim import Simulation

COMPUTE, COLLECTIVE, HOST_WORK = OpKind.COMPUTE, OpKind.COLLECTIVE, OpKind.HOST_WORK

_F, _B, _O, _A = (PHASES.index(p) for p in ("forward", "backward", "optimizer", "aggregation"))


class StepBounds(NamedTuple):
    """When one step's phases end on an actor's timeline. Phases are consecutive (other,
    forward, backward, optimizer, aggregation), so they sum to the step time."""

    start: float
    other_end: float
    forward_end: float
    backward_end: float
    optimizer_end: float
    end: float  # = the aggregation phase's end


PHASE_ORDER = ("other", "forward", "backward", "optimizer", "aggregation")  # as on the timeline


def step_bounds(sim: Simulation, actor: int) -> list[StepBounds]:
    """Per step, when each phase ends on the actor's timeline."""
    st = sim.states[actor]
    out = []
    start = 0.0
    for step in range(sim.steps):
        prog = sim.program(step)
        done = st.done[step]
        ends = [start] * len(PHASES)
        other = start
        for op in prog.ops:
            t = done[op.idx]
            if op.kind is HOST_WORK:
                other = max(other, t)
            elif t > ends[op.phase]:
                ends[op.phase] = t
        b_fwd = max(other, ends[_F])
        b_bwd = max(b_fwd, ends[_B])
        b_opt = max(b_bwd, ends[_O])
        b_agg = max(b_opt, ends[_A], st.host_end[step])
        out.append(StepBounds(start, other, b_fwd, b_bwd, b_opt, b_agg))
        start = b_agg
    return out


def _length(iv: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in iv)


def _minus(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of the union `a` not covered by the union `b` (both sorted, disjoint)."""
    total = 0.0
    j = 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                total += b[k][0] - cur
            cur = max(cur, b[k][1])
            if cur >= e:
                break
            k += 1
        if cur < e:
            total += e - cur
    return total


def busy_and_exposed(sim: Simulation, actor: int) -> tuple[float, float]:
    """(GPU compute busy time, communication time not hidden behind compute), whole run."""
    st = sim.states[actor]
    compute: list[tuple[float, float]] = []
    comm: list[tuple[float, float]] = []
    for step in range(sim.steps):
        prog = sim.program(step)
        started, done = st.started[step], st.done[step]
        compute.extend([(started[i], done[i]) for i in prog.indices(COMPUTE)])
        comm.extend([(started[i], done[i]) for i in prog.indices(COLLECTIVE)])
    cu = union(compute)
    return _length(cu), _minus(union(comm), cu)


def peak_unsharded_bytes(sim: Simulation, actor: int, unit_nbytes: tuple[int, ...]) -> float:
    """Most bytes of all-gathered (unsharded) units alive at once: allocated when the
    all-gather starts, freed when the compute that consumes it ends."""
    st = sim.states[actor]
    events: list[tuple[float, int, float]] = []
    for step in range(sim.steps):
        for op in sim.program(step).ops:
            if op.alloc_unit >= 0:
                events.append((st.started[step][op.idx], 1, float(op.nbytes)))
            if op.free_unit >= 0:
                events.append((st.done[step][op.idx], 0, -float(unit_nbytes[op.free_unit])))
    live = peak = 0.0
    for _t, _order, delta in sorted(events):  # frees before allocations at the same instant
        live += delta
        peak = max(peak, live)
    return peak


def actor_spans(sim: Simulation, actor: int, steps: int) -> list[Span]:
    st = sim.states[actor]
    a = sim.part.actors[actor]
    attrs = {"actor": actor, "ranks": a.multiplicity}
    spans = []
    bounds = step_bounds(sim, actor)
    for step in range(min(steps, sim.steps)):
        for op in sim.program(step).ops:
            i = op.idx
            if op.kind in (COMPUTE, COLLECTIVE):
                spans.append(Span(
                    name=op.name, cat="compute" if op.kind is COMPUTE else "comm",
                    rank=a.rank,
                    step=step, start_s=st.started[step][i],
                    dur_s=st.done[step][i] - st.started[step][i],
                    nbytes=op.nbytes if op.kind is COLLECTIVE else 0, group=op.pg,
                    stream=STREAMS[op.stream], attrs=dict(attrs)))
            elif op.kind is HOST_WORK and op.duration_s > 0:
                spans.append(Span(name=op.name, cat="host", rank=a.rank, step=step,
                                  start_s=st.started[step][i], dur_s=op.duration_s,
                                  stream="host", attrs=dict(attrs)))
            if st.check_s[step][i] > 0:
                end = st.issued[step][i]
                spans.append(Span(name="debug check " + op.name, cat="host", rank=a.rank,
                                  step=step, start_s=end - st.check_s[step][i],
                                  dur_s=st.check_s[step][i], group=op.pg, stream="host",
                                  attrs=dict(attrs)))
        row = bounds[step]
        for k, name in enumerate(PHASE_ORDER):
            if row[k + 1] > row[k]:
                spans.append(Span(name=name, cat="phase", rank=a.rank, step=step,
                                  start_s=row[k], dur_s=row[k + 1] - row[k], stream="phase"))
        spans.append(Span(name=f"step {step}", cat="step", rank=a.rank, step=step,
                          start_s=row.start, dur_s=row.end - row.start, stream="step"))
    return spans

