"""The host cost of TORCH_DISTRIBUTED_DEBUG=DETAIL (one rank of `realrun bench`): a tiny
all-reduce with and without the checks, and the checks DETAIL adds (a monitored barrier and an
all-gather of the op's fingerprint), per group size."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from .bench_rank import Bench, all_gather

FINGERPRINT_NUMEL = 16  # int64 words: op type, dtype, device and sizes of the op's tensors


def checks(bench: Bench, iters: int) -> None:
    sizes = list(range(2, bench.world + 1)) if bench.world <= 8 else sorted(
        {2 ** i for i in range(1, bench.world.bit_length()) if 2 ** i <= bench.world}
        | {bench.world})
    for k in sizes:
        check_group(bench, list(range(k)), iters)


def check_group(bench: Bench, ranks: list[int], iters: int) -> None:
    off_pg = dist.new_group(ranks)
    level = dist.get_debug_level()
    dist.set_debug_level(dist.DebugLevel.DETAIL)
    try:  # a group made under DETAIL is wrapped in a ProcessGroupWrapper: the checks
        detail_pg = dist.new_group(ranks)
    finally:
        dist.set_debug_level(level)
    one = torch.ones(1)
    fingerprint = torch.zeros(FINGERPRINT_NUMEL, dtype=torch.int64)
    gathered = torch.zeros(FINGERPRINT_NUMEL * len(ranks), dtype=torch.int64)
    bench.case += 1
    attrs = {"group_size": len(ranks), "nodes": bench.nodes_of(ranks), "ranks": ranks,
             "case": bench.case}
    calls: list[tuple[str, dict[str, Any], Callable[[], Any]]] = [
        ("all_reduce_tiny", {"debug": "off"}, lambda: dist.all_reduce(one, group=off_pg)),
        ("all_reduce_tiny", {"debug": "detail"},
         lambda: dist.all_reduce(one, group=detail_pg)),
        ("monitored_barrier", {},
         lambda: dist.monitored_barrier(group=off_pg, wait_all_ranks=True)),
        ("all_gather_tiny", {"numel": FINGERPRINT_NUMEL, "dtype": "int64"},
         lambda: all_gather(gathered, fingerprint, group=off_pg)),
    ]
    member = bench.rank in ranks
    for name, extra, call in calls:
        for i in range(1 + iters):
            dist.barrier()
            if not member:
                continue
            start = bench.now_s()
            t = time.perf_counter()
            call()
            dur = time.perf_counter() - t
            if i >= 1:
                bench.span(name, "host", start, dur, rep=i - 1, group="check",
                           attrs={**attrs, **extra})
