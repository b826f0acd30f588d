"""SHARD_GRAD_OP (ZeRO-2): no backward all-gather, parameters kept from forward to backward."""

from __future__ import annotations

from pathlib import Path

from simfed.engine import simulate
from simfed.spec import load_scenario

H100 = Path(__file__).resolve().parents[1] / "scenarios" / "h100-1024.yaml"
SETS = {"cluster.nodes": 2, "training.steps": 2, "algorithms.fl_hsdp.group_nodes": 2}


def _run(sharding: str) -> dict:
    scn = load_scenario(H100, {**SETS, "algorithms.fsdp.sharding": sharding})
    out, _ = simulate(scn, algorithms=["fsdp"])
    return out["algorithms"][0]


def test_grad_op_drops_the_backward_all_gather_and_keeps_parameters():
    full, zero2 = _run("full"), _run("grad_op")
    per_gpu_full = full["bytes_by_link_per_gpu"]["nvlink"] + full["bytes_by_link_per_gpu"][
        "inter_node"]
    per_gpu_z2 = zero2["bytes_by_link_per_gpu"]["nvlink"] + zero2["bytes_by_link_per_gpu"][
        "inter_node"]
    # full: two all-gathers and one reduce-scatter of every unit; grad_op: one and one
    assert per_gpu_z2 < per_gpu_full
    assert abs(per_gpu_z2 / per_gpu_full - 2 / 3) < 0.02
    # every layer's parameters are alive at the end of forward
    assert zero2["memory_bytes"]["unsharded"] > 5 * full["memory_bytes"]["unsharded"]
