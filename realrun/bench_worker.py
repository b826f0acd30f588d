"""One rank of `realrun bench`: timed collectives, compute, the model's units, optimizer, checks.

Run by torchrun: collectives over intra-node, inter-node and world groups (and, with a scenario,
its federation groups of several nodes: "nodes{b}"), a matmul block's
forward/backward, the host cost of TORCH_DISTRIBUTED_DEBUG=DETAIL and, with --scenario, the
scenario's real model per FSDP unit, its optimizer step per shard size and FedAvg's local work
(`realrun.unitbench`).

Writes `OUT/bench-rank{R}.jsonl` in the simfed trace schema (simfed.spec.trace); step = the
repetition (-1: an optimizer's first step):
- cat "comm", name all_gather | reduce_scatter | all_reduce, group intra | inter | world | nodes{b},
  nbytes = the full buffer (all-gather output, reduce-scatter input, all-reduce buffer: the
  nccl-tests convention), attrs: group_size, nodes (spanned), ranks, concurrent_groups (groups of
  that kind running the same collective at once), beside ("busy": the other ranks ran a
  training-like loop meanwhile, free-running: a compute block, then the same collective in their
  own group; absent: they waited), impl, case, rep.
- cat "compute", name forward | backward, attrs: flops, tokens, hidden, ffn_hidden, concurrent
  (ranks computing at once); name forward_backward: the block over 256 tokens, all ranks in
  step, or (attrs beside "busy") the first half beside the other half's training-like loop.
- cat "compute", name forward | backward, attrs bench "units": unit (ModelSpec.units index, -1 =
  the whole model), unit_name, kind layer | root | model, phase, params, flops (simfed's
  convention x tokens), tokens, micro_batch, seq_len, hooks (false: a plain whole-model
  iteration), alone (one rank per node computing), cpu_s, ranks_per_node, cores, concurrent,
  threads.
- cat "host", name optimizer, attrs bench "optimizer": shard, params (local), tensors,
  param_nbytes, first (the first step); name fedavg_local, nbytes = the FedAvg buffer, attrs
  bench "fedavg": shard, params, tensors, fedavg_dtype.
- cat "host", name all_reduce_tiny (attrs debug off | detail), monitored_barrier, all_gather_tiny,
  attrs group_size, nodes, ranks: the per-collective checks DETAIL adds are a monitored barrier
  and an all-gather of the op's fingerprint on a helper gloo group.
The out-of-step cases are in realrun.bench_contention, the DETAIL checks in realrun.bench_checks.
Before each timed repetition every rank meets at a world barrier, so concurrent groups start
together; a rank's span is its own wall time for the call (gloo runs collectives on the CPU and
returns when done: nothing overlaps).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from simfed.spec import Scenario, SpecError, load_scenario
from simfed.spec.ops import OPS
from simfed.spec.overrides import parse_sets

from .bench_cases import GROUP_KINDS, PARTS
from .bench_checks import checks
from .bench_contention import compute_beside_busy, group_drift
from .bench_rank import Bench
from .errors import RealrunError
from .unitbench import UnitBench, shard_sizes

DEFAULT_SIZES = (4096, 65536, 524288, 2097152)
DEFAULT_FLOPS = (1e5, 1e6, 1e7, 1e8)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m realrun.bench_worker", description=__doc__)
    p.add_argument("--out", required=True, help="folder for bench-rank{R}.jsonl")
    p.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)),
                   help="message sizes in bytes (full buffer), comma-separated")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--groups", default=",".join(GROUP_KINDS))
    p.add_argument("--iters", type=int, default=8, help="timed repetitions per case")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--flops", default=",".join(f"{f:g}" for f in DEFAULT_FLOPS),
                   help="forward FLOPs of the compute block, comma-separated ('' = skip)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--ffn-hidden", type=int, default=1024)
    p.add_argument("--check-iters", type=int, default=10,
                   help="repetitions of the debug-check benchmark (0 = skip)")
    p.add_argument("--timeout-s", type=float, default=300.0, help="collective timeout")
    p.add_argument("--case-budget-s", type=float, default=0.0,
                   help="cap a collective case's repetitions at this many seconds (after the "
                   "warm-up; at least --min-iters); 0 = always --iters")
    p.add_argument("--min-iters", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3,
                   help="passes over all collective cases, each taking its share of the "
                   "repetitions: a disturbance of the machine (a TCP timeout, another tenant) "
                   "then spoils one sample of many cases, which the median drops, rather than "
                   "every sample of one case")
    p.add_argument("--beside-busy", type=int, default=1,
                   help="1: also time each collective of one group while the other groups run "
                   "a training-like loop out of step with it (where they share its host cores); "
                   "0: skip those cases")
    p.add_argument("--scenario", default="", help="scenario YAML: model and training shapes for "
                   "the unit, optimizer and FedAvg benchmarks")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--skip", default="", help=f"parts to skip: {', '.join(PARTS)}")
    p.add_argument("--unit-iters", type=int, default=8,
                   help="hooked (and as many plain) iterations of the unit benchmark")
    p.add_argument("--opt-iters", type=int, default=5, help="repetitions of the optimizer and "
                   "FedAvg-local benchmarks")
    p.add_argument("--shards", default="", help="shard sizes for the optimizer benchmark "
                   "(default: the scenario's plans and 1, 2, 4)")
    return p.parse_args(argv)


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def load(args: argparse.Namespace) -> Scenario | None:
    if not args.scenario:
        return None
    try:
        return load_scenario(args.scenario, parse_sets(args.overrides))
    except (SpecError, RealrunError) as exc:
        raise SystemExit(f"error: {exc}") from None


def run_units(bench: Bench, scenario: Scenario, skip: set[str]) -> None:
    """The unit, optimizer and FedAvg-local benchmarks (see `realrun.unitbench`)."""
    a = bench.args

    def emit(name: str, cat: str, start_s: float, dur_s: float, rep: int, *, nbytes: int = 0,
             attrs: dict[str, Any] | None = None) -> None:
        bench.case += 1
        bench.span(name, cat, start_s, dur_s, rep=rep, nbytes=nbytes,
                   attrs={**(attrs or {}), "case": bench.case})

    ub = UnitBench(scenario, emit=emit, now=bench.now_s, barrier=dist.barrier,
                   timeout_s=a.timeout_s, rank=bench.rank,
                   ranks_per_node=bench.ranks_per_node, world=bench.world)
    if "units" not in skip and a.unit_iters > 0:
        ub.units(a.unit_iters)
    if "optimizer" not in skip and a.opt_iters > 0:
        shards = [int(x) for x in _floats(a.shards)] or shard_sizes(scenario)
        ub.optimizer(shards, a.opt_iters)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    skip = {x for x in args.skip.split(",") if x}
    if skip - set(PARTS):
        raise SystemExit(f"error: --skip: unknown {', '.join(sorted(skip - set(PARTS)))}; "
                         f"valid: {', '.join(PARTS)}")
    scenario = load(args)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout_s))
    try:
        bench = Bench(args, scenario)
        t = time.perf_counter()
        ops = [o for o in args.ops.split(",") if o]
        kinds = [k for k in args.groups.split(",") if k]
        bad = [o for o in ops if o not in OPS] + [k for k in kinds if k not in GROUP_KINDS]
        if bad:
            raise SystemExit(f"error: unknown op/group {', '.join(bad)}; valid: "
                             f"{', '.join(OPS + GROUP_KINDS)}")
        sizes = [int(s) for s in _floats(args.sizes)]
        if "comm" not in skip and ops and sizes:
            bench.comm(kinds, ops, sizes)
        if "compute" not in skip and _floats(args.flops):
            bench.compute(_floats(args.flops))
            if args.beside_busy and bench.world > 1:
                nbytes = sorted(sizes)[len(sizes) // 2] if sizes else 1 << 20
                compute_beside_busy(bench, nbytes)
                group_drift(bench, nbytes)
        if scenario is not None and not {"units", "optimizer"} <= skip:
            run_units(bench, scenario, skip)
        if "checks" not in skip and args.check_iters > 0 and bench.world > 1:
            checks(bench, args.check_iters)
        dist.barrier()
        bench.writer.close()
        if bench.rank == 0:
            print(f"bench: {bench.world} ranks on {bench.nodes} node(s), "
                  f"{time.perf_counter() - t:.1f} s", file=sys.stderr)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as realrun.train: interpreter teardown after gloo shutdown can abort
