"""Reading an actor's simulated timeline: phase boundaries, spans, overlap and live buffers.

The engine records, per actor, step and op, when the host issued it and when it started and
ended on its stream; everything users see is derived here after the run.
"""

from __future__ import annotations

from ..spec.trace import PHASES, Span
from .program import STREAMS, OpKind
from .sim import Simulation

_F, _B, _O, _A = (PHASES.index(p) for p in ("forward", "backward", "optimizer", "aggregation"))


def step_bounds(sim: Simulation, actor: int) -> list[list[float]]:
    """Per step: [start, other end, forward end, backward end, optimizer end, aggregation end].
    Phases are consecutive on the actor's timeline, so they sum to the step time."""
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
            if op.kind is OpKind.HOST_WORK:
                other = max(other, t)
            elif t > ends[op.phase]:
                ends[op.phase] = t
        b_fwd = max(other, ends[_F])
        b_bwd = max(b_fwd, ends[_B])
        b_opt = max(b_bwd, ends[_O])
        b_agg = max(b_opt, ends[_A], st.host_end[step])
        out.append([start, other, b_fwd, b_bwd, b_opt, b_agg])
        start = b_agg
    return out


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if merged and s <= merged[-1][1]:
            if e > merged[-1][1]:
                merged[-1] = (merged[-1][0], e)
        else:
            merged.append((s, e))
    return merged


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
        for op in sim.program(step).ops:
            if op.kind is OpKind.COMPUTE:
                compute.append((st.started[step][op.idx], st.done[step][op.idx]))
            elif op.kind is OpKind.COLLECTIVE:
                comm.append((st.started[step][op.idx], st.done[step][op.idx]))
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
            if op.kind in (OpKind.COMPUTE, OpKind.COLLECTIVE):
                spans.append(Span(
                    name=op.name, cat="compute" if op.kind is OpKind.COMPUTE else "comm",
                    rank=a.rank,
                    step=step, start_s=st.started[step][i],
                    dur_s=st.done[step][i] - st.started[step][i],
                    nbytes=op.nbytes if op.kind is OpKind.COLLECTIVE else 0, group=op.pg,
                    stream=STREAMS[op.stream], attrs=dict(attrs)))
            elif op.kind is OpKind.HOST_WORK and op.duration_s > 0:
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
        names = ("other", "forward", "backward", "optimizer", "aggregation")
        for k, name in enumerate(names):
            if row[k + 1] > row[k]:
                spans.append(Span(name=name, cat="phase", rank=a.rank, step=step,
                                  start_s=row[k], dur_s=row[k + 1] - row[k], stream="phase"))
        spans.append(Span(name=f"step {step}", cat="step", rank=a.rank, step=step,
                          start_s=row[0], dur_s=row[-1] - row[0], stream="step"))
    return spans

