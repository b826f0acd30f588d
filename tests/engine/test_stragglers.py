"""Stragglers: in FSDP a slow GPU stalls every collective; in FL+FSDP only its own group, until
the next aggregation. Actors: symmetric ranks are simulated once."""

import pytest

from simfed.engine import simulate_algorithm
from simfed.engine.actors import partition
from simfed.spec import ParallelPlan, load_scenario
from simfed.spec.scenario import JitterSpec, SlowNode, StragglerSpec

from ..conftest import ROOT, SCENARIOS

TINY = ROOT / "tests" / "fixtures" / "tiny2x2.yaml"


def _slowdown(name: str, stragglers: dict) -> float:
    """Step time with stragglers / without, on 8 nodes made compute-bound (fast NICs)."""
    over = {"cluster.nodes": 8, "cluster.node.nics.bw_Gbps": 2000, "training.steps": 16,
            "algorithms.fl_fsdp.aggregate_every": 8}
    base = load_scenario(TINY, over)
    slow = load_scenario(TINY, {**over, "stragglers": stragglers})
    t0 = simulate_algorithm(base, base.algorithm(name)).result["step_time_s"]
    return simulate_algorithm(slow, slow.algorithm(name)).result["step_time_s"] / t0


def test_jitter_slows_fsdp_more_than_fl_fsdp():
    """Per-step noise: FSDP waits for the slowest node at every collective of every step; an FL
    group waits only for its own node, and the groups' noise averages out over the K local
    steps before they meet at FedAvg."""
    jitter = {"jitter": {"sigma": 0.3, "level": "node"}}
    fsdp = _slowdown("fsdp", jitter)
    fl = _slowdown("fl_fsdp", jitter)
    assert fsdp > 1.3
    assert 1.0 < fl < fsdp - 0.15


def test_persistent_straggler_is_paid_by_everyone_at_fedavg():
    """A node that is always 2x slower: FSDP stalls on it at every collective, FL groups wait
    for its group at every FedAvg; with synchronous averaging both end up as slow (the
    simulator does not pretend otherwise)."""
    slow = {"slow_nodes": [{"node": 3, "factor": 2.0}]}
    fsdp = _slowdown("fsdp", slow)
    fl = _slowdown("fl_fsdp", slow)
    assert fsdp > 1.5 and fl > 1.5
    assert fl == pytest.approx(fsdp, rel=0.1)


def test_fl_straggler_stalls_only_its_group():
    """The per-rank reference keeps each group's timeline (order_stats keeps the pace-setter's)."""
    scn = load_scenario(TINY, {"stragglers": {"slow_nodes": [{"node": 1, "factor": 3.0}],
                                              "method": "per_rank"},
                               "training.steps": 4, "algorithms.fl_fsdp.aggregate_every": 4})
    run = simulate_algorithm(scn, scn.algorithm("fl_fsdp"), trace=True)
    # node 0 (group 0) runs its 4 local steps at full speed, then waits in the FedAvg
    # all-reduce for node 1's group
    by_rank = {}
    for s in run.spans:
        if s.cat == "phase" and s.name == "aggregation":
            by_rank.setdefault(s.rank, []).append(s.dur_s)
    assert set(by_rank) == {0, 2}
    assert by_rank[0][-1] > 5 * by_rank[2][-1]


def test_partition_homogeneous_is_one_actor_per_algorithm():
    for name, kw in (("fsdp", {}), ("hsdp", {}), ("fl_fsdp", {"group_nodes": 1}),
                     ("fl_hsdp", {"group_nodes": 8})):
        plan = ParallelPlan.for_algorithm(name, nodes=128, gpus_per_node=4, **kw)
        assert len(partition(plan, StragglerSpec(), 4, 0).actors) == 1


def test_partition_slow_node_refines_only_what_differs():
    plan = ParallelPlan.for_algorithm("fl_fsdp", nodes=128, gpus_per_node=4, group_nodes=1)
    part = partition(plan, StragglerSpec(slow_nodes=(SlowNode(node=5, factor=2.0),),
                                         method="per_rank"), 4, 0)
    # the slow node's group, and everyone else
    assert sorted(len(a.ranks) for a in part.actors) == [4, 508]
    # FSDP: one shard group in lockstep -> one actor running at the slow node's pace
    plan = ParallelPlan.for_algorithm("fsdp", nodes=128, gpus_per_node=4)
    part = partition(plan, StragglerSpec(slow_nodes=(SlowNode(node=5, factor=2.0),)), 4, 0)
    assert len(part.actors) == 1 and list(part.actors[0].factors) == [2.0] * 4
    unmerged = partition(plan, StragglerSpec(slow_nodes=(SlowNode(node=5, factor=2.0),)), 4, 0,
                         lockstep=False)
    assert sorted(len(a.ranks) for a in unmerged.actors) == [4, 508]


@pytest.mark.parametrize("name", ["fsdp", "hsdp", "fl_fsdp"])
def test_lockstep_merge_of_shard_groups_is_exact(name):
    """Simulating every GPU of a shard group apart gives the same run time as one actor at the
    slowest member's pace: exact within a step (every rendezvous waits for the slowest), and
    conservative across steps only by how much a member slow in one step starts the next one
    late (the spread of the optimizer step: well under 1% here)."""
    scn = load_scenario(TINY, {"cluster.nodes": 4, "training.steps": 6,
                               "runtime.host.debug_checks": "detail",
                               "stragglers": {"jitter": {"sigma": 0.2, "level": "gpu"},
                                              "method": "per_rank"}})
    merged = simulate_algorithm(scn, scn.algorithm(name)).result
    apart = simulate_algorithm(scn, scn.algorithm(name), lockstep=False).result
    assert apart["actors"] > merged["actors"]
    assert merged["step_times_s"][0] == pytest.approx(apart["step_times_s"][0], rel=1e-9)
    assert merged["total_time_s"] == pytest.approx(apart["total_time_s"], rel=5e-3)
    assert merged["total_time_s"] >= apart["total_time_s"] * (1 - 1e-9)


def test_jitter_is_seeded_and_deterministic():
    plan = ParallelPlan.for_algorithm("hsdp", nodes=8, gpus_per_node=4)
    spec = StragglerSpec(jitter=JitterSpec(sigma=0.1, level="node"), method="per_rank")
    a = partition(plan, spec, 16, seed=7)
    b = partition(plan, spec, 16, seed=7)
    c = partition(plan, spec, 16, seed=8)
    assert len(a.actors) == 8  # one per node
    assert all((x.factors == y.factors).all() for x, y in zip(a.actors, b.actors, strict=False))
    assert any((x.factors != y.factors).any() for x, y in zip(a.actors, c.actors, strict=False))
    mean = sum(x.factors.mean() for x in a.actors) / 8
    assert mean == pytest.approx(1.0, abs=0.05)  # mean-one jitter


def test_paper_scenario_is_byte_identical_across_runs():
    from simfed.analysis.report import dumps
    from simfed.engine import simulate

    scn = load_scenario(SCENARIOS / "512gpu.yaml", {"training.steps": 8})
    assert dumps(simulate(scn)[0]) == dumps(simulate(scn)[0])
