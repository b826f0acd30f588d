"""Per-FSDP-unit compute, optimizer-step and FedAvg-local benchmarks of a scenario's real model.

Run on every rank at once by `realrun.bench_worker` (so the ranks of a testbed node share its
cores as in training), with no communication: the model is wrapped as `realrun.train` wraps it
(`realrun.sharding.shard_model`: FSDP2 per decoder block + root) but over a mesh of one rank per
process, so FSDP2's hooks, unshard/reshard and autograd overheads are in the times. (On a 1-rank
mesh FSDP2 copies each parameter instead of the all-gather copy-in and copy-out, and skips the
reduce-scatter's copies: up to a few ms per unit on the testbed, next to the collective.)

Every time is wall (perf_counter) and CPU time of the process (process_time, attrs cpu_s): when a
node's ranks share its cores, wall is about CPU x ranks per core, which a simulator can model.
Unit boundaries (CPU ops are synchronous, so the stamps are exact):
- forward: a forward pre-hook on each block, placed before FSDP2's own (so its unshard counts),
  and a forward hook after FSDP2's on the last block; block i runs from its pre-hook to block
  i+1's; the root unit (embedding, final norm, head, loss) is the whole forward minus the blocks.
- backward: gradient hooks on each block's output, placed before FSDP2's pre-backward hook (so
  the block's unshard counts), and on block 0's input; block i runs from the gradient of its
  output to the gradient of block i-1's output (or of block 0's input), so FSDP2's post-backward
  of block i counts in block i; the root unit (loss, head, norm, embedding and FSDP2's
  final callback) is the whole `loss.backward()` minus the blocks.
Units are numbered as `ModelSpec.units`: 0 = root, 1..L = blocks, with its FLOP convention.
Besides the hooked iterations, plain iterations (no hooks) time the whole forward and backward;
then, on nodes of several ranks, hooked iterations where one rank per node computes while its
node's other ranks wait ("alone": the node's cores to itself).

Optimizer: the step as `realrun.optimizer.build_optimizer` builds it (AdamW foreach on CPU) plus
the LR step and `zero_grad`, as training's "optimizer" phase, over parameters shaped like one
rank's FSDP2 shard (dim-0 chunk, the largest one) for each shard size, as DTensors on a 1-rank
mesh (so DTensor dispatch costs as in training). The first step (state allocation and cold
caches) is recorded apart. FedAvg local work: `realrun.fedavg.FedAvg` without its all-reduce
(flatten into the fedavg dtype, divide, copy back) over the same local shards.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from simfed.spec import Scenario, UnitSpec, algorithm_info

from .model import TORCH_DTYPES, Llama, next_token_loss
from .optimizer import build_optimizer
from .sharding import shard_model

# emit(name, cat, start_s, dur_s, rep, *, nbytes=0, attrs=None): write one span
Emit = Callable[..., None]


def singleton_mesh(timeout_s: float) -> DeviceMesh:
    """A 1-D mesh ("shard",) holding only this rank; every rank must call it (collective)."""
    pg, _ = dist.new_subgroups(group_size=1, timeout=timedelta(seconds=timeout_s))
    return DeviceMesh.from_group(pg, "cpu", mesh_dim_names=("shard",))


def shard_sizes(scenario: Scenario) -> list[int]:
    """Shard sizes of the scenario's plans, and 1, 2, 4 where the world allows."""
    world = scenario.cluster.world
    plans = {a.plan(scenario.cluster).shard for a in scenario.algorithms}
    return sorted(plans | {s for s in (1, 2, 4) if s <= world})


def fedavg_dtypes(scenario: Scenario) -> list[str]:
    """The FedAvg buffer dtypes the scenario's federated algorithms use (fp32 when none)."""
    found = {a.fedavg_dtype for a in scenario.algorithms if algorithm_info(a.name).federated}
    return sorted(found) or ["fp32"]


Clock = tuple[float, float]  # (wall, CPU) seconds: perf_counter, process_time


def clock() -> Clock:
    return time.perf_counter(), time.process_time()


def elapsed(a: Clock, b: Clock) -> Clock:
    return b[0] - a[0], b[1] - a[1]


@dataclass
class Stamps:
    """Clock stamps of one hooked iteration."""

    pre: dict[int, Clock] = field(default_factory=dict)  # block forward start
    post: dict[int, Clock] = field(default_factory=dict)  # block forward end (after FSDP2)
    grad_out: dict[int, Clock] = field(default_factory=dict)  # block backward start
    grad_in: dict[int, Clock] = field(default_factory=dict)  # block 0's backward end


class UnitTimer:
    """Hooks that stamp the FSDP units' boundaries while attached."""

    def __init__(self, blocks: Sequence[nn.Module]):
        self.blocks = list(blocks)
        self.stamps = Stamps()
        self.handles: list[Any] = []

    def attach(self) -> None:
        self.stamps = Stamps()
        for i, block in enumerate(self.blocks):
            self.handles += [
                block.register_forward_pre_hook(self._pre(i), prepend=True),
                block.register_forward_hook(self._out_grad(i), prepend=True),
                block.register_forward_hook(self._post(i)),
            ]

    def detach(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    def _pre(self, i: int) -> Callable[..., None]:
        def hook(_module: nn.Module, args: tuple[Any, ...]) -> None:
            self.stamps.pre[i] = clock()
            x = args[0]  # block 0's input: the embedding output (blocks i > 0: block i-1's)
            if i == 0 and x.requires_grad:
                x.register_hook(self._stamp(self.stamps.grad_in, i))
        return hook

    def _out_grad(self, i: int) -> Callable[..., None]:
        def hook(_module: nn.Module, _args: Any, out: torch.Tensor) -> None:
            out.register_hook(self._stamp(self.stamps.grad_out, i))
        return hook

    def _post(self, i: int) -> Callable[..., None]:
        def hook(_module: nn.Module, _args: Any, _out: Any) -> None:
            self.stamps.post[i] = clock()
        return hook

    @staticmethod
    def _stamp(where: dict[int, Clock], i: int) -> Callable[[torch.Tensor], None]:
        def hook(_grad: torch.Tensor) -> None:
            where[i] = clock()
        return hook

    def split(self, fwd: tuple[Clock, Clock], bwd: tuple[Clock, Clock]
              ) -> dict[str, list[tuple[float, Clock]]]:
        """{phase: [(start wall, (wall, CPU) seconds) of the root, block 0, ..]} from the stamps
        and the whole forward and backward (start, end)."""
        s, n = self.stamps, len(self.blocks)
        # forward: block i ends where block i+1 starts; backward: block i ends where block i-1
        # starts (before FSDP2's pre-backward of block i-1), block 0 at its input's gradient
        f = [(s.pre[i], s.pre[i + 1] if i + 1 < n else s.post[i]) for i in range(n)]
        b = [(s.grad_out[i], s.grad_out[i - 1] if i else s.grad_in[0]) for i in range(n)]
        out: dict[str, list[tuple[float, Clock]]] = {}
        for phase, whole, blocks in (("forward", fwd, f), ("backward", bwd, b)):
            spans = [(start[0], elapsed(start, end)) for start, end in blocks]
            total = elapsed(*whole)
            root = (total[0] - sum(d[0] for _, d in spans), total[1] - sum(d[1] for _, d in spans))
            out[phase] = [(whole[0][0], root), *spans]
        return out


class UnitBench:
    """The three benchmarks of one rank; `emit` writes a span (see `realrun.bench_worker`)."""

    def __init__(self, scenario: Scenario, *, emit: Emit, now: Callable[[], float],
                 barrier: Callable[[], None], timeout_s: float, rank: int, ranks_per_node: int,
                 world: int):
        self.sc = scenario
        self.emit, self.now, self.barrier = emit, now, barrier
        self.timeout_s = timeout_s
        self.rank, self.ranks_per_node, self.world = rank, ranks_per_node, world
        self.nodes = world // ranks_per_node
        self.cores = len(os.sched_getaffinity(0))
        self.mesh = singleton_mesh(timeout_s)
        self.device = torch.device("cpu")

    def common(self) -> dict[str, Any]:
        t = self.sc.training
        return {"model": self.sc.model.name, "micro_batch": t.micro_batch, "seq_len": t.seq_len,
                "tokens": t.micro_batch * t.seq_len, "ranks_per_node": self.ranks_per_node,
                "cores": self.cores, "concurrent": self.world, "threads": torch.get_num_threads(),
                "dtype": self.sc.model.dtype, "mesh": "1 rank (no communication)"}

    # ---- per-unit compute ---------------------------------------------------------------
    def units(self, iters: int, warmup: int = 2) -> None:
        sc, t = self.sc, self.sc.training
        torch.manual_seed(sc.seed)
        model = Llama(sc.model, t.seq_len, self.device)
        shard_model(model, self.mesh, sc.algorithms[0])
        specs = sc.model.units(t.seq_len)
        tokens = t.micro_batch * t.seq_len
        gen = torch.Generator().manual_seed(sc.seed)
        inputs = torch.randint(sc.model.vocab, (t.micro_batch, t.seq_len), generator=gen)
        targets = torch.randint(sc.model.vocab, (t.micro_batch, t.seq_len), generator=gen)
        timer = UnitTimer(model.layers)
        common = self.common()

        def once() -> tuple[tuple[Clock, Clock], tuple[Clock, Clock]]:
            t0 = clock()
            loss = next_token_loss(model(inputs), targets)  # (B, T, V) -> scalar
            t1 = clock()
            loss.backward()
            t2 = clock()
            model.zero_grad(set_to_none=True)
            return (t0, t1), (t1, t2)

        def flops(u: UnitSpec, phase: str) -> float:
            per_token = u.fwd_flops_per_token if phase == "forward" else u.bwd_flops_per_token
            return per_token * tokens

        for _ in range(warmup):
            self.barrier()
            once()
        # every rank computing (as in training's lockstep units), hooked and plain iterations
        # alternating; then one rank per node computing alone (hooked), the others waiting
        alone = self.rank % self.ranks_per_node == 0
        plan = [(rep, hooked, False) for rep in range(iters) for hooked in (True, False)]
        if self.ranks_per_node > 1:
            plan += [(rep, True, True) for rep in range(iters)]
        for rep, hooked, by_node in plan:
            if by_node and not alone:
                self.barrier()
                continue
            if hooked:
                timer.attach()
            self.barrier()
            offset = self.now() - time.perf_counter()  # perf_counter -> the trace's clock
            fwd, bwd = once()
            timer.detach()
            extra = {"hooks": hooked, "concurrent": self.nodes if by_node else self.world,
                     "alone": by_node}
            for phase, (a, b) in (("forward", fwd), ("backward", bwd)):
                wall, cpu = elapsed(a, b)
                self.emit(phase, "compute", a[0] + offset, wall, rep, attrs={
                    **common, **extra, "bench": "units", "unit": -1, "unit_name": "model",
                    "kind": "model", "phase": phase, "cpu_s": cpu,
                    "params": sc.model.total_params,
                    "flops": sum(flops(u, phase) for u in specs)})
            if not hooked:
                continue
            for phase, parts in timer.split(fwd, bwd).items():
                for u, (start, (wall, cpu)) in zip(specs, parts, strict=True):
                    self.emit(phase, "compute", start + offset, wall, rep, attrs={
                        **common, **extra, "bench": "units", "unit": u.index,
                        "unit_name": u.name, "kind": "root" if u.index == 0 else "layer",
                        "phase": phase, "cpu_s": cpu, "params": u.params,
                        "flops": flops(u, phase)})

    # ---- optimizer and FedAvg local work --------------------------------------------------
    def shard_params(self, shard: int) -> list[nn.Parameter]:
        """The model's parameters cut like one rank's FSDP2 shard: the first (largest) dim-0
        chunk of each, as a DTensor on the 1-rank mesh."""
        sc = self.sc
        with torch.device("meta"):
            full = Llama(sc.model, sc.training.seq_len, torch.device("meta"))
        dtype = TORCH_DTYPES[sc.model.dtype]
        out = []
        for p in full.parameters():
            rows = math.ceil(p.shape[0] / shard)
            local = torch.randn(rows, *p.shape[1:], dtype=dtype) * 0.02
            out.append(nn.Parameter(DTensor.from_local(local, self.mesh, [Shard(0)],
                                                       run_check=False)))
        return out

    def optimizer(self, shards: Sequence[int], iters: int, warmup: int = 1) -> None:
        common = self.common()
        for shard in shards:
            params = self.shard_params(shard)
            holder = nn.Module()
            holder.params = nn.ParameterList(params)
            opt, sched = build_optimizer(holder, self.sc.training, self.device)
            grads = [torch.randn_like(p) * 1e-3 for p in params]
            local = sum(p.to_local().numel() for p in params)
            attrs = {**common, "bench": "optimizer", "shard": shard, "params": local,
                     "tensors": len(params), "optimizer": self.sc.training.optimizer,
                     "includes": "optimizer step + LR step + zero_grad",
                     "param_nbytes": local * params[0].dtype.itemsize}
            for it in range(1 + warmup + iters):
                for p, g in zip(params, grads, strict=True):
                    p.grad = g.clone()
                self.barrier()
                start, t = self.now(), clock()
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
                dur, cpu = elapsed(t, clock())
                rep = -1 if it == 0 else it - 1 - warmup
                if it == 0 or rep >= 0:
                    self.emit("optimizer", "host", start, dur, rep,
                              attrs={**attrs, "first": it == 0, "cpu_s": cpu})
            self.fedavg_local(shard, [p.to_local() for p in params], iters, warmup)
            del opt, sched, holder, params, grads

    @torch.no_grad()
    def fedavg_local(self, shard: int, shards: list[torch.Tensor], iters: int,
                     warmup: int) -> None:
        """FedAvg's work besides the all-reduce, as `realrun.fedavg.FedAvg.__call__` does it."""
        common = self.common()
        groups = 2
        for name in fedavg_dtypes(self.sc):
            dtype = TORCH_DTYPES[name]
            numel = sum(t.numel() for t in shards)
            attrs = {**common, "bench": "fedavg", "shard": shard, "params": numel,
                     "tensors": len(shards), "fedavg_dtype": name,
                     "includes": "flatten into the fedavg dtype, divide, copy back"}
            for it in range(warmup + iters):
                self.barrier()
                start, t = self.now(), clock()
                flat = torch.cat([s.reshape(-1).to(dtype) for s in shards])  # (local numel,)
                flat.div_(groups)
                offset = 0
                for s in shards:
                    n = s.numel()
                    s.copy_(flat[offset:offset + n].view_as(s))
                    offset += n
                dur, cpu = elapsed(t, clock())
                if it >= warmup:
                    self.emit("fedavg_local", "host", start, dur, it - warmup,
                              nbytes=numel * dtype.itemsize, attrs={**attrs, "cpu_s": cpu})
