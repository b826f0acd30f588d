"""Benchmarks of the simulator itself: wall time and simulated events per second.

`simfed bench` prints a table; numbers land in the README. Targets (2 cores): the 512-GPU
scenario (4 algorithms x 64 steps) in about 1 s, 16,384 GPUs in about 10 s (measured 0.3 s), up
to the 524,288-GPU limit in seconds (2.7 s), sub-linear growth with GPU count on homogeneous
clusters; heterogeneous runs (stragglers, per-node or per-GPU
jitter) in 3 s at 512 GPUs and 30 s at 16,384 with the order-statistics method (the per-rank
reference is benchmarked beside it at 512 GPUs).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .engine import simulate
from .spec import load_scenario


@dataclass(frozen=True)
class Case:
    name: str
    overrides: dict[str, Any]
    algorithms: tuple[str, ...] = ()


def cases(quick: bool = False) -> Iterator[Case]:
    yield Case("fsdp 512 GPUs x 64 steps", {}, ("fsdp",))
    yield Case("all 4 algorithms, 512 GPUs x 64 steps", {})
    if quick:
        return
    for nodes in (16, 128, 1024, 4096, 32768, 131072):  # 131,072 x 4 = spec.limits.MAX_WORLD
        yield Case(f"all 4, {nodes * 4:,} GPUs", {"cluster.nodes": nodes})
    # a long run costs its window (simfed.engine.window), not its steps
    yield Case("all 4, 512 GPUs x 10^9 steps (window)", {"training.steps": 10**9})
    # heterogeneous runs: the order-statistics method (default) and the per-rank reference
    hetero = {
        "1 slow node": {"slow_nodes": [{"node": 5, "factor": 1.5}]},
        "per-node jitter": {"jitter": {"sigma": 0.05, "level": "node"}},
        "per-GPU jitter": {"jitter": {"sigma": 0.05, "level": "gpu"}},
    }
    for what, strag in hetero.items():
        for method in ("order_stats", "per_rank"):
            # the per-rank reference at 4 steps: 64 would be over its cost limit
            # (simfed.engine.window.check_cost: 385 actors x 33 units x 64 steps)
            steps = {"training.steps": 4} if method == "per_rank" else {}
            yield Case(f"all 4, 512 GPUs, {what}, {method}" + (" x 4 steps" if steps else ""),
                       {"stragglers": {**strag, "method": method}, **steps})
    for nodes in (1024, 4096):
        for what in ("per-node jitter", "per-GPU jitter"):
            yield Case(f"all 4, {nodes * 4:,} GPUs, {what}, order_stats",
                       {"cluster.nodes": nodes, "stragglers": hetero[what]})


def run_case(scenario: Path, case: Case, repeat: int = 1) -> dict[str, Any]:
    scn = load_scenario(scenario, case.overrides)
    best = float("inf")
    out: dict[str, Any] = {}
    for _ in range(repeat):
        t0 = time.perf_counter()
        out, _spans = simulate(scn, algorithms=list(case.algorithms) or None)
        best = min(best, time.perf_counter() - t0)
    events = out["simulated_ops"]
    return {
        "case": case.name, "gpus": scn.cluster.world, "wall_s": best, "events": events,
        "events_per_s": events / best if best > 0 else 0.0,
        "actors": max(a["actors"] for a in out["algorithms"]),
    }
