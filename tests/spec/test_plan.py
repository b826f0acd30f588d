"""Plan arithmetic without devices (cf. torchtitan's parallel-dims tests)."""

import pytest

from simfed.spec import ParallelPlan, SpecError


def test_impossible_plan_prints_the_numbers():
    with pytest.raises(SpecError) as exc:
        ParallelPlan(nodes=64, gpus_per_node=4, shard=4, replicate=8, groups=16)
    assert "shard 4 x replicate 8 x groups 16 = 512, but the cluster has 256 GPUs" in str(exc.value)


def test_paper_plans():
    fsdp = ParallelPlan.for_algorithm("fsdp", nodes=128, gpus_per_node=4)
    assert (fsdp.groups, fsdp.replicate, fsdp.shard) == (1, 1, 512)
    hsdp = ParallelPlan.for_algorithm("hsdp", nodes=128, gpus_per_node=4)
    assert (hsdp.groups, hsdp.replicate, hsdp.shard) == (1, 128, 4)
    fl = ParallelPlan.for_algorithm("fl_fsdp", nodes=128, gpus_per_node=4, group_nodes=1)
    assert (fl.groups, fl.replicate, fl.shard) == (128, 1, 4)
    flh = ParallelPlan.for_algorithm("fl_hsdp", nodes=128, gpus_per_node=4, group_nodes=8)
    assert (flh.groups, flh.replicate, flh.shard) == (16, 8, 4)


def test_rank_maps_fl_hsdp():
    p = ParallelPlan.for_algorithm("fl_hsdp", nodes=128, gpus_per_node=4, group_nodes=8)
    # rank 37 = node 9, GPU 1; group 1 (nodes 8-15), replica 1 (its 2nd node), shard index 1
    assert p.coords(37) == (1, 1, 1)
    assert p.node_of(37) == 9 and p.local_of(37) == 1
    assert p.group_of("shard", 37) == (36, 37, 38, 39)
    assert p.group_of("replicate", 37) == tuple(32 + 4 * i + 1 for i in range(8))
    # averaging ring: same (replica, shard) in every group -> same local GPU index (one rail)
    fed = p.group_of("fed", 37)
    assert len(fed) == 16 and all(p.local_of(r) == 1 for r in fed)
    assert list(p.group_nodes(1)) == list(range(8, 16))


def test_process_groups_partition_the_world():
    p = ParallelPlan.for_algorithm("fl_hsdp", nodes=8, gpus_per_node=4, group_nodes=2)
    for kind, groups in p.process_groups.items():
        flat = sorted(r for g in groups for r in g)
        assert flat == list(range(32)), kind
        for g in groups:
            for r in g:
                assert p.group_of(kind, r) == g


def test_group_must_divide_nodes():
    with pytest.raises(SpecError, match="group_nodes: 3 does not divide the cluster's 128 nodes"):
        ParallelPlan.for_algorithm("fl_fsdp", nodes=128, gpus_per_node=4, group_nodes=3)
