"""Benchmark cases of ranks out of step on shared host cores (one rank of `realrun bench`):
the compute block beside a busy half, the free-running loop's arrival spread, and two
federation groups drifting apart. They measure what simfed.contention models."""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from .bench_rank import Bench, Busy, all_gather, gather_buffers

LOOP_ROUNDS_PER_ITER = 4  # rounds of the free-running loop case per --iters
DRIFT_LOOP_ITERS = 48  # loop iterations per round of the group-drift case (~0.8 s on a core)
DRIFT_ROUNDS_PER_ITER = 2  # rounds of the group-drift case per --iters


def compute_beside_busy(bench: Bench, nbytes: int) -> None:
    """The compute block on the first half of the ranks, (1) with every rank computing it
    at once, in step, and (2) with the other half running the training-like loop (its own
    all-gather of `nbytes`) out of step with it: how much slower, and how unevenly across
    ranks, compute runs beside ranks that are out of step (federation groups on shared
    cores). Only where the halves share host cores."""
    half = list(range(bench.world // 2))
    rest = list(range(bench.world // 2, bench.world))
    pg = dist.new_group(rest)  # every rank creates it
    if not half or not bench.shares_cores(half):
        return
    block = bench.compute_block()
    full, part = gather_buffers(nbytes, len(rest))
    loop = bench.training_loop(lambda: all_gather(full, part, group=pg), pg)
    for beside, active, busy in (("", True, None), ("busy", bench.rank in half, loop)):
        attrs = (bench.block_case(len(half), beside=beside) if beside
                 else bench.block_case(bench.world))

        def once(rep: int, attrs: dict[str, Any] = attrs) -> None:
            start = bench.now_s()
            t = time.perf_counter()
            block()
            if rep >= 0:
                bench.span("forward_backward", "compute", start, time.perf_counter() - t,
                           rep=rep, attrs=attrs)

        bench.repeat(active, once, busy=busy)
    loop_spread(bench, half, part.numel(), loop)


def loop_spread(bench: Bench, half: list[int], shard_numel: int, loop: Busy) -> None:
    """The first half runs the training-like loop itself (the compute block, then an
    all-gather in its own group, free-running as a federation group between FedAvg rounds)
    beside idle ranks and beside the other half's loop, out of step: each rank records when
    it reached each all-gather, so the summary can tell how far apart a group's members
    arrive (the wait the earliest ones spend in the collective), with and without
    out-of-step ranks on their cores."""
    pg = dist.new_group(half)  # every rank creates it
    block = bench.compute_block()
    mine = bench.rank in half
    full, part = torch.zeros(shard_numel * len(half)), torch.zeros(shard_numel)
    rounds = bench.args.iters * LOOP_ROUNDS_PER_ITER
    for beside, busy in (("idle", None), ("busy", loop)):
        attrs = bench.block_case(len(half), beside=beside, nbytes=full.numel() * 4)

        def run(_rep: int, attrs: dict[str, Any] = attrs) -> None:
            for i in range(-bench.args.warmup, rounds):
                t = time.perf_counter()
                block()
                arrive = bench.now_s()
                t_block = time.perf_counter() - t
                t = time.perf_counter()
                all_gather(full, part, group=pg)
                if i >= 0:
                    bench.span("loop", "compute", arrive, t_block, rep=i,
                               attrs={**attrs, "coll_s": time.perf_counter() - t})

        bench._reps(range(1), mine, run, busy)


def group_drift(bench: Bench, nbytes: int) -> None:
    """Two federation groups on cores of their own (the first and the second half of the
    nodes) each run the training-like loop (the compute block, then an all-gather of
    `nbytes` in the group) DRIFT_LOOP_ITERS times, free, from a common barrier, as FL
    groups between FedAvg rounds: each rank records its round, so the summary can tell how
    far apart independent groups finish the same work (the wait at the next FedAvg). Only
    with 2+ nodes whose halves share no core (where they do, the groups are out of step on
    shared cores: `loop_spread`)."""
    if bench.nodes < 2:
        return
    cut = bench.nodes // 2 * bench.ranks_per_node
    halves = [list(range(cut)), list(range(cut, bench.world))]
    pgs = [dist.new_group(h) for h in halves]  # every rank creates both
    if bench.shares_cores(halves[0]):
        return
    mine = 0 if bench.rank < cut else 1
    pg, k = pgs[mine], len(halves[mine])
    full, part = gather_buffers(nbytes, k)
    block = bench.compute_block()
    attrs = bench.block_case(bench.world, nbytes=full.numel() * 4, group_size=k,
                             drift_group=mine, loop_iters=DRIFT_LOOP_ITERS)
    for rnd in range(-1, bench.args.iters * DRIFT_ROUNDS_PER_ITER):  # round -1: warm-up
        dist.barrier()
        start = bench.now_s()
        t = time.perf_counter()
        for _ in range(DRIFT_LOOP_ITERS):
            block()
            if k > 1:
                all_gather(full, part, group=pg)
        if rnd >= 0:
            bench.span("drift", "compute", start, time.perf_counter() - t, rep=rnd,
                       attrs=attrs)

