"""The summary of a bench folder (`realrun bench` writes it to DIR/bench-summary.json): per
case, medians over its traces' repetitions, as simfed.spec.bench's typed rows.

The summary, `DIR/bench-summary.json`, is one JSON object. Every time is, per repetition, the
slowest rank (a collective ends when its last rank does; ranks run the compute benchmarks in
lockstep), then the median over repetitions (and over concurrent groups); min_time_s is the
fastest repetition, samples the number of repetitions. The collective cases are measured in
`--rounds` interleaved passes (each case once per pass, with its share of the repetitions), so a
passing disturbance of a noisy machine costs one sample of several cases rather than every
sample of one. Times in seconds, sizes in bytes.
- meta: rank 0's trace header (world_size, nodes, ranks_per_node, cores, host_cores, network,
  link_rate_Gbps, impl, scenario, model, seq_len, micro_batch, ...) and bench_wall_s.
- comm: [{op, group (intra | inter | world | nodes{b}: blocks of b nodes), group_size, nodes,
  concurrent_groups, beside ("busy": one group ran it while the other groups ran a
  training-like loop out of step with it; absent otherwise), nbytes (full buffer: all-gather
  output, reduce-scatter input, all-reduce buffer), impl (gloo_allgather | gloo_allreduce),
  time_s, min_time_s, samples, algbw_Gbps, busbw_Gbps, rank_cv}]; algbw = nbytes / time,
  busbw = algbw x (p-1)/p (all-gather, reduce-scatter) or 2(p-1)/p (all-reduce), the
  nccl-tests convention; rank_cv: how unevenly the ranks of a
  repetition finished (a rank's standard deviation, from each repetition's range, over the mean
  time; null with one rank per group).
- compute: [{phase, concurrent, flops, hidden, ffn_hidden, time_s, gflops_per_s, samples}]: a
  plain matmul block (not the model); phase forward_backward (the block's forward and
  backward over 256 tokens, where half of the ranks share cores with the other half): every
  rank at once (in step), and with beside "busy" the first half while the other half runs a
  training-like loop out of step with it; both with rank_cv (as for comm). Phase loop: the
  first half runs the training-like loop itself (the block, then an all-gather of nbytes in its
  own group, free-running), beside idle ranks or beside the other half's loop (beside idle |
  busy), with time_s (the block), coll_time_s (the all-gather, waits included) and
  arrival_sd_s (how far apart, in seconds, the group's ranks reached each all-gather: a rank's
  standard deviation from each round's range). Phase drift: two federation groups on cores of
  their own (the halves of the nodes) each run that loop loop_iters times, free, from a common
  barrier, with time_s (a round, a group's last member's end from the barrier), drift_rms_s
  (how far apart the groups ended: the root mean square of the difference over rounds),
  drift_mean_abs_s (the mean of its size) and drift_mean_s (its mean: group 0 minus group 1).
- checks: [{group_size, nodes, all_reduce_tiny_off_s, all_reduce_tiny_detail_s, detail_check_s,
  monitored_barrier_s, all_gather_tiny_s}]: host costs of TORCH_DISTRIBUTED_DEBUG=DETAIL.
- units: [{unit (ModelSpec.units index: 0 = root, 1.. = decoder layers), name, kind (root |
  layer), phase (forward | backward), params, flops (ModelSpec.units FLOPs x tokens), tokens
  (micro_batch x seq_len), time_s (wall), min_time_s, cpu_time_s (process CPU time), samples,
  gflops_per_s (flops / time_s), ranks_per_node, cores (per rank), concurrent (ranks computing
  at once: all), alone_time_s and alone_cpu_time_s (one rank per node computing, the others
  idle; null with one rank per node)}]: the scenario's model as training wraps it, on a 1-rank
  mesh (no communication); the root unit is embedding + final norm + head + loss (+ FSDP2's
  final backward callback).
- model: [{phase, params, flops, time_s (plain whole-model pass, no hooks), samples,
  cpu_time_s, hooked_time_s (whole pass with the unit hooks), units_sum_s (sum of the units'
  time_s), units_sum_ratio (units_sum_s / time_s), alone_time_s (hooked, one rank per node)}].
- optimizer: [{shard, params (one rank's local), tensors, time_s, min_time_s, cpu_time_s,
  samples, first_time_s (the first step: state allocation and DTensor's cold caches)}]: the
  optimizer step + LR step + zero_grad, as training's "optimizer" phase.
- fedavg: [{shard, nbytes (the FedAvg buffer), params, tensors, fedavg_dtype, time_s,
  min_time_s, cpu_time_s, samples}]: FedAvg's local work besides its all-reduce (flatten,
  divide, copy back).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from simfed.spec import Span, read_trace
from simfed.spec.bench import (
    BenchSummary,
    CheckRow,
    CommRow,
    ComputeRow,
    DriftRow,
    FedavgRow,
    LoopRow,
    ModelRow,
    OptimizerRow,
    UnitRow,
)
from simfed.spec.stats import expected_range_normal

TRACE_GLOB = "bench-rank*.jsonl"
SUMMARY = "bench-summary.json"


class BenchError(RuntimeError):
    """Bad bench input or a failed bench job; the message is one line."""



def load_spans(out: Path) -> tuple[dict[str, Any], list[Span]]:
    paths = sorted(out.glob(TRACE_GLOB))
    if not paths:
        raise BenchError(f"no {TRACE_GLOB} in {out}")
    meta: dict[str, Any] = {}
    spans: list[Span] = []
    for path in paths:
        m, s = read_trace(path)
        if not meta or path.name == "bench-rank0.jsonl":
            meta = m
        spans += s
    return meta, spans


def bus_factor(op: str, p: int) -> float:
    return (2.0 if op == "all_reduce" else 1.0) * (p - 1) / p


def _slowest_median(reps: dict[int, float]) -> tuple[float, float, int]:
    """(median, min, count) over repetitions >= 0 of the slowest rank's time per repetition."""
    vals = [v for rep, v in reps.items() if rep >= 0]
    return statistics.median(vals), min(vals), len(vals)


def _rank_sds(reps: dict[Any, dict[int, float]]) -> tuple[list[float], list[float]]:
    """Per repetition with 2+ ranks: the standard deviation of a rank's value estimated from
    the range over its ranks (range / its expected value for that many normal draws), and the
    mean value."""
    sds, means = [], []
    for ranks in reps.values():
        n = len(ranks)
        if n < 2:
            continue
        d = list(ranks.values())
        sds.append((max(d) - min(d)) / expected_range_normal(n))
        means.append(statistics.fmean(d))
    return sds, means


def rank_cv(reps: dict[Any, dict[int, float]]) -> float | None:
    """How unevenly ranks ran one repetition, relative to its mean: a rank's standard
    deviation (`_rank_sds`), averaged over repetitions, over the mean time."""
    sds, means = _rank_sds(reps)
    if not sds or statistics.fmean(means) <= 0:
        return None
    return statistics.fmean(sds) / statistics.fmean(means)


def rank_sd(reps: dict[Any, dict[int, float]]) -> float | None:
    """How far apart ranks did one thing (e.g. reached a collective), in seconds: a rank's
    standard deviation (`_rank_sds`) averaged over repetitions."""
    sds, _means = _rank_sds(reps)
    return statistics.fmean(sds) if sds else None


def summarize(out: str | Path) -> dict[str, Any]:
    """Medians per case from a bench folder's traces (see the module docstring)."""
    meta, spans = load_spans(Path(out))
    comm: dict[tuple, dict[tuple, float]] = defaultdict(dict)
    compute: dict[tuple, list[float]] = defaultdict(list)
    checks: dict[tuple, list[float]] = defaultdict(list)
    units: dict[tuple, dict[int, float]] = defaultdict(dict)  # case -> rep -> slowest rank
    cpu: dict[tuple, dict[int, float]] = defaultdict(dict)  # the same for CPU seconds
    # case -> repetition -> rank -> own time (how unevenly the ranks of one repetition ran)
    per_rank: dict[tuple, dict[Any, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    # the free-running loop: case -> [(block, all-gather)], case -> round -> rank -> arrival
    loops: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    arrivals: dict[tuple, dict[Any, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    # two groups drifting apart: case -> round -> group -> [(start, end) of each member]
    drifts: dict[tuple, dict[int, dict[int, list[tuple[float, float]]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list)))
    for s in spans:
        a = s.attrs
        bench = a.get("bench", "")
        if bench:
            if bench == "units":
                key: tuple = (bench, a["kind"], a["unit"], a["unit_name"], s.name, a["hooks"],
                              a["params"], a["flops"], a["tokens"], a["ranks_per_node"],
                              a["cores"], a["concurrent"], bool(a.get("alone", False)))
            elif bench == "optimizer":
                key = (bench, a["shard"], a["params"], a["tensors"])
            else:
                key = (bench, a["shard"], a["params"], a["tensors"], a["fedavg_dtype"], s.nbytes)
            units[key][s.step] = max(units[key].get(s.step, 0.0), s.dur_s)
            cpu[key][s.step] = max(cpu[key].get(s.step, 0.0), float(a.get("cpu_s", 0.0)))
        elif s.cat == "comm":
            key = (s.group, a["concurrent_groups"], s.name, s.nbytes, a["group_size"],
                   a["nodes"], a.get("impl", ""), a.get("beside", ""))
            rep = (a["group_index"], s.step)
            comm[key][rep] = max(comm[key].get(rep, 0.0), s.dur_s)
            per_rank[("comm", *key)][rep][s.rank] = s.dur_s
        elif s.cat == "compute" and s.name == "drift":
            key = (a["concurrent"], a["flops"], a["hidden"], a["ffn_hidden"], a["nbytes"],
                   a["group_size"], a["loop_iters"])
            drifts[key][s.step][int(a["drift_group"])].append((s.start_s, s.start_s + s.dur_s))
        elif s.cat == "compute" and s.name == "loop":
            key = (a["concurrent"], a["flops"], a["hidden"], a["ffn_hidden"], a["beside"],
                   a["nbytes"])
            loops[key].append((s.dur_s, float(a["coll_s"])))
            arrivals[key][s.step][s.rank] = s.start_s
        elif s.cat == "compute":
            key = (s.name, a["concurrent"], a["flops"], a["hidden"], a["ffn_hidden"],
                   a.get("beside", ""))
            compute[key].append(s.dur_s)
            per_rank[("compute", *key)][s.step][s.rank] = s.dur_s
        elif s.cat == "host":
            checks[(a["group_size"], a["nodes"], s.name, a.get("debug", ""))].append(s.dur_s)
    comm_rows = []
    for key, reps in sorted(comm.items()):
        group, conc, op, nbytes, p, nodes, impl, beside = key
        t = statistics.median(reps.values())
        algbw = nbytes * 8 / t / 1e9
        comm_rows.append(CommRow(
            op=op, group=group, group_size=p, nodes=nodes, concurrent_groups=conc,
            nbytes=nbytes, impl=impl, time_s=t, min_time_s=min(reps.values()),
            samples=len(reps), algbw_Gbps=algbw, busbw_Gbps=algbw * bus_factor(op, p),
            rank_cv=rank_cv(per_rank[("comm", *key)]), **({"beside": beside} if beside else {})))
    compute_rows: list[ComputeRow | LoopRow | DriftRow] = []
    for key, durs in sorted(compute.items()):
        name, conc, flops, h, f, beside = key
        t = statistics.median(durs)
        extra: dict[str, Any] = {}
        if name == "forward_backward":  # the block beside out-of-step ranks, or its reference
            extra["rank_cv"] = rank_cv(per_rank[("compute", *key)])
        if beside:
            extra["beside"] = beside
        compute_rows.append(ComputeRow(phase=name, concurrent=conc, flops=flops, hidden=h,
                                       ffn_hidden=f, time_s=t, gflops_per_s=flops / t / 1e9,
                                       samples=len(durs), **extra))
    for key, times in sorted(loops.items()):
        conc, flops, h, f, beside, nbytes = key
        block = statistics.median(b for b, _c in times)
        compute_rows.append(LoopRow(
            phase="loop", concurrent=conc, flops=flops, hidden=h, ffn_hidden=f, beside=beside,
            nbytes=nbytes, time_s=block, gflops_per_s=flops / block / 1e9,
            coll_time_s=statistics.median(c for _b, c in times), samples=len(arrivals[key]),
            arrival_sd_s=rank_sd(arrivals[key])))
    compute_rows += _drift_rows(drifts)
    by_size: dict[tuple[int, int], dict[str, float]] = defaultdict(dict)
    for (k, nodes, name, debug), durs in checks.items():
        by_size[(k, nodes)][f"{name}_{debug}" if debug else name] = statistics.median(durs)
    check_rows = []
    for (k, nodes), d in sorted(by_size.items()):
        row: dict[str, Any] = {"group_size": k, "nodes": nodes}
        row.update({f"{name}_s": v for name, v in sorted(d.items())})
        if "all_reduce_tiny_detail" in d and "all_reduce_tiny_off" in d:
            row["detail_check_s"] = d["all_reduce_tiny_detail"] - d["all_reduce_tiny_off"]
        check_rows.append(CheckRow(**row))
    return BenchSummary(meta=meta, comm=comm_rows, compute=compute_rows, checks=check_rows,
                        **_unit_rows(units, cpu)).to_json()


def _drift_rows(drifts: dict[tuple, dict[int, dict[int, list[tuple[float, float]]]]]
                ) -> list[DriftRow]:
    """Per drift case: the round's time (a group's, from the common barrier to the group's
    last member's end; median over rounds) and how far apart the two groups finished it: the
    root mean square over rounds of the difference of their ends (a systematic lead of one
    group counts: it is a wait for the other at FedAvg)."""
    rows = []
    for key, rounds in sorted(drifts.items()):
        conc, flops, h, f, nbytes, k, iters = key
        took, diffs = [], []
        for groups in rounds.values():
            if len(groups) != 2:
                continue
            start = min(t0 for g in groups.values() for t0, _t1 in g)
            ends = [max(t1 for _t0, t1 in groups[g]) for g in sorted(groups)]
            took += [e - start for e in ends]
            diffs.append(ends[0] - ends[1])
        if not diffs:
            continue
        t = statistics.median(took)
        rows.append(DriftRow(
            phase="drift", concurrent=conc, flops=flops, hidden=h, ffn_hidden=f, nbytes=nbytes,
            group_size=k, loop_iters=iters, time_s=t, gflops_per_s=flops * iters / t / 1e9,
            samples=len(diffs), drift_rms_s=math.sqrt(statistics.fmean(d * d for d in diffs)),
            drift_mean_abs_s=statistics.fmean(abs(d) for d in diffs),
            drift_mean_s=statistics.fmean(diffs)))
    return rows


def _unit_rows(cases: dict[tuple, dict[int, float]], cpu_cases: dict[tuple, dict[int, float]]
               ) -> dict[str, Any]:
    """The `units`, `model`, `optimizer` and `fedavg` tables of the summary."""
    unit_rows: list[dict[str, Any]] = []
    alone: dict[tuple[int, str], tuple[float, float]] = {}  # (unit, phase) -> (wall, CPU)
    whole: dict[tuple[str, bool], tuple[float, int, float, int, float]] = {}
    opt_rows: list[dict[str, Any]] = []
    fed_rows: list[dict[str, Any]] = []
    for key, reps in sorted(cases.items(), key=lambda kv: str(kv[0])):
        if not any(rep >= 0 for rep in reps):
            continue
        t, t_min, n = _slowest_median(reps)
        cpu = _slowest_median(cpu_cases[key])[0]
        if key[0] == "units":
            _, kind, unit, name, phase, hooks, params, flops, tokens, rpn, cores, conc, solo = key
            if solo:
                alone[(unit, phase)] = (t, cpu)
                continue
            if kind == "model":
                whole[(phase, hooks)] = (t, n, flops, params, cpu)
                continue
            unit_rows.append({"unit": unit, "name": name, "kind": kind, "phase": phase,
                              "params": params, "flops": flops, "tokens": tokens,
                              "time_s": t, "min_time_s": t_min, "cpu_time_s": cpu,
                              "samples": n, "gflops_per_s": flops / t / 1e9 if t > 0 else 0.0,
                              "ranks_per_node": rpn, "cores": cores, "concurrent": conc})
        elif key[0] == "optimizer":
            _, shard, params, tensors = key
            opt_rows.append({"shard": shard, "params": params, "tensors": tensors, "time_s": t,
                             "min_time_s": t_min, "cpu_time_s": cpu, "samples": n,
                             "first_time_s": reps.get(-1)})
        else:
            _, shard, params, tensors, dtype, nbytes = key
            fed_rows.append({"shard": shard, "nbytes": nbytes, "params": params,
                             "tensors": tensors, "fedavg_dtype": dtype, "time_s": t,
                             "min_time_s": t_min, "cpu_time_s": cpu, "samples": n})
    phase_order = {"forward": 0, "backward": 1}
    unit_rows.sort(key=lambda r: (phase_order.get(r["phase"], 2), r["unit"]))
    for r in unit_rows:
        r["alone_time_s"], r["alone_cpu_time_s"] = alone.get((r["unit"], r["phase"]),
                                                             (None, None))
    model_rows = []
    for phase in ("forward", "backward"):
        plain, hooked = whole.get((phase, False)), whole.get((phase, True))
        if plain is None and hooked is None:
            continue
        units_sum = sum(r["time_s"] for r in unit_rows if r["phase"] == phase)
        base = plain or hooked
        assert base is not None
        model_rows.append({
            "phase": phase, "params": base[3], "flops": base[2],
            "time_s": plain[0] if plain else None, "samples": plain[1] if plain else 0,
            "cpu_time_s": plain[4] if plain else None,
            "hooked_time_s": hooked[0] if hooked else None, "units_sum_s": units_sum,
            "alone_time_s": alone.get((-1, phase), (None,))[0],
            "units_sum_ratio": units_sum / plain[0] if plain and plain[0] > 0 else None,
        })
    opt_rows.sort(key=lambda r: r["shard"])
    fed_rows.sort(key=lambda r: (r["fedavg_dtype"], r["shard"]))
    return {"units": [UnitRow(**r) for r in unit_rows],
            "model": [ModelRow(**r) for r in model_rows],
            "optimizer": [OptimizerRow(**r) for r in opt_rows],
            "fedavg": [FedavgRow(**r) for r in fed_rows]}


def format_summary(summary: dict[str, Any]) -> str:
    m = summary["meta"]
    net = (f"testbed {m.get('testbed')} at {m.get('link_rate_Gbps'):g} Gb/s per node"
           if m.get("network") == "testbed" else "loopback")
    lines = [f"{m.get('world_size')} ranks on {m.get('nodes')} node(s), {net}, "
             f"{m.get('host_cores')} host cores"]
    if summary["comm"]:
        lines.append(f"{'op':<15}{'group':<7}{'p':>3}{'nodes':>6}{'conc':>5}{'nbytes':>10}"
                     f"{'time_ms':>10}{'algbw_Gbps':>11}{'busbw_Gbps':>11}")
        for r in summary["comm"]:
            lines.append(f"{r['op']:<15}{r['group']:<7}{r['group_size']:>3}{r['nodes']:>6}"
                         f"{r['concurrent_groups']:>4}{'c' if r.get('beside') else ' '}"
                         f"{r['nbytes']:>10}"
                         f"{r['time_s'] * 1e3:>10.3f}{r['algbw_Gbps']:>11.3f}"
                         f"{r['busbw_Gbps']:>11.3f}")
    if summary["compute"]:
        lines.append(f"{'phase':<10}{'conc':>5}{'flops':>10}{'h x f':>11}{'time_ms':>10}"
                     f"{'GFLOP/s':>9}")
        for r in summary["compute"]:
            lines.append(f"{r['phase']:<10}{r['concurrent']:>5}{r['flops']:>10.3g}"
                         f"{str(r['hidden']) + 'x' + str(r['ffn_hidden']):>11}"
                         f"{r['time_s'] * 1e3:>10.3f}{r['gflops_per_s']:>9.2f}"
                         + (f"  beside {r['beside']}: all-gather {r['coll_time_s'] * 1e3:.1f} "
                            f"ms, arrivals {r['arrival_sd_s'] * 1e3:.2f} ms apart (sd)"
                            if r["phase"] == "loop" and r["arrival_sd_s"] is not None else "")
                         + (f"  x{r['loop_iters']} loops, two groups: ends "
                            f"{r['drift_rms_s'] * 1e3:.1f} ms apart (rms)"
                            if r["phase"] == "drift" else ""))
    if summary["checks"]:
        lines.append(f"{'p':>3}{'nodes':>6}{'ar_off_us':>11}{'ar_detail_us':>13}"
                     f"{'check_us':>10}{'mbarrier_us':>12}{'ag_tiny_us':>11}")
        for r in summary["checks"]:
            lines.append(
                f"{r['group_size']:>3}{r['nodes']:>6}"
                f"{r.get('all_reduce_tiny_off_s', 0) * 1e6:>11.0f}"
                f"{r.get('all_reduce_tiny_detail_s', 0) * 1e6:>13.0f}"
                f"{r.get('detail_check_s', 0) * 1e6:>10.0f}"
                f"{r.get('monitored_barrier_s', 0) * 1e6:>12.0f}"
                f"{r.get('all_gather_tiny_s', 0) * 1e6:>11.0f}")
    if summary.get("units"):
        lines.append(f"{'unit':<8}{'phase':<10}{'params':>9}{'flops':>10}{'time_ms':>10}"
                     f"{'cpu_ms':>9}{'alone_ms':>9}{'GFLOP/s':>9}")
        for r in summary["units"]:
            alone_ms = (r.get("alone_time_s") or float("nan")) * 1e3
            lines.append(f"{r['name']:<8}{r['phase']:<10}{r['params']:>9}{r['flops']:>10.3g}"
                         f"{r['time_s'] * 1e3:>10.3f}{r['cpu_time_s'] * 1e3:>9.3f}"
                         f"{alone_ms:>9.3f}{r['gflops_per_s']:>9.2f}")
        for r in summary.get("model", []):
            plain = f"{r['time_s'] * 1e3:.1f} ms" if r["time_s"] is not None else "-"
            lines.append(f"whole model {r['phase']}: {plain} plain, units sum "
                         f"{r['units_sum_s'] * 1e3:.1f} ms, hooked "
                         f"{(r['hooked_time_s'] or 0) * 1e3:.1f} ms")
    if summary.get("optimizer"):
        lines.append(f"{'shard':>5}{'params':>10}{'tensors':>8}{'step_ms':>9}{'cpu_ms':>9}"
                     f"{'first_ms':>10}")
        for r in summary["optimizer"]:
            first = r["first_time_s"] * 1e3 if r["first_time_s"] is not None else float("nan")
            lines.append(f"{r['shard']:>5}{r['params']:>10}{r['tensors']:>8}"
                         f"{r['time_s'] * 1e3:>9.3f}{r['cpu_time_s'] * 1e3:>9.3f}{first:>10.1f}")
    if summary.get("fedavg"):
        lines.append(f"{'shard':>5}{'dtype':>6}{'nbytes':>10}{'fedavg_local_ms':>16}")
        for r in summary["fedavg"]:
            lines.append(f"{r['shard']:>5}{r['fedavg_dtype']:>6}{r['nbytes']:>10}"
                         f"{r['time_s'] * 1e3:>16.3f}")
    return "\n".join(lines)


