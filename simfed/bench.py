"""Benchmarks of the simulator itself: wall time and simulated events per second.

`simfed bench` prints a table; numbers land in the README. Targets (2 cores): the 512-GPU
scenario (4 algorithms x 64 steps) in about 1 s, 16,384 GPUs in about 10 s, sub-linear growth
with GPU count on homogeneous clusters, and 512 GPUs with stragglers in under a minute.
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
    for nodes in (16, 128, 1024, 4096):
        yield Case(f"all 4, {nodes * 4:,} GPUs", {"cluster.nodes": nodes})
    yield Case("all 4, 512 GPUs, 1 slow node", {
        "stragglers": {"slow_nodes": [{"node": 5, "factor": 1.5}]}})
    yield Case("all 4, 512 GPUs, per-node jitter", {
        "stragglers": {"jitter": {"sigma": 0.05, "level": "node"}}})
    yield Case("all 4, 512 GPUs, per-GPU jitter", {
        "stragglers": {"jitter": {"sigma": 0.05, "level": "gpu"}}})


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
