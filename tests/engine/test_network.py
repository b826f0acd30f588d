"""Links and collectives against the closed-form alpha-beta model."""

import pytest
import simpy

from simfed.collectives import hierarchical, ring
from simfed.engine.actors import partition
from simfed.engine.sim import Simulation
from simfed.hardware import Hardware
from simfed.network.flow import FlowNetwork
from simfed.spec import ParallelPlan, load_scenario
from simfed.spec.scenario import StragglerSpec

from ..conftest import ROOT

TINY = ROOT / "tests" / "fixtures" / "tiny2x2.yaml"


def test_single_transfer_takes_bytes_over_bottleneck():
    env = simpy.Environment()
    net = FlowNetwork(env, [10e9, 1e9])
    done = net.transfer({0: 5e9, 1: 2e9})  # 0.5 s on link 0, 2 s on link 1
    env.run(done)
    assert env.now == pytest.approx(2.0)


def test_two_concurrent_transfers_share_a_link():
    env = simpy.Environment()
    net = FlowNetwork(env, [1e9])
    a = net.transfer({0: 1e9})
    b = net.transfer({0: 1e9})
    env.run(a & b)
    assert env.now == pytest.approx(2.0)  # each at half bandwidth


def test_late_arrival_shares_only_the_overlap():
    env = simpy.Environment()
    net = FlowNetwork(env, [1e9])
    finish = {}

    def late():
        yield env.timeout(0.5)
        yield net.transfer({0: 1e9})
        finish["b"] = env.now

    def early():
        yield net.transfer({0: 1e9})
        finish["a"] = env.now

    env.process(early())
    env.process(late())
    env.run()
    # a alone for 0.5 s (0.5 GB), then both at 0.5 GB/s: a's last 0.5 GB takes 1 s -> 1.5 s;
    # b has 0.5 GB done by then and finishes alone at 1 GB/s 0.5 s later -> 2.0 s
    assert finish["a"] == pytest.approx(1.5)
    assert finish["b"] == pytest.approx(2.0)


def test_max_min_fairness_gives_leftover_to_unconstrained_flow():
    env = simpy.Environment()
    net = FlowNetwork(env, [1e9, 0.25e9])
    slow = net.transfer({0: 1e9, 1: 1e9})  # limited to 0.25 GB/s by link 1
    fast = net.transfer({0: 1e9})  # gets the remaining 0.75 GB/s of link 0
    env.run(fast)
    assert env.now == pytest.approx(1 / 0.75)
    env.run(slow)
    assert env.now == pytest.approx(4.0)


def _sim(alg_name="fsdp"):
    scn = load_scenario(TINY)
    alg = scn.algorithm(alg_name)
    plan = alg.plan(scn.cluster)
    hw = Hardware.from_spec(scn.cluster, scn.runtime)
    part = partition(plan, StragglerSpec(), 1, 0)
    sim = Simulation(hw=hw, plan=plan, part=part, programs={}, aggregate_steps=set(), steps=1,
                     comm=scn.runtime.comm, host=scn.runtime.host)
    return sim, hw


@pytest.mark.parametrize("op, factor", [("all_gather", 3 / 4), ("reduce_scatter", 3 / 4),
                                        ("all_reduce", 2 * 3 / 4)])
def test_world_ring_alpha_beta(op, factor):
    """4 ranks on 2 nodes x 2 GPUs: E = factor x S per rank; each node's E bytes of egress are
    spread over its 2 rails (10 Gb/s = 1.25 GB/s each): time = (E / 2) / 1.25 GB/s."""
    sim, _hw = _sim("fsdp")
    S = 100_000_000
    plan = sim.collective("shard", 0, op, S)
    assert len(plan.phases) == 1
    latency, demand = plan.phases[0]
    assert latency == 0
    assert sim.net.solo_time_s(demand) == pytest.approx(factor * S / 2 / 1.25e9)
    # accounting: 2 inter-node edges of E bytes, 2 NVLink edges of E bytes
    assert plan.bytes_by_link_kind["inter_node"] == pytest.approx(2 * factor * S)
    assert plan.bytes_by_link_kind["nvlink"] == pytest.approx(2 * factor * S)


def test_latency_term_counts_ring_steps():
    scn = load_scenario(TINY, {"cluster.node.nics.latency_us": 10, "runtime.comm.launch_us": 5,
                               "runtime.comm.step_latency_us": 1})
    alg = scn.algorithm("fsdp")
    plan = alg.plan(scn.cluster)
    hw = Hardware.from_spec(scn.cluster, scn.runtime)
    sim = Simulation(hw=hw, plan=plan, part=partition(plan, StragglerSpec(), 1, 0), programs={},
                     aggregate_steps=set(), steps=1, comm=scn.runtime.comm, host=scn.runtime.host)
    latency, _ = sim.collective("shard", 0, "all_reduce", 1000).phases[0]
    # launch 5 us + 2(p-1) = 6 steps x (10 us hop + 1 us software)
    assert latency == pytest.approx(5e-6 + 6 * 11e-6)


def test_hierarchical_all_reduce_phases():
    phases = hierarchical("all_reduce", [(0, 1, 2, 3)], gpus_per_node=2)
    assert [p.op for p in phases] == ["reduce_scatter", "all_reduce", "all_gather"]
    assert phases[0].instances == ((0, 1), (2, 3))
    assert phases[1].instances == ((0, 2), (1, 3))
    assert phases[1].e_factor == pytest.approx(2 * 1 / 2 / 2)  # AR of S/2 over 2 ranks
    assert ring("all_gather", [(0,)], 2) == []  # a group of one moves nothing


def test_full_mesh_nvlink_splits_links_among_peers():
    scn = load_scenario(TINY, {"cluster.node.gpus": 4, "cluster.node.nvlink.topology": "full_mesh",
                               "cluster.node.nics.count": 4})
    hw = Hardware.from_spec(scn.cluster, scn.runtime)
    assert hw.nvlink_usable_fraction(2) == pytest.approx(1 / 3)
    assert hw.nvlink_usable_fraction(4) == 1.0
    plan = ParallelPlan.for_algorithm("hsdp", nodes=2, gpus_per_node=4, shard_size=2)
    assert plan.shard == 2
