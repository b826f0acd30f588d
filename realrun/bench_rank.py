"""The state of one rank of `realrun bench` (`Bench`: topology, trace writer, the common clock,
the timed cases of collectives and compute) and the helpers the cases share.

`realrun.bench_worker` runs a rank; the out-of-step cases (`realrun.bench_contention`) and the
debug-check cases (`realrun.bench_checks`) build on `Bench`. Import order, one way:
bench_rank <- bench_checks, bench_contention <- bench_worker.
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from simfed.spec import Scenario, Span, TraceWriter, node_block_groups, to_plain

Busy = Callable[[Any], None]  # what idle ranks do during a repetition, given its end barrier

# How gloo (torch's ProcessGroupGloo) carries out each call on CPU tensors.
GLOO_IMPL = {
    "all_gather": "gloo_allgather",
    "reduce_scatter": "gloo_allreduce",  # all-reduce of the whole input, then keep one chunk
    "all_reduce": "gloo_allreduce",
}
# torch 2.13 renamed the tensor-in/tensor-out collectives; same gloo calls underneath
all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


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
