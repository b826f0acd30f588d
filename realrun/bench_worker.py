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
import socket
import sys
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from simfed.spec import (
    Scenario,
    Span,
    SpecError,
    TraceWriter,
    load_scenario,
    node_block_groups,
    to_plain,
)
from simfed.spec.overrides import parse_sets

from .bench import GROUP_KINDS, OPS, PARTS
from .errors import RealrunError
from .unitbench import UnitBench, shard_sizes

Busy = Callable[[Any], None]  # what idle ranks do during a repetition, given its end barrier

DEFAULT_SIZES = (4096, 65536, 524288, 2097152)
DEFAULT_FLOPS = (1e5, 1e6, 1e7, 1e8)
# How gloo (torch's ProcessGroupGloo) carries out each call on CPU tensors.
GLOO_IMPL = {
    "all_gather": "gloo_allgather",
    "reduce_scatter": "gloo_allreduce",  # all-reduce of the whole input, then keep one chunk
    "all_reduce": "gloo_allreduce",
}
# torch 2.13 renamed the tensor-in/tensor-out collectives; same gloo calls underneath
all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


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


class Bench:
    """The state of one rank: topology, trace writer, the common clock."""

    def __init__(self, args: argparse.Namespace, scenario: Scenario | None = None):
        self.args, self.scenario = args, scenario
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.ranks_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", self.world))
        if self.world % self.ranks_per_node:
            raise SystemExit(f"error: world {self.world} is not a multiple of "
                             f"LOCAL_WORLD_SIZE {self.ranks_per_node}")
        self.nodes = self.world // self.ranks_per_node
        self.node = self.rank // self.ranks_per_node
        # one clock for all ranks: rank 0's wall time at start (same host, shared clock)
        t0 = torch.tensor([time.time()], dtype=torch.float64)
        dist.broadcast(t0, src=0)
        self.epoch_wall = float(t0.item())
        self.case = 0
        self._block: Callable[[], None] | None = None
        # every rank's host cores (the testbed pins each node to some), as bit masks
        mask = torch.tensor([sum(1 << c for c in os.sched_getaffinity(0) if c < 63)],
                            dtype=torch.int64)
        masks = [torch.zeros_like(mask) for _ in range(self.world)]
        dist.all_gather(masks, mask)
        self.core_mask = [int(m.item()) for m in masks]
        self.writer = TraceWriter(Path(args.out) / f"bench-rank{self.rank}.jsonl", self.meta())

    def meta(self) -> dict[str, Any]:
        env = os.environ
        return {
            "source": "realrun", "kind": "bench", "backend": "gloo", "device": "cpu",
            "world_size": self.world, "nodes": self.nodes, "ranks_per_node": self.ranks_per_node,
            "node": self.node, "host": socket.gethostname(), "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "cores": len(os.sched_getaffinity(0)),
            "host_cores": int(env.get("SIMFED_TESTBED_HOST_CORES", os.cpu_count() or 1)),
            "network": "testbed" if env.get("SIMFED_TESTBED") else "loopback",
            "testbed": env.get("SIMFED_TESTBED", ""),
            "link_rate_Gbps": float(env.get("SIMFED_TESTBED_RATE_GBPS", 0) or 0),
            "ifname": env.get("GLOO_SOCKET_IFNAME", ""),
            "impl": dict(GLOO_IMPL), "dtype": "float32",
            "nbytes_convention": "full buffer: all_gather output, reduce_scatter input, "
                                 "all_reduce buffer",
            "overlap": "none: gloo collectives run on the CPU and block the caller",
            "skip": sorted(x for x in self.args.skip.split(",") if x),
            **self.scenario_meta(),
        }

    def scenario_meta(self) -> dict[str, Any]:
        sc = self.scenario
        if sc is None:
            return {}
        return {"scenario": sc.name, "scenario_path": self.args.scenario,
                "model": to_plain(sc.model), "model_params": sc.model.total_params,
                "seq_len": sc.training.seq_len, "micro_batch": sc.training.micro_batch}

    def now_s(self) -> float:
        return time.time() - self.epoch_wall

    def span(self, name: str, cat: str, start_s: float, dur_s: float, *, rep: int,
             nbytes: int = 0, group: str = "", attrs: dict[str, Any] | None = None) -> None:
        self.writer.write(Span(name=name, cat=cat, rank=self.rank, step=rep, start_s=start_s,
                               dur_s=dur_s, nbytes=nbytes, group=group, stream=cat,
                               attrs=attrs or {}))

    def repeat(self, active: bool, fn: Callable[[int], None], budget_s: float = 0.0, *,
               share: int = 1, first: int = 0, busy: Busy | None = None) -> None:
        """warmup + iters repetitions; each starts with a world barrier; `fn(rep)` runs (and
        records, for rep >= 0) only where `active`; with `busy`, the other ranks run
        `busy(work)` meanwhile, where `work` is the next barrier, entered early and
        asynchronously, which completes when the active ranks are done. With `budget_s`, as
        many timed repetitions as fit in it at the slowest rank's warm-up pace (at least
        --min-iters, at most --iters); every rank takes the same count. With `share` > 1
        this is one of that many passes over the case: 1/share of those repetitions, numbered
        from `first`."""
        a = self.args
        slowest = 0.0

        def warm(i: int) -> None:
            nonlocal slowest
            t = time.perf_counter()
            fn(i - a.warmup)
            slowest = max(slowest, time.perf_counter() - t)

        self._reps(range(a.warmup), active, warm, busy)
        reps = a.iters
        if budget_s > 0 and a.warmup > 0:
            pace = torch.tensor([slowest], dtype=torch.float64)
            dist.all_reduce(pace, op=dist.ReduceOp.MAX)
            fit = int(budget_s / max(float(pace.item()), 1e-9))
            reps = max(min(a.min_iters, a.iters), min(a.iters, fit))
        reps = -(-reps // max(1, share))
        self._reps(range(first, first + reps), active, fn, busy)

    @staticmethod
    def _reps(reps: range, active: bool, fn: Callable[[int], None],
              busy: Busy | None) -> None:
        """One world barrier before each repetition (and, with `busy`, one after the last:
        the busy ranks enter each next barrier early, asynchronously, and work until it
        completes, so every rank makes the same barrier calls in the same order)."""
        pending = False
        for i in reps:
            if not pending:
                dist.barrier()
            pending = False
            if active:
                fn(i)
            elif busy is not None:
                work = dist.barrier(async_op=True)
                busy(work)
                work.wait()
                pending = True
        if busy is not None and active and len(reps):
            dist.barrier()

    # ---- groups ---------------------------------------------------------------------------
    def group_layout(self) -> dict[str, list[list[int]]]:
        g, n = self.ranks_per_node, self.nodes
        layout: dict[str, list[list[int]]] = {}
        if g > 1:
            layout["intra"] = [list(range(i * g, (i + 1) * g)) for i in range(n)]
        if n > 1:
            layout["inter"] = [[local + i * g for i in range(n)] for local in range(g)]
        if n > 1 and g > 1:  # else the world group is the intra (one node) or inter group
            layout["world"] = [list(range(self.world))]
        # fl: the scenario's federation groups that span nodes (blocks of b nodes), ranks at
        # one position of each node of a block: FL+FSDP's shard groups with one rank per node
        blocks = sorted({a.group_nodes for a in (self.scenario.algorithms if self.scenario
                                                 else ()) if 1 < a.group_nodes < n
                         and n % a.group_nodes == 0})
        for b in blocks:
            layout[f"nodes{b}"] = node_block_groups(n, g, b)
        return layout

    def shares_cores(self, ranks: Sequence[int]) -> bool:
        """Whether some host core of `ranks` also runs a rank outside them."""
        mine = 0
        for r in ranks:
            mine |= self.core_mask[r]
        return any(self.core_mask[q] & mine for q in range(self.world) if q not in ranks)

    def nodes_of(self, ranks: Sequence[int]) -> int:
        return len({r // self.ranks_per_node for r in ranks})

    # ---- collectives ----------------------------------------------------------------------
    def comm(self, kinds: Sequence[str], ops: Sequence[str], sizes: Sequence[int]) -> None:
        layout = self.group_layout()
        kinds = [k for kind in kinds
                 for k in ([x for x in layout if x.startswith("nodes")] if kind == "fl"
                           else [kind])]
        cases: list[tuple] = []
        for kind in kinds:
            if kind not in layout:
                continue
            members = layout[kind]
            # every rank creates every group, in the same order
            pgs = [dist.new_group(ranks) if len(members) > 1 or kind != "world"
                   else dist.group.WORLD for ranks in members]
            mine = next(i for i, ranks in enumerate(members) if self.rank in ranks)
            # all groups at once (in step: each repetition starts at a barrier); one group with
            # the others idle; and, where the first group shares host cores with other ranks,
            # one group while the others run a training-like loop out of step with it, as
            # federation groups do between FedAvg rounds
            modes = [(len(members), "")] + ([(1, "")] if len(members) > 1 else [])
            if len(members) > 1 and self.args.beside_busy and self.shares_cores(members[0]):
                modes.append((1, "busy"))
            for concurrent, beside in modes:
                active = mine < concurrent
                for op in ops:
                    for nbytes in sizes:
                        cases.append((kind, members[mine], pgs[mine], mine, concurrent, active,
                                      op, nbytes, beside))
        # interleaved: every case once per round, its repetitions shared out over the rounds
        rounds = max(1, self.args.rounds)
        for rnd in range(rounds):
            for i, case in enumerate(cases):
                self.comm_case(*case, case_id=i + 1, rnd=rnd, rounds=rounds)

    def comm_case(self, kind: str, ranks: list[int], pg: Any, index: int, concurrent: int,
                  active: bool, op: str, nbytes: int, beside: str = "", *, case_id: int = 0,
                  rnd: int = 0, rounds: int = 1) -> None:
        k = len(ranks)
        full, part = gather_buffers(nbytes, k, fill=1.0)
        call: Callable[[], Any] = {
            "all_gather": lambda: all_gather(full, part, group=pg),
            "reduce_scatter": lambda: _reduce_scatter(part, full, group=pg),
            "all_reduce": lambda: dist.all_reduce(full, group=pg),
        }[op]
        attrs = {"group_size": k, "nodes": self.nodes_of(ranks), "ranks": ranks,
                 "group_index": index, "concurrent_groups": concurrent,
                 "impl": GLOO_IMPL[op], "case": case_id, "round": rnd}
        if beside:
            attrs["beside"] = beside

        def once(rep: int) -> None:
            start = self.now_s()
            t = time.perf_counter()
            call()
            dur = time.perf_counter() - t
            if rep >= 0:
                self.span(op, "comm", start, dur, rep=rep, nbytes=full.numel() * 4, group=kind,
                          attrs=attrs)

        # repetition numbers stay distinct over the rounds (the summary keys samples by them)
        self.repeat(active, once, self.args.case_budget_s, share=rounds,
                    first=rnd * self.args.iters,
                    busy=self.training_loop(call, pg) if beside == "busy" else None)

    def training_loop(self, call: Callable[[], Any], pg: Any) -> Busy:
        """What the ranks of another group do meanwhile: a compute block (~10 ms, a training
        unit's order), then the case's collective in their own group, over and over, free-
        running (not aligned with the timed group) until `work` completes; after each round
        the group agrees whether any member saw it complete, so all stop together."""
        block = self.compute_block()

        def run(work: Any) -> None:
            flag = torch.zeros(1)
            while True:
                block()
                call()
                flag[0] = 1.0 if work.is_completed() else 0.0
                dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=pg)
                if flag[0] > 0:
                    return

        return run

    def compute_block(self) -> Callable[[], None]:
        """The compute block's forward and backward over 256 tokens (~10 ms on one core)."""
        if self._block is None:
            h, f = self.args.hidden, self.args.ffn_hidden
            gen = torch.Generator().manual_seed(self.rank)
            w1 = (torch.randn(h, f, generator=gen) / h**0.5).requires_grad_()
            w2 = (torch.randn(f, h, generator=gen) / f**0.5).requires_grad_()
            x = torch.randn(256, h, generator=gen)

            def block() -> None:
                (torch.nn.functional.gelu(x @ w1) @ w2).sum().backward()
                w1.grad = w2.grad = None

            self._block = block
        return self._block

    def block_case(self, concurrent: int, **extra: Any) -> dict[str, Any]:
        """A new case of the compute block: the attributes of its spans."""
        self.case += 1
        h, f = self.args.hidden, self.args.ffn_hidden
        return {"tokens": 256, "hidden": h, "ffn_hidden": f, "dtype": "float32",
                "concurrent": concurrent, "block": "mlp", "case": self.case,
                "flops": 3 * 4 * 256 * h * f,  # forward and backward of 256 tokens
                "threads": torch.get_num_threads(), **extra}

    # ---- compute --------------------------------------------------------------------------
    def compute(self, flops_list: Sequence[float]) -> None:
        h, f = self.args.hidden, self.args.ffn_hidden
        torch.manual_seed(self.rank)
        w1 = (torch.randn(h, f) / h**0.5).requires_grad_()
        w2 = (torch.randn(f, h) / f**0.5).requires_grad_()
        for concurrent in (self.world, 1):
            for target in flops_list:
                tokens = max(1, round(target / (4 * h * f)))
                x = torch.randn(tokens, h, requires_grad=True)
                grad = torch.ones(tokens, h)
                fwd_flops = 4 * tokens * h * f  # two matmuls, 2 FLOPs per multiply-add
                self.case += 1
                attrs = {"tokens": tokens, "hidden": h, "ffn_hidden": f, "dtype": "float32",
                         "concurrent": concurrent, "block": "mlp", "case": self.case,
                         "threads": torch.get_num_threads()}

                def once(rep: int, x: torch.Tensor = x, grad: torch.Tensor = grad,
                         fwd_flops: int = fwd_flops, attrs: dict[str, Any] = attrs) -> None:
                    start = self.now_s()
                    t = time.perf_counter()
                    y = torch.nn.functional.gelu(x @ w1) @ w2
                    t_fwd = time.perf_counter() - t
                    mid = self.now_s()
                    t = time.perf_counter()
                    y.backward(grad)  # grads of x, w1, w2: twice the forward FLOPs
                    t_bwd = time.perf_counter() - t
                    if rep >= 0:
                        self.span("forward", "compute", start, t_fwd, rep=rep,
                                  attrs={**attrs, "flops": fwd_flops})
                        self.span("backward", "compute", mid, t_bwd, rep=rep,
                                  attrs={**attrs, "flops": 2 * fwd_flops})
                    x.grad = w1.grad = w2.grad = None

                self.repeat(self.rank < concurrent, once)



def gather_buffers(nbytes: int, k: int, fill: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """A group of k's all-gather buffers for about `nbytes` (float32, the full one divisible
    by k): (full, one rank's part)."""
    numel = max(k, (nbytes // 4) // k * k)
    return torch.full((numel,), fill), torch.full((numel // k,), fill)


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
    # the cases in modules of their own, which build on Bench
    from .bench_checks import checks
    from .bench_contention import compute_beside_busy, group_drift

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
