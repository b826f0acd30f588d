"""Scale losses: per-GPU throughput of FSDP falls as the ring grows (NCCL's per-hop latency and
the compute it then overlaps), and GPU-to-GPU variation costs the expected slowest of the group."""

from __future__ import annotations

from pathlib import Path

import pytest

from simfed.engine import simulate
from simfed.spec import load_scenario
from simfed.spec.stats import expected_max_normal

H100 = Path(__file__).resolve().parents[1] / "scenarios" / "h100-1024.yaml"


def _tps(nodes: int, **sets) -> float:
    scn = load_scenario(H100, {"cluster.nodes": nodes, "training.steps": 2, **sets})
    out, _ = simulate(scn, algorithms=["fsdp"])
    return out["algorithms"][0]["tokens_per_s_per_gpu"]


def test_per_gpu_throughput_falls_with_the_ring_and_interference_causes_it():
    small, big = _tps(8), _tps(32)
    assert big < small
    quiet = {"runtime.comm.sm_share": 0.0}
    loss_quiet = 1 - _tps(32, **quiet) / _tps(8, **quiet)
    assert 1 - big / small > loss_quiet >= 0


def test_gpu_variation_waits_for_the_slowest_of_the_group():
    base = _tps(8)
    varied = _tps(8, **{"runtime.compute.gpu_variation": 0.02})
    slow = 1 + 0.02 * expected_max_normal(64)
    # compute is slowed by `slow`; exposed communication is not, so the loss is at most that
    assert base / slow <= varied * (1 + 1e-9) < base
    assert varied == pytest.approx(base / slow, rel=0.02)
