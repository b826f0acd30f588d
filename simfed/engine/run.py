"""Simulate a scenario: every algorithm, its timeline, and the numbers users read off it."""

from __future__ import annotations

import math
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from ..collectives.nccl import engine_cost, nccl_model
from ..compute import ComputeModel
from ..contention import for_run as contention_for_run
from ..convergence import attach as attach_convergence
from ..hardware import Hardware
from ..memory import memory_breakdown
from ..network.links import LINK_KINDS
from ..spec.algorithms import algorithm_info
from ..spec.plan import PG_KINDS
from ..spec.rounds import aggregation_steps
from ..spec.scenario import AlgorithmSpec, JitterSpec, Scenario
from ..spec.schema import SpecError
from ..spec.stats import expected_max_normal
from ..spec.trace import PHASES, Span
from ..spec.units import dtype_nbytes, us_to_s
from .actors import partition
from .host import NO_CONTENTION, HostContention
from .program import StepTimes, build_program
from .sim import Simulation, forget_ring_loads
from .timeline import actor_spans, busy_and_exposed, peak_unsharded_bytes, step_bounds
from .variants import apply_rounds, outer_step_s, round_model, variant_of
from .window import check_cost, check_result, needs_window, simulate_windowed


@dataclass
class AlgorithmRun:
    """One algorithm's simulated run: the JSON-ready numbers and (optionally) its spans."""

    result: dict[str, Any]
    spans: list[Span] = field(default_factory=list)
    events: int = 0


def aggregate_steps(steps: int, every: int) -> set[int]:
    """Steps (0-based) after which FedAvg runs: every K local steps and after the last step
    (the paper's code: `(step + 1) % K == 0 or step + 1 == total`)."""
    return aggregation_steps(steps, every)  # simfed.spec.rounds: realrun's schedule too


def simulate_algorithm(scn: Scenario, alg: AlgorithmSpec, *, trace: bool = False,
                       trace_steps: int | None = None, lockstep: bool = True) -> AlgorithmRun:
    info = algorithm_info(alg.name)
    hw = Hardware.from_spec(scn.cluster, scn.runtime)
    plan = alg.plan(scn.cluster)
    train, model = scn.training, scn.model
    steps = train.steps
    tokens_gpu = train.micro_batch * train.seq_len
    cm = ComputeModel(hw=hw, rt=scn.runtime.compute, tokens_per_gpu=tokens_gpu, model=model,
                      seq_len=train.seq_len, attention=train.attention,
                      cross_entropy=train.cross_entropy,
                      train_metric_passes=train.train_metric_passes,
                      reduce_nbytes=dtype_nbytes(train.reduce_dtype or model.dtype),
                      float8=train.float8, float8_all_gather=train.float8_all_gather,
                      compile=train.compile,
                      eager_ops=train.eager_ops, eager_norm=train.eager_norm,
                      eager_rope=train.eager_rope, fsdp_version=train.fsdp_version,
                      sharded=plan.shard > 1,
                      regather_backward=plan.shard > 1 and alg.sharding == "full",
                      keep_last_layer=not alg.reshard_last_layer_after_forward)
    units = model.units(train.seq_len, scn.runtime.compute.causal_skip)
    shard_params = -(-model.total_params // plan.shard)
    rt = scn.runtime.compute
    fwd = tuple(cm.forward_s(u) + us_to_s(rt.unit_overhead_forward_us) for u in units)
    # activation checkpointing re-runs a checkpointed decoder layer's forward in its backward
    # (selective: a share of the layers, spread evenly)
    recompute = tuple(cm.recompute_s(u, f, train) for u, f in zip(units, fwd, strict=True))
    bwd = tuple(cm.backward_s(u) + us_to_s(rt.unit_overhead_backward_us) + r
                for u, r in zip(units, recompute, strict=True))
    if scn.runtime.comm.sm_share > 0 and plan.shard > 1:
        fwd, bwd = _interfered(scn, hw, plan, units, fwd, bwd, cm)
    if rt.gpu_variation > 0:  # the synchronous group waits for its slowest GPU
        slow = 1.0 + rt.gpu_variation * expected_max_normal(plan.shard * plan.replicate)
        fwd, bwd = tuple(f * slow for f in fwd), tuple(b * slow for b in bwd)
    times = StepTimes(
        forward_s=fwd,
        backward_s=bwd,
        unit_nbytes=tuple(u.nbytes for u in units),
        gather_nbytes=tuple(cm.gathered_nbytes(u) for u in units),
        optimizer_s=(cm.optimizer_s(shard_params, model, train, tensors=len(units))  # flat params
                     + us_to_s(rt.optimizer_overhead_us)) / train.grad_accum,
        shard=plan.shard, replicate=plan.replicate, groups=plan.groups,
        reduce_factor=dtype_nbytes(train.reduce_dtype or model.dtype) / model.dtype_nbytes,
        shard_params=shard_params,
        fedavg_local_s=(shard_params * dtype_nbytes(alg.fedavg_dtype)
                        / (rt.fedavg_local_GBps * 1e9) if rt.fedavg_local_GBps else 0.0),
        outer_s=(outer_step_s(shard_params, model.dtype_nbytes,
                              dtype_nbytes(train.optimizer_state_dtype),
                              hw.hbm_Bps * rt.optimizer_hbm_efficiency)
                 if alg.outer_optimizer == "nesterov" else 0.0),
        trainer_sync_s=trainer_sync_s(scn, hw, plan.world),
    )
    launch_s = us_to_s(scn.runtime.compute.launch_us_per_unit)
    agg_steps = (aggregate_steps(steps, alg.aggregate_every)
                 if info.federated and plan.groups > 1 else set())
    programs = {
        flag: build_program(alg, times, scn.runtime.host, launch_s, aggregate=flag,
                            comm=scn.runtime.comm, fsdp_version=train.fsdp_version)
        for flag in (False, True)
    }
    part = partition(plan, scn.stragglers, steps, scn.seed, PG_KINDS, lockstep, agg_steps)
    kw = dict(hw=hw, plan=plan, programs=programs, comm=scn.runtime.comm,
              host=scn.runtime.host)
    sim = _simulate(scn, part=part, aggregate_steps=agg_steps, steps=steps, **kw)
    result = _summarise(scn, alg, plan, hw, sim, times, agg_steps)
    if agg_steps and variant_of(alg) != "sync":  # time-budgeted rounds, partial participation
        apply_rounds(result, round_model(
            alg=alg, plan=plan, strag=scn.stragglers, steps=steps, seed=scn.seed,
            agg_steps=agg_steps, step_times=partial(_step_times_at, scn, kw)))
    spans: list[Span] = []
    if trace:
        for a in range(len(sim.states)):
            spans.extend(actor_spans(sim, a, trace_steps or steps))
        spans.sort(key=lambda s: (s.rank, s.start_s, s.stream, s.name))
    ops = sum(len(sim.program(s).ops) for s in range(steps)) * len(sim.states)
    result["sim_ops"] = ops
    return AlgorithmRun(result=result, spans=spans, events=ops)


def trainer_sync_s(scn: Scenario, hw: Hardware, world: int) -> float:
    """Host time of the trainer's per-step sync over every rank, after it has read the loss
    (the GPU idle): `training.host_reductions` small collectives read one after another, and
    `training.metric_sync_states` metric states gathered as torchmetrics' gather_all_tensors
    does (utilities/distributed.py: a barrier, a list of `world` zeros_like, a list-form
    all_gather that ProcessGroupNCCL copies out one tensor per rank). Collective latencies from
    NCCL's model (the comm model's launch latency for the others); each host op
    `runtime.host.eager_op_us`."""
    t = scn.training
    if world < 2 or not (t.host_reductions or t.metric_sync_states):
        return 0.0
    comm = scn.runtime.comm
    if comm.model == "nccl":
        model, everyone = nccl_model(hw, comm), (tuple(range(world)),)

        def latency(op: str, nbytes: int) -> float:
            return engine_cost(model, op, nbytes, everyone)[0]
    else:
        def latency(op: str, nbytes: int) -> float:
            return us_to_s(comm.launch_us)
    op_s = us_to_s(scn.runtime.host.eager_op_us)
    reductions = t.host_reductions * latency("all_reduce", 8)
    per_state = (latency("all_reduce", 4) + latency("all_gather", 4 * world)
                 + 2 * world * op_s)
    return reductions + t.metric_sync_states * per_state


def _step_times_at(scn: Scenario, kw: dict[str, Any], factors: Any, agg: set[int]
                   ) -> list[float]:
    """Step times of one federation group whose every rank runs at these factors (links as the
    scenario's: degraded NICs kept)."""
    strag = replace(scn.stragglers, slow_nodes=(), slow_gpus=(), jitter=JitterSpec())
    part = partition(kw["plan"], strag, len(factors), scn.seed, PG_KINDS)
    for actor in part.actors:
        actor.factors = factors
    sim = _simulate(scn, part=part, aggregate_steps=agg, steps=len(factors), **kw)
    bounds = [step_bounds(sim, a) for a in range(len(sim.states))]
    return [max(b[s].end for b in bounds) - max(b[s].start for b in bounds)
            for s in range(len(factors))]


def _interfered(scn: Scenario, hw: Hardware, plan, units, fwd, bwd, cm: ComputeModel):
    """Compute slowed by the FSDP collectives that overlap it (`ComputeModel.interference`):
    a unit's forward runs beside the next unit's all-gather, its backward beside an all-gather
    and a reduce-scatter (HSDP: and the replica all-reduce), each timed by NCCL's model alone."""
    from ..collectives.nccl import nccl_model

    nccl = nccl_model(hw, scn.runtime.comm)
    g = hw.gpus_per_node
    shard_nodes = max(1, plan.shard // g) if plan.shard >= g else 1
    red = dtype_nbytes(scn.training.reduce_dtype or scn.model.dtype) / scn.model.dtype_nbytes
    share = scn.runtime.comm.sm_share
    out_f, out_b = [], []
    for u, f, b in zip(units, fwd, bwd, strict=True):
        ag = nccl.time_s("all_gather", cm.gathered_nbytes(u), plan.shard, shard_nodes)
        rs = nccl.time_s("reduce_scatter", u.nbytes * red, plan.shard, shard_nodes)
        ar = (nccl.time_s("all_reduce", u.nbytes * red / plan.shard, plan.replicate,
                          max(1, plan.replicate * plan.shard // g // max(1, shard_nodes)))
              if plan.replicate > 1 else 0.0)
        out_f.append(cm.interference(f, ag, share))
        out_b.append(cm.interference(b, ag + rs + ar, share))
    return tuple(out_f), tuple(out_b)


def _simulate(scn: Scenario, **kw: Any) -> Simulation:
    """Run the simulation with the run's host-contention model (`simfed.contention`; the
    engine's no-op default unless the scenario has `runtime.shared_cores`), which decides how
    many passes it takes."""
    contention: HostContention = (
        contention_for_run(scn.runtime.shared_cores, kw["hw"], kw["plan"], kw["part"])
        or NO_CONTENTION)
    return contention.simulate(lambda model: Simulation(**kw, contention=model))


def _timed(train, sim: Simulation, tokens_per_gpu_step: float) -> dict[str, float]:
    """training.throughput_timer host_call: the host's time from the start of each step to the
    return of the step call (a timer_stop SYNC, else the end of its issuing), averaged over the
    steps, the slowest rank's (a trainer that reduces its timers with MAX)."""
    if train.throughput_timer != "host_call":
        return {}
    timed = max(sum(e - b for b, e in zip(st.host_start, st.timer_stop, strict=True))
                / len(st.host_start) for st in sim.states)
    if timed <= 0:
        raise SpecError("training.throughput_timer: host_call times the host's step call, which "
                        "takes no time here (no host costs, no sync inside the step): use step")
    return {"timed_step_s": timed, "timed_tokens_per_s_per_gpu": tokens_per_gpu_step / timed}


def _summarise(scn: Scenario, alg: AlgorithmSpec, plan, hw: Hardware, sim: Simulation,
               times: StepTimes, agg_steps: set[int]) -> dict[str, Any]:
    info = algorithm_info(alg.name)
    train = scn.training
    steps = train.steps
    bounds = {a: step_bounds(sim, a) for a in range(len(sim.states))}
    critical = max(bounds, key=lambda a: (bounds[a][-1].end, -a))
    b = bounds[critical]
    total_s = b[-1].end
    step_times = [row.end - row.start for row in b]
    step_time = total_s / steps
    phase_tot = dict.fromkeys(PHASES, 0.0)
    for row in b:
        phase_tot["other"] += row.other_end - row.start
        phase_tot["forward"] += row.forward_end - row.other_end
        phase_tot["backward"] += row.backward_end - row.forward_end
        phase_tot["optimizer"] += row.optimizer_end - row.backward_end
        phase_tot["aggregation"] += row.end - row.optimizer_end
    phases = {p: phase_tot[p] / steps for p in ("forward", "backward", "optimizer",
                                                "aggregation", "other")}
    agg_events = [b[s].end - b[s].optimizer_end for s in sorted(agg_steps)]
    world = plan.world
    tokens_step = world * train.micro_batch * train.seq_len
    samples_step = world * train.micro_batch
    steps_per_epoch = scn.dataset_sequences / samples_step
    epoch_s = step_time * steps_per_epoch
    flops_token = scn.model.train_flops_per_token(train.seq_len, scn.runtime.compute.causal_skip)
    compute_s, exposed_s = busy_and_exposed(sim, critical)
    peak_unsharded = max(peak_unsharded_bytes(sim, a, times.unit_nbytes)
                         for a in range(len(sim.states)))
    mem = memory_breakdown(scn.model, train, scn.runtime.memory, shard=plan.shard,
                           peak_unsharded_units_bytes=peak_unsharded)
    bytes_step = {k: sim.bytes_by_link_kind[k] / steps for k in LINK_KINDS}
    checks = sum(
        sim.debug_check_s(sim.part.components[op.pg][0].size)
        for op in sim.program(0).ops if op.pg
    )
    return {
        "name": alg.name,
        "label": alg.display,
        "summary": info.summary,
        "plan": {"groups": plan.groups, "replicate": plan.replicate, "shard": plan.shard,
                 "world": world},
        "models": plan.groups,
        "global_batch_sequences": plan.group_size * train.micro_batch,
        "aggregate_every": alg.aggregate_every if info.federated else 0,
        "aggregations": len(agg_steps),
        "steps": steps,
        "step_time_s": step_time,
        "step_times_s": step_times,
        "total_time_s": total_s,
        "tokens_per_s": tokens_step / step_time,
        "tokens_per_s_per_gpu": tokens_step / step_time / world,
        "samples_per_s": samples_step / step_time,
        "mfu": flops_token * tokens_step / step_time / (world * hw.peak_flops),
        **_timed(train, sim, tokens_step / world),
        "phases_s": phases,
        "aggregation_per_event_s": (sum(agg_events) / len(agg_events)) if agg_events else 0.0,
        "compute_s": compute_s / steps,
        "exposed_comm_s": exposed_s / steps,
        "debug_checks_s": checks,
        "bytes_by_link": bytes_step,
        "bytes_by_link_per_gpu": {k: v / world for k, v in bytes_step.items()},
        "peak_memory_bytes": mem.peak_bytes,
        "memory_bytes": mem.as_dict(),
        "memory_capacity_bytes": hw.memory_bytes,
        "fits": mem.peak_bytes <= hw.memory_bytes,
        "steps_per_epoch": steps_per_epoch,
        "epoch_time_s": epoch_s,
        "actors": len(sim.states),
        "critical_rank": sim.part.actors[critical].rank,
    }


def _run_one(args: tuple) -> AlgorithmRun:
    scn, alg, trace, trace_steps = args
    return simulate_algorithm(scn, alg, trace=trace, trace_steps=trace_steps)


def simulate(scn: Scenario, *, algorithms: list[str] | None = None, trace: bool = False,
             trace_steps: int | None = None, jobs: int | None = None
             ) -> tuple[dict[str, Any], dict[str, list[Span]]]:
    """Run every algorithm of the scenario (or the named ones); speedups are against the first.
    Returns (JSON-ready result, spans per algorithm label when tracing).

    `jobs` > 1 runs the algorithms in parallel processes (same results: each is deterministic);
    None picks that automatically when jitter breaks the symmetry of every node and the
    per-rank method simulates each (the costly case; starting worker processes costs more than
    it saves otherwise)."""
    check_cost(scn, algorithms)  # refuse what cannot be simulated in seconds
    forget_ring_loads()  # the algorithms below share rings; earlier calls' are not reused
    try:
        return _simulate_scenario(scn, algorithms, trace, trace_steps, jobs)
    finally:
        forget_ring_loads()  # nor kept after it (their instances are large at 10^5 GPUs)


def _simulate_scenario(scn: Scenario, algorithms: list[str] | None, trace: bool,
                       trace_steps: int | None, jobs: int | None
                       ) -> tuple[dict[str, Any], dict[str, list[Span]]]:
    if needs_window(scn):  # a long run from a window (simfed.engine.window)
        out, spans = simulate_windowed(simulate, scn, algorithms, trace=trace,
                                       trace_steps=trace_steps, jobs=jobs)
        return check_result(out), spans
    chosen = list(scn.algorithms)
    if algorithms:
        chosen = [scn.algorithm(n) for n in algorithms]
    if jobs is None:
        costly = scn.stragglers.jitter.sigma and scn.stragglers.method == "per_rank"
        jobs = min(len(chosen), os.cpu_count() or 1) if costly else 1
    tasks = [(scn, alg, trace, trace_steps) for alg in chosen]
    if jobs > 1 and len(tasks) > 1:
        ctx = multiprocessing.get_context("spawn")  # no fork of a half-used SimPy state
        with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
            done = list(pool.map(_run_one, tasks))
    else:
        done = [_run_one(t) for t in tasks]
    runs = []
    spans: dict[str, list[Span]] = {}
    events = 0
    for alg, run in zip(chosen, done, strict=True):
        runs.append(run.result)
        events += run.events
        if trace:
            spans[alg.label or alg.name] = run.spans
    base = runs[0]
    for r in runs:
        r["speedup"] = base["step_time_s"] / r["step_time_s"]
        r["epoch_speedup"] = base["epoch_time_s"] / r["epoch_time_s"]
    out = {
        "scenario": scn.name,
        "description": scn.description,
        "seed": scn.seed,
        "cluster": {"name": scn.cluster.name, "nodes": scn.cluster.nodes,
                    "gpus_per_node": scn.cluster.node.gpus, "world": scn.cluster.world,
                    "gpu": scn.cluster.node.gpu.name},
        "model": {"name": scn.model.name, "params": scn.model.total_params},
        "tokens_per_step": scn.global_tokens_per_step,
        "baseline": base["name"],
        "algorithms": runs,
        "simulated_ops": events,
    }
    if any(math.isnan(r["step_time_s"]) for r in runs):
        raise SpecError("simulation produced no step time")
    attach_convergence(scn, out)  # time to a target loss, when the scenario asks for it
    return check_result(out), spans
