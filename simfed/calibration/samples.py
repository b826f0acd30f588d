"""Measurements the calibration fits: collective, per-unit compute, optimizer and debug-check
samples, read from realrun bench summaries, realrun traces and PyTorch profiler Chrome traces.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..spec import node_block_groups, ranks_per_core
from ..spec.bench import (
    MAX_NBYTES,
    MAX_TIME_S,
    MIN_TIME_S,
    BenchSummary,
    CommRow,
    ComputeRow,
    DriftRow,
    LoopRow,
)
from ..spec.jsonio import parse_json, read_json
from ..spec.limits import MAX_WORLD
from ..spec.schema import SpecError
from ..spec.trace import read_trace

BENCH_SUMMARY = "bench-summary.json"
_OP_NAMES = {
    "all_gather": "all_gather", "allgather": "all_gather", "_allgather_base": "all_gather",
    "all_gather_into_tensor": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
    "all_gather_single": "all_gather",
    "reduce_scatter": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter",
    "all_reduce": "all_reduce", "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
}
_DTYPE_BYTES = {"float": 4, "float32": 4, "bfloat16": 2, "half": 2, "float16": 2, "double": 8,
                "float64": 8, "c10::bfloat16": 2, "c10::half": 2, "int": 4, "long": 8}


@dataclass(frozen=True)
class CommSample:
    """One collective: `instances` ran at once (concurrent groups), S = nbytes each."""

    op: str  # as asked for (its bandwidth factor)
    instances: tuple[tuple[int, ...], ...]
    nbytes: int
    time_s: float
    world: int
    gpus_per_node: int
    source: str
    label: str = ""
    impl_op: str = ""  # as executed, when it differs (gloo: reduce-scatter as all_reduce)
    link_Gbps: float = 0.0  # the inter-node link rate it ran at (0: the scenario's)
    ranks_per_core: float = 1.0  # most of its ranks one host core carried (CPU testbeds)

    @property
    def run_op(self) -> str:
        return self.impl_op or self.op


@dataclass(frozen=True)
class UnitSample:
    phase: str  # forward | backward
    flops: float
    time_s: float
    source: str
    label: str = ""


@dataclass(frozen=True)
class OptimizerSample:
    params: float  # local parameters updated
    time_s: float
    source: str


@dataclass(frozen=True)
class FedavgSample:
    nbytes: float  # the averaged buffer
    time_s: float  # local work only (the all-reduce is a collective sample)
    source: str


@dataclass(frozen=True)
class CheckSample:
    group_size: int
    time_s: float
    source: str


@dataclass
class Samples:
    comm: list[CommSample] = field(default_factory=list)
    units: list[UnitSample] = field(default_factory=list)
    optimizer: list[OptimizerSample] = field(default_factory=list)
    fedavg: list[FedavgSample] = field(default_factory=list)
    checks: list[CheckSample] = field(default_factory=list)
    # one group's collective while the other groups ran a training-like loop out of step with
    # it, with the same case run by all groups in step and beside idle ranks (`_beside_rows`,
    # `fit_out_of_step`)
    beside: list[dict[str, Any]] = field(default_factory=list)
    compute_beside: list[dict[str, Any]] = field(default_factory=list)  # the same for compute
    # the training-like loop itself beside out-of-step ranks and beside idle ones: how far
    # apart a group's ranks reach each collective (`_loop_rows`)
    loops: list[dict[str, Any]] = field(default_factory=list)
    # two groups on cores of their own running that loop free from a common start: how far
    # apart they finish (`_drift_rows`, `fit_group_drift`)
    drifts: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)  # backend facts (impl, overlap)
    sources: list[str] = field(default_factory=list)
    # per-operator samples of torch.profiler traces with shapes (simfed.calibration.profiler)
    ops: list[Any] = field(default_factory=list)
    # out-of-place rows of nccl-tests stdout files (simfed.calibration.nccl_tests)
    nccl_tests: list[Any] = field(default_factory=list)

    # how unevenly ranks run (cases measured in the run's layout): pooled over re-benchmarks
    POOLED = ("compute_beside", "loops", "drifts", "sources")

    def measured(self) -> bool:
        """Whether these hold any measurement (or a profiler trace's note that it has no
        shapes: calibrate says why nothing was fitted to it)."""
        from .profiler import NO_SHAPES

        return any(getattr(self, f.name) for f in fields(self)
                   if f.name not in ("meta", "sources")) or any(
            str(k).startswith(NO_SHAPES) for k in self.meta)

    def extend(self, other: Samples) -> None:
        for f in fields(self):
            mine = getattr(self, f.name)
            if isinstance(mine, dict):
                mine.update(getattr(other, f.name))
            else:
                mine += getattr(other, f.name)

    def refreshed(self, fresh: Samples) -> Samples:
        """These samples with each compute rate that `fresh` measured (per-unit compute,
        optimizer, FedAvg local work) taken from `fresh` instead, a re-benchmark of the host
        right before the runs to predict; `fresh`'s out-of-step and drift cases join the others
        (how unevenly ranks run is a property of the layout, not of the host's speed that day,
        and one case alone is a noisy estimate)."""
        out = Samples(**{f.name: copy.copy(getattr(self, f.name)) for f in fields(self)})
        for k in ("units", "optimizer", "fedavg"):
            if getattr(fresh, k):
                setattr(out, k, list(getattr(fresh, k)))
        for k in self.POOLED:
            getattr(out, k).extend(getattr(fresh, k))
        return out


def _bench_instances(group: str, size: int, concurrent: int, nodes: int, per_node: int
                     ) -> tuple[tuple[int, ...], ...]:
    """The rank tuples a bench group kind stands for (ranks numbered node by node)."""
    if group == "intra":
        insts = [tuple(n * per_node + i for i in range(size)) for n in range(nodes)]
    elif group == "inter":
        insts = [tuple(n * per_node + loc for n in range(size)) for loc in range(per_node)]
    elif group.startswith("nodes"):  # blocks of b nodes, one rank per node (realrun's "fl")
        insts = [tuple(g) for g in node_block_groups(nodes, per_node,
                                                      int(group.removeprefix("nodes")))]
    else:
        insts = [tuple(range(size))]
    return tuple(insts[: max(1, concurrent)])


def _check_group(row: CommRow, nodes: int, per_node: int, where: str) -> None:
    """A bench row's op and group kind are ones realrun measures, and its group fits the
    bench's nodes x ranks per node (a SpecError naming the row otherwise)."""
    if row.op not in ("all_gather", "reduce_scatter", "all_reduce"):
        raise SpecError(f"{where}: op {row.op!r} is not all_gather, reduce_scatter or "
                        "all_reduce")
    if row.group == "intra":
        most, what = per_node, f"{per_node} ranks per node"
    elif row.group == "inter":
        most, what = nodes, f"{nodes} nodes"
    elif row.group == "world":
        most, what = nodes * per_node, f"{nodes} nodes x {per_node} ranks"
    elif row.group.startswith("nodes") and row.group[5:].isdigit():
        b = int(row.group[5:])
        if not 1 <= b <= nodes:
            raise SpecError(f"{where}: a block of {b} nodes in a bench of {nodes} nodes")
        most, what = nodes, f"{nodes} nodes (one rank per node)"
    else:
        raise SpecError(f"{where}: group {row.group!r} is not intra, inter, world or nodes<b>")
    if row.group_size > most:
        raise SpecError(f"{where}: {row.group_size} ranks in a group of the bench's {what}")


def _malformed_is_bad_input(read):
    """A reader whose malformed input (a missing field, a wrong type, NaN where a count goes)
    is a one-line SpecError naming the file, not a traceback."""
    import functools

    @functools.wraps(read)
    def wrapper(path: Path, *args):
        try:
            return read(path, *args)
        except SpecError:
            raise
        except (KeyError, IndexError, TypeError, ValueError, AttributeError,
                OverflowError) as exc:  # OverflowError: int(inf)
            raise SpecError(f"calibrate: {path}: malformed input ({type(exc).__name__}: "
                            f"{str(exc)[:120]})") from None
    return wrapper


@_malformed_is_bad_input
def read_bench(path: Path) -> Samples:
    """A realrun bench folder (or its bench-summary.json)."""
    p = path / BENCH_SUMMARY if path.is_dir() else path
    if not p.exists():
        raise SpecError(f"calibrate: no bench summary at {p}")
    # a regular file, bounded, UTF-8, nested at most 64 deep (spec.jsonio); a NaN is named
    # by the row check below
    data = read_json(p, "calibrate", allow_nan=True)
    if not isinstance(data, dict):
        raise SpecError(f"calibrate: {p} is not a bench summary (a JSON object)")
    bench = BenchSummary.parse(data, f"calibrate: {p}")  # simfed.spec.bench: the typed rows
    meta = bench.meta
    nodes = int(meta.get("nodes") or 1)  # (checked: whole numbers from 1, BenchSummary.parse)
    per_node = int(meta.get("ranks_per_node") or meta.get("world_size") or 1)
    world = nodes * per_node
    src = str(p)
    out = Samples(sources=[src])
    impl = meta.get("impl", {})
    out.meta["reduce_scatter_impl"] = (
        "all_reduce" if "allreduce" in str(impl.get("reduce_scatter", "")) else "reduce_scatter")
    out.meta["overlap_compute"] = not str(meta.get("overlap", "")).startswith("none")
    out.meta["backend"] = meta.get("backend", "")
    out.meta["device"] = str(meta.get("device") or "")
    # a testbed's ranks share the host's cores: each node's pinned to `cores` of `host_cores`
    # (unpinned, off the testbed: all ranks share all of the host's cores)
    cores = int(meta.get("cores") or 0) if meta.get("network") == "testbed" else 0
    host_cores = int(meta.get("host_cores") or 0)
    if cores and host_cores:
        out.meta["host_cores"] = host_cores
    out.beside += _beside_rows(bench.comm, src)
    for row in bench.comm:
        if row.beside:  # beside out-of-step work: not a sample of the wire/host model
            continue
        op = row.op
        run_op = "all_reduce" if (op == "reduce_scatter"
                                  and out.meta["reduce_scatter_impl"] == "all_reduce") else op
        _check_group(row, nodes, per_node, f"calibrate: {p}: comm row {row.op} {row.group} "
                     f"p={row.group_size}")
        insts = _bench_instances(row.group, row.group_size, row.concurrent_groups, nodes,
                                 per_node)
        out.comm.append(CommSample(
            op=op, instances=insts, nbytes=row.nbytes, time_s=row.time_s,
            world=world, gpus_per_node=per_node, source=src, impl_op=run_op,
            link_Gbps=float(meta.get("link_rate_Gbps") or 0.0),
            ranks_per_core=ranks_per_core([r for i in insts for r in i], per_node, cores,
                                          host_cores),
            label=f"{row.op} {row.group} p={row.group_size} x{len(insts)} {row.nbytes} B"))
    for unit in bench.units:
        out.units.append(UnitSample(phase=unit.phase, flops=float(unit.flops),
                                    time_s=unit.time_s, source=src,
                                    label=f"{unit.kind} {unit.phase}"))
    out.compute_beside += _compute_beside_rows(bench.compute, src)
    out.loops += _loop_rows(bench.compute, src)
    out.drifts += _drift_rows(bench.compute, src)
    if not bench.units:  # fall back on the generic compute block
        for block in bench.compute:
            if block.phase not in ("forward", "backward"):
                continue
            if block.concurrent < per_node:
                continue  # keep the rows measured under training-like contention
            out.units.append(UnitSample(phase=block.phase, flops=float(block.flops),
                                        time_s=block.time_s, source=src,
                                        label=f"block {block.phase}"))
    for opt in bench.optimizer:
        out.optimizer.append(OptimizerSample(params=float(opt.params), time_s=opt.time_s,
                                             source=src))
    for fed in bench.fedavg:
        out.fedavg.append(FedavgSample(nbytes=float(fed.nbytes), time_s=fed.time_s, source=src))
    for check in bench.checks:
        if check.detail_check_s is not None:
            out.checks.append(CheckSample(group_size=check.group_size,
                                          time_s=check.detail_check_s, source=src))
    return out


def _beside_rows(rows: list[CommRow], src: str) -> list[dict[str, Any]]:
    """Each one-group-beside-busy bench row with the same case run by all groups at once, in
    step (every core's ranks in the same collective), and by one group beside idle ranks."""
    def case(r: CommRow) -> tuple:
        return (r.op, r.group, r.group_size, r.nbytes)

    full: dict[tuple, CommRow] = {}
    idle: dict[tuple, CommRow] = {}
    for r in rows:
        if r.beside:
            continue
        k = case(r)
        if r.concurrent_groups == 1:
            idle[k] = r
        if k not in full or r.concurrent_groups > full[k].concurrent_groups:
            full[k] = r
    out = []
    for r in rows:
        k = case(r)
        if r.beside != "busy" or k not in full or full[k].concurrent_groups < 2:
            continue
        out.append({"label": f"{r.op} {r.group} p={r.group_size} {r.nbytes} B",
                    "time_s": r.time_s, "all_groups_s": full[k].time_s,
                    "idle_s": idle[k].time_s if k in idle else None,
                    "cv": r.rank_cv, "all_groups_cv": full[k].rank_cv, "source": src})
    return out


def _compute_beside_rows(rows: list[ComputeRow | LoopRow | DriftRow], src: str
                         ) -> list[dict[str, Any]]:
    """The bench's compute block beside a busy out-of-step half, with the same block run by
    every rank in step."""
    block = [r for r in rows if isinstance(r, ComputeRow) and r.phase == "forward_backward"]
    step = {r.flops: r for r in block if not r.beside}
    return [{"label": f"compute block {r.flops:.3g} FLOP", "time_s": r.time_s,
             "all_groups_s": step[r.flops].time_s, "cv": r.rank_cv,
             "all_groups_cv": step[r.flops].rank_cv, "source": src}
            for r in block if r.beside == "busy" and r.flops in step]


def _loop_rows(rows: list[ComputeRow | LoopRow | DriftRow], src: str) -> list[dict[str, Any]]:
    """The bench's free-running loop (compute block, then an all-gather in the group) beside a
    busy out-of-step half, with the same loop beside idle ranks."""
    loop = [r for r in rows if isinstance(r, LoopRow) and r.arrival_sd_s is not None]
    idle = {(r.flops, r.nbytes): r for r in loop if r.beside == "idle"}
    return [{"label": f"loop {r.flops:.3g} FLOP + all-gather {r.nbytes} B",
             "group_size": r.concurrent, "block_s": r.time_s, "arrival_sd_s": r.arrival_sd_s,
             "idle_arrival_sd_s": idle[k].arrival_sd_s, "idle_coll_s": idle[k].coll_time_s,
             "source": src}
            for r in loop if r.beside == "busy" and (k := (r.flops, r.nbytes)) in idle]


ABS_OF_SD = math.sqrt(2 / math.pi)  # E|x| / sd of a normal x


def _drift_rows(rows: list[ComputeRow | LoopRow | DriftRow], src: str) -> list[dict[str, Any]]:
    """The bench's two groups running the loop free from a common start: the round's time and
    how far apart the groups finished it (mean size and rms of the difference; a summary that
    has only the rms, from the drift case's first version, gives the mean of a normal one)."""
    return [{"label": f"drift x{r.loop_iters} loops of {r.flops:.3g} FLOP + all-gather "
                      f"{r.nbytes} B", "time_s": r.time_s, "rms_s": r.drift_rms_s,
             "mean_abs_s": (r.drift_mean_abs_s if r.drift_mean_abs_s is not None
                            else r.drift_rms_s * ABS_OF_SD),
             "samples": r.samples, "source": src}
            for r in rows if isinstance(r, DriftRow) and r.samples >= 2]


@_malformed_is_bad_input
def _distinct_ranks(ranks: Any) -> bool:
    """A list of distinct ranks: whole numbers from 0 below the largest world simfed takes."""
    return isinstance(ranks, list) and all(
        isinstance(r, int) and not isinstance(r, bool) and 0 <= r < MAX_WORLD
        for r in ranks) and len(set(ranks)) == len(ranks)


def read_realrun_trace(path: Path, gpus_per_node: int) -> Samples:
    """Collectives from a realrun training trace (cat comm spans with attrs.ranks)."""
    meta, spans = read_trace(path)
    out = Samples(sources=[str(path)])
    world = meta.get("world_size") or 0
    if isinstance(world, bool) or not isinstance(world, int) or not 0 <= world <= MAX_WORLD:
        raise SpecError(f"calibrate: {path}: meta.world_size is {world!r}; expected a whole "
                        f"number from 1 to {MAX_WORLD:,}")
    gloo = meta.get("backend") == "gloo"
    out.meta["device"] = str(meta.get("device") or "")
    for s in spans:
        if s.cat != "comm" or s.dur_s <= 0 or not s.nbytes:
            continue
        op = _OP_NAMES.get(s.name)
        ranks = s.attrs.get("ranks")
        if op is None or ranks is None:
            continue
        where = f"calibrate: {path}: rank {s.rank} step {s.step} {s.name}"
        if not _distinct_ranks(ranks):  # (before: a number here was a TypeError, exit 3)
            raise SpecError(f"{where}: attrs.ranks {str(ranks)[:80]} is not a list of distinct "
                            "ranks (whole numbers from 0)")
        if len(ranks) < 2:
            continue
        if world and max(ranks) >= world:
            raise SpecError(f"{where}: attrs.ranks reaches rank {max(ranks)} of a world of "
                            f"{world} (meta.world_size)")
        if not MIN_TIME_S <= s.dur_s <= MAX_TIME_S or s.nbytes > MAX_NBYTES:
            raise SpecError(f"{where}: {s.dur_s!r} s for {s.nbytes!r} B; expected a measured "
                            f"time of {MIN_TIME_S:g} to {MAX_TIME_S:g} s and at most "
                            f"{MAX_NBYTES:,} B")
        run_op = "all_reduce" if gloo and op == "reduce_scatter" else op
        out.comm.append(CommSample(op=op, instances=(tuple(ranks),), nbytes=int(s.nbytes),
                                   time_s=s.dur_s, world=world, gpus_per_node=gpus_per_node,
                                   source=str(path), label=f"{s.name} {s.group}",
                                   impl_op=run_op))
    if gloo:
        out.meta.update(reduce_scatter_impl="all_reduce", overlap_compute=False,
                        backend="gloo")
    return out


@_malformed_is_bad_input
def read_chrome(path: Path, gpus_per_node: int) -> Samples:
    """NCCL kernels from a PyTorch profiler Chrome trace: args 'Collective name',
    'In msg nelems' / 'Out msg nelems', 'dtype', 'Group size', 'Process Group Ranks'; and,
    when it has shapes (record_shapes), its per-operator samples (calibration.profiler)."""
    from .profiler import (
        NO_SHAPES,
        check_times,
        is_profiler_trace,
        load_trace,
        op_samples,
        trace_events,
    )

    data = load_trace(path)  # .json or .json.gz
    events = trace_events(data)
    check_times(events, str(path))
    out = Samples(sources=[str(path)])
    if is_profiler_trace(events):
        out.ops += op_samples(data, str(path))
    elif any(str(e.get("cat", "")).lower() in ("cpu_op", "operator") for e in events):
        out.meta[NO_SHAPES + str(path)] = True  # profiled without record_shapes
    kernels = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"
               and "Collective name" in (e.get("args") or {})]
    gpu = [e for e in kernels if str(e.get("cat", "")).lower() in ("kernel", "gpu", "cuda")]
    for e in gpu or kernels:
        a = e["args"]
        op = _OP_NAMES.get(str(a["Collective name"]).lower())
        if op is None:
            continue
        where = f"calibrate: {path}: the NCCL kernel {str(e.get('name', op))[:40]!r} at ts " \
                f"{e.get('ts')!r}"
        size = _DTYPE_BYTES.get(str(a.get("dtype", "float")).lower(), 4)
        n_in = int(a.get("In msg nelems", 0))
        n_out = int(a.get("Out msg nelems", n_in))
        nbytes = size * (n_out if op == "all_gather" else n_in)
        if not 0 <= min(n_in, n_out) <= max(n_in, n_out, nbytes) <= MAX_NBYTES:
            raise SpecError(f"{where}: In/Out msg nelems {n_in}/{n_out} ({nbytes} B); expected "
                            f"0 to {MAX_NBYTES:,} B")
        ranks = a.get("Process Group Ranks")
        if isinstance(ranks, str):  # a JSON list as text: bounded, nested at most 64 deep
            if len(ranks) > 8 * MAX_WORLD:  # (up to MAX_WORLD ranks of up to 7 digits)
                raise SpecError(f"{where}: Process Group Ranks is {len(ranks):,} characters; "
                                f"at most {8 * MAX_WORLD:,} (a list of {MAX_WORLD:,} ranks)")
            ranks = parse_json(ranks, where)
        if ranks is not None and not _distinct_ranks(ranks):
            raise SpecError(f"{where}: Process Group Ranks {str(ranks)[:80]} is not a list of "
                            "distinct ranks (whole numbers from 0)")
        p = int(a.get("Group size", len(ranks) if ranks else 0))
        # (the ranks may be fewer: a profiler may shorten a long list; never more)
        if (ranks and p < len(ranks)) or not 0 <= p <= MAX_WORLD:
            raise SpecError(f"{where}: Group size {p} for Process Group Ranks "
                            f"{str(ranks)[:80]}")
        if p < 2 or nbytes <= 0:
            continue
        dur = float(e["dur"])  # (0 or 1 ns to 10^7 s: profiler.check_times)
        if dur <= 0:
            continue
        inst = tuple(ranks) if ranks else tuple(range(p))
        out.comm.append(CommSample(op=op, instances=(inst,), nbytes=nbytes,
                                   time_s=dur * 1e-6, world=max(inst) + 1,
                                   gpus_per_node=gpus_per_node, source=str(path),
                                   label=f"{e.get('name', op)[:40]}"))
    return out


@_malformed_is_bad_input
def read_profile_ops(path: Path) -> Samples:
    """Only the per-operator samples of a torch.profiler trace."""
    from .profiler import NO_SHAPES, is_profiler_trace, load_trace, op_samples, trace_events

    data = load_trace(path)
    out = Samples(sources=[str(path)])
    if is_profiler_trace(trace_events(data)):
        out.ops = op_samples(data, str(path))
    else:
        out.meta[NO_SHAPES + str(path)] = True  # profiled without record_shapes
    return out


def device_note(samples: Samples, gpu_name: str) -> str | None:
    """A note when realrun measured CPU ranks for a cluster of GPUs or the other way round
    (the cluster's `gpu.name` for CPU ranks starts with "cpu", as scenarios/clusters/cpu4.yaml):
    a CPU benchmark's efficiencies and latencies do not describe GPUs."""
    device = str(samples.meta.get("device") or "")
    cpu_cluster = gpu_name.lower().startswith("cpu")
    if device == "cpu" and not cpu_cluster:
        return (f"note: the measurements ran on CPU ranks ({samples.meta.get('backend') or 'gloo'})"
                f" but the scenario's cluster has {gpu_name} GPUs: the profile describes those "
                "CPU ranks, not the GPUs")
    if device.startswith("cuda") and cpu_cluster:
        return (f"note: the measurements ran on GPUs ({device}) but the scenario's cluster is of "
                f"CPU ranks ({gpu_name}): the profile describes the GPUs")
    return None


def read_inputs(paths: list[Path], gpus_per_node: int) -> Samples:
    """Any mix of bench folders/summaries, realrun traces (.jsonl), Chrome traces (.json) and
    nccl-tests stdout files."""
    from .nccl_tests import is_nccl_tests_file, read_nccl_tests

    out = Samples()
    for p in paths:
        if not p.exists():
            raise SpecError(f"calibrate: input not found: {p}")
        one = Samples()
        if p.is_dir():
            if (p / BENCH_SUMMARY).exists():
                one = read_bench(p)
                what = "bench rows"
            else:
                traces = sorted(p.glob("trace_rank*.jsonl"))
                profiles = sorted([*p.glob("profile_rank*.json"),
                                   *p.glob("profile_rank*.json.gz")])
                if not traces and not profiles:
                    raise SpecError(f"calibrate: {p} holds neither {BENCH_SUMMARY} nor "
                                    "trace_rank*.jsonl nor profile_rank*.json")
                for t in traces:
                    one.extend(read_realrun_trace(t, gpus_per_node))
                for t in profiles:  # `realrun run --profile-steps`: torch.profiler operators
                    one.extend(read_profile_ops(t))  # (collectives: from trace_rank*.jsonl)
                what = ("collective spans with attrs.ranks (trace_rank*.jsonl) or operators "
                        "(profile_rank*.json)")
        elif p.name == BENCH_SUMMARY:
            one = read_bench(p)
            what = "bench rows"
        elif p.suffix == ".jsonl":
            one = read_realrun_trace(p, gpus_per_node)
            what = "collective spans with attrs.ranks"
        elif p.suffix == ".json" or p.name.endswith(".json.gz"):
            one = read_chrome(p, gpus_per_node)
            what = "NCCL kernels or profiled operators (traceEvents)"
        elif is_nccl_tests_file(p):  # all_reduce_perf & co.'s stdout
            one.nccl_tests.extend(read_nccl_tests(p))
            one.sources.append(str(p))
            what = "nccl-tests rows"
        else:
            raise SpecError(f"calibrate: {p}: expected a bench folder, a .jsonl realrun trace, "
                            "a .json (.json.gz) Chrome trace or nccl-tests output (text)")
        if not one.measured():  # the wrong file, or one cut short: not a profile of nothing
            raise SpecError(f"calibrate: {p}: nothing to fit in it (no {what})")
        out.extend(one)
    return out
