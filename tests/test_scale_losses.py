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
    base = _tps(8, **{"runtime.compute.gpu_variation": 0.0})
    varied = _tps(8, **{"runtime.compute.gpu_variation": 0.02})
    slow = 1 + 0.02 * expected_max_normal(64)
    # compute is slowed by `slow`; exposed communication is not, so the loss is at most that
    assert base / slow <= varied * (1 + 1e-9) < base
    assert varied == pytest.approx(base / slow, rel=0.02)


def test_list_form_per_parameter_collectives_cost_the_host_one_copy_per_rank():
    """runtime.comm.calls_per_unit x list_copy_us: DeepSpeed ZeRO-3's per-parameter list-form
    collectives (validation/published scale-sc21-*.yaml) cost the host one copy per rank per call:
    the loss grows with the ranks, and without list copies the extra calls cost only latency."""
    keys = {"runtime.comm.calls_per_unit": 12, "runtime.comm.list_copy_us": 5.0}
    small, big = _tps(8, **keys), _tps(32, **keys)
    plain_small, plain_big = _tps(8), _tps(32)
    assert big < plain_big and small < plain_small
    assert 1 - big / small > 1 - plain_big / plain_small + 0.05  # grows with the ranks
    calls_only = _tps(32, **{"runtime.comm.calls_per_unit": 12})
    assert big < calls_only <= plain_big


def test_a_sync_before_each_collective_stops_the_host_running_ahead():
    synced = _tps(8, **{"runtime.host.sync_per_collective": True})
    assert synced < _tps(8)


def test_ring_latency_growth_costs_throughput_at_scale():
    """NCCL's ring latency sums its hops: at 2,048 nodes it is an FSDP step's main cost; charged
    as a two-node ring (runtime.comm.latency_growth false) the step is much shorter."""
    grown = _tps(2048)
    flat = _tps(2048, **{"runtime.comm.latency_growth": False})
    assert flat > 1.5 * grown
    assert _tps(8, **{"runtime.comm.latency_growth": False}) == pytest.approx(_tps(8), rel=0.02)


def test_gpu_variation_costs_more_the_more_gpus_wait_for_their_slowest():
    """The slowest of n GPUs sets a synchronous step: 1 + gpu_variation x E[max of n normals],
    which grows with n (1.3%: 3.1% at 64 GPUs, 3.6% at 256)."""
    var = {"runtime.compute.gpu_variation": 0.013}
    ratios = {}
    for nodes in (8, 32):
        ratios[nodes] = _tps(nodes, **var) / _tps(nodes, **{"runtime.compute.gpu_variation": 0.0})
        slow = 1 + 0.013 * expected_max_normal(8 * nodes)
        assert ratios[nodes] == pytest.approx(1 / slow, rel=0.01)
    assert ratios[32] < ratios[8]
