"""The array path of `ring_load` (500,000 ranks in a fraction of a second) against the loop it
replaces at scale: bitwise the same loads, latencies and class order, on every fabric,
placement and NVLink topology, for the plans' process groups and for arbitrary rank sets."""

from __future__ import annotations

import random

import pytest

from simfed.hardware import Hardware
from simfed.network.geometry import _ring_load_arrays, _ring_load_loop
from simfed.network.links import GLOBAL, LEAF_UP, NIC, NVLINK, SWITCH
from simfed.spec import load_scenario
from simfed.spec.plan import ParallelPlan

from ..conftest import SCENARIOS

CLUSTERS = [
    {},
    {"cluster.fabric.topology": "dragonfly_plus", "cluster.fabric.nodes_per_group": 3},
    {"cluster.fabric.topology": "ideal"},
    {"cluster.fabric.placement": "spread", "cluster.fabric.nodes_per_leaf": 3},
    {"cluster.fabric.topology": "dragonfly_plus", "cluster.fabric.nodes_per_group": 5,
     "cluster.fabric.placement": "spread"},
    {"cluster.node.nics.count": 2},
    {"cluster.node.nics.count": 8, "cluster.node.gpus": 8},
    {"cluster.node.nvlink.topology": "full_mesh", "cluster.fabric.switch_capacity_Gbps": 800},
]


def _name(sets: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in sets.items()) or "default"


def hardware(sets: dict) -> Hardware:
    scn = load_scenario(SCENARIOS / "512gpu.yaml",
                        {"cluster.nodes": 16, "algorithms": [{"name": "fsdp"}], **sets})
    return Hardware.from_spec(scn.cluster, scn.runtime)


def link_index_of(classes: list[int]):
    """A fixed link-class table that depends on the node only through `classes` (as the
    engine's: one class per kind, node class and GPU or rail position; one per fabric kind)."""
    kinds = {NVLINK: 0, NIC: 1, LEAF_UP: 2, GLOBAL: 3, SWITCH: 4}

    def index(kind: str, node: int, sub: int) -> int:
        if node < 0:
            return 10_000 + kinds[kind]
        return kinds[kind] * 1000 + classes[node] * 100 + sub

    return index


def same(hw: Hardware, instances, classes: list[int], switch: bool) -> None:
    a = _ring_load_loop(hw, instances, link_index_of(classes), switch)
    b = _ring_load_arrays(hw, instances, link_index_of(classes), switch, classes)
    assert list(b.demand_per_E.items()) == list(a.demand_per_E.items())  # bitwise, in order
    assert list(b.bytes_per_E.items()) == list(a.bytes_per_E.items())
    assert (b.hop_latency_s, b.ranks, b.instances) == (a.hop_latency_s, a.ranks, a.instances)


@pytest.mark.parametrize("sets", CLUSTERS, ids=_name)
def test_the_plans_process_groups(sets):
    hw = hardware(sets)
    classes = [0] * hw.nodes
    for shard in (1, 2, hw.gpus_per_node, 2 * hw.gpus_per_node, hw.world // 2):
        if shard > hw.world or hw.world % shard:
            continue
        for replicate in (1, 2, 3):
            if hw.world % (shard * replicate):
                continue
            plan = ParallelPlan(nodes=hw.nodes, gpus_per_node=hw.gpus_per_node, shard=shard,
                                replicate=replicate, groups=hw.world // (shard * replicate))
            for insts in plan.process_groups.values():
                if len(insts[0]) >= 2:
                    for switch in (False, True):
                        same(hw, insts, classes, switch)


@pytest.mark.parametrize("sets", CLUSTERS, ids=_name)
def test_arbitrary_rank_sets_and_node_classes(sets):
    hw = hardware(sets)
    rng = random.Random(7)
    for _ in range(25):
        p = rng.choice([2, 3, 4, 5, 8, 12])
        count = rng.randint(1, hw.world // p)
        ranks = rng.sample(range(hw.world), p * count)
        instances = [tuple(ranks[i * p:(i + 1) * p]) for i in range(count)]
        classes = [rng.randint(0, 2) for _ in range(hw.nodes)]
        same(hw, instances, classes, rng.random() < 0.5)
