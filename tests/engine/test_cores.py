"""Host cores shared by ranks that are out of step (CPU testbeds): federation groups pinned to
the same cores meet only at FedAvg, so a collective of one group meets the other group's work
for the share of time that group is busy, and runs slower by the benched slowdown."""

import math

import pytest

from simfed.engine import simulate_algorithm
from simfed.spec import load_scenario
from simfed.spec.scenario import node_cores

from ..conftest import SCENARIOS

FOUR = {"cluster.host_cores": 2, "cluster.nodes": 4, "cluster.node.gpus": 1,
        "algorithms.fl_fsdp.group_nodes": 2, "algorithms.fl_hsdp.group_nodes": 2,
        "runtime.comm.overlap_compute": False}  # gloo: collectives block the rank


def _scn(**over):
    return load_scenario(SCENARIOS / "testbed.yaml", {**FOUR, **over})


def _sim(scn, name):
    """The simulation object of one algorithm (what `simulate_algorithm` runs)."""
    import simfed.engine.run as run

    seen = {}
    real = run._simulate

    def spy(scn, **kw):
        seen["sim"] = real(scn, **kw)
        return seen["sim"]

    run._simulate = spy
    try:
        simulate_algorithm(scn, scn.algorithm(name))
    finally:
        run._simulate = real
    return seen["sim"]


def test_node_cores_follow_the_testbed_pinning():
    assert [node_cores(n, 1, 2) for n in range(4)] == [{0}, {1}, {0}, {1}]
    assert node_cores(0, 0, 2) == {0, 1}       # unpinned: all of the host's
    assert node_cores(3, 2, 0) == {6, 7}       # a real cluster: cores of its own
    assert node_cores(0, 0, 0) == frozenset()  # not modelled


def test_out_of_step_mates_are_other_groups_on_the_same_core():
    scn = _scn(**{"runtime.shared_cores.comm_slowdown": 0.3})
    sim = _sim(scn, "fl_fsdp")
    # 4 nodes of 1 rank on 2 cores: node n on core n % 2; groups {0, 1} and {2, 3}; each core
    # carries one rank of each group. The shard collectives meet the other group's rank; the
    # FedAvg all-reduce (fed: ranks 0, 2 and 1, 3) holds it, so it is in step.
    assert ("shard", 0) in sim.contention.core_mates
    assert not [k for k in sim.contention.core_mates if k[0] == "fed"]
    # no federation groups, or groups that do not share cores: nothing out of step
    assert not _sim(scn, "fsdp").contention.active  # the no-op default
    two = load_scenario(SCENARIOS / "testbed.yaml",
                        {"cluster.host_cores": 2, "runtime.shared_cores.comm_slowdown": 0.3})
    assert not _sim(two, "fl_fsdp").contention.active  # a group per node, a core per node


def test_collectives_beside_out_of_step_ranks_are_slower():
    base, slow = _scn(), _scn(**{"runtime.shared_cores.comm_slowdown": 0.3})
    t = {(s, a): simulate_algorithm(scn, scn.algorithm(a)).result
         for s, scn in (("base", base), ("slow", slow)) for a in ("fsdp", "fl_fsdp")}
    # FSDP's ranks are all in step: unchanged
    assert t["slow", "fsdp"]["step_time_s"] == t["base", "fsdp"]["step_time_s"]
    # FL+FSDP's shard collectives meet the other group's work most of the time
    b, s = t["base", "fl_fsdp"], t["slow", "fl_fsdp"]
    gained = s["step_time_s"] - b["step_time_s"]
    assert gained > 0.01 * b["step_time_s"]
    # at most the slowdown times the collectives' time (were the other group always busy)
    assert gained < 0.3 * b["exposed_comm_s"]
    sim = _sim(slow, "fl_fsdp")
    share = sim.contention.busy[0]
    assert 0.5 < share <= 1.0  # busy but while it waits for peers (identical ranks: never)
    # the fixed point: the share the last pass used is the share it produced
    assert sim.busy_share(0) == pytest.approx(share, abs=1e-3)


def test_expected_latest_of_n_normals():
    from simfed.spec.stats import expected_max_normal

    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-4)
    assert expected_max_normal(4) == pytest.approx(1.0294, abs=1e-4)


def test_uneven_ranks_out_of_step_wait_for_each_other():
    """Beside out-of-step ranks, compute runs slower and unevenly across ranks: at every
    collective the group waits for its latest member (the expected max of its arrivals), which
    shows as time inside collectives; ranks in step (FSDP) keep the in-step pace."""
    base = _scn()
    uneven = _scn(**{"runtime.shared_cores.compute_cv": 0.2})
    slower = _scn(**{"runtime.shared_cores.compute_slowdown": 0.15})
    r = {(n, a): simulate_algorithm(s, s.algorithm(a)).result
         for n, s in (("base", base), ("uneven", uneven), ("slower", slower))
         for a in ("fsdp", "fl_fsdp", "fl_hsdp")}
    for n in ("uneven", "slower"):
        assert r[n, "fsdp"] == r["base", "fsdp"]
    for a in ("fl_fsdp", "fl_hsdp"):
        b, u, s = r["base", a], r["uneven", a], r["slower", a]
        # uneven: the same compute, longer in collectives (the waits), a longer step
        assert u["compute_s"] == pytest.approx(b["compute_s"])
        assert u["exposed_comm_s"] > b["exposed_comm_s"] and u["step_time_s"] > b["step_time_s"]
        # each wait is 0.5642 x cv x sqrt(sum of squared compute times since the last
        # collective), so all of them add up to less than cv x the compute
        assert u["step_time_s"] - b["step_time_s"] < 0.2 * b["compute_s"]
        # slower: compute x 1.15 (the mates are always busy), collectives as before
        assert s["compute_s"] == pytest.approx(1.15 * b["compute_s"])


def test_the_fixed_point_is_deterministic():
    scn = _scn(**{"runtime.shared_cores.comm_slowdown": 0.3})
    a = simulate_algorithm(scn, scn.algorithm("fl_hsdp")).result
    b = simulate_algorithm(scn, scn.algorithm("fl_hsdp")).result
    assert a == b


def test_mates_need_cores_to_be_modelled():
    """A cluster whose nodes have cores of their own (no host_cores, no cpu_cores): nothing is
    shared, so nothing is out of step."""
    over = {k: v for k, v in FOUR.items() if k != "cluster.host_cores"}
    scn = load_scenario(SCENARIOS / "testbed.yaml",
                        {**over, "cluster.node.cpu_cores": 0,
                         "runtime.shared_cores.comm_slowdown": 0.3})
    assert not _sim(scn, "fl_fsdp").contention.active


def test_federation_groups_drift_apart_between_fedavg_rounds():
    """A group's own collectives keep its ranks in step with each other, not with the other
    group: the arrival variance towards the FedAvg all-reduce gathers over all K steps since
    the last round, so the wait there grows with K (as sqrt(K): twice the sd at K=4)."""
    wait = {}
    for cv in (0.0, 0.2):
        for k in (1, 4):
            scn = _scn(**{"runtime.shared_cores.compute_cv": cv,
                          "algorithms.fl_fsdp.aggregate_every": k})
            wait[cv, k] = simulate_algorithm(
                scn, scn.algorithm("fl_fsdp")).result["aggregation_per_event_s"]
    assert wait[0.0, 1] == pytest.approx(wait[0.0, 4])  # in step: no wait at either K
    w1, w4 = wait[0.2, 1] - wait[0.0, 1], wait[0.2, 4] - wait[0.0, 4]
    assert w1 > 0.001
    assert 1.5 < w4 / w1 < 2.2


def test_groups_on_cores_of_their_own_drift_apart_until_fedavg():
    """FL groups on nodes with cores of their own (2 nodes x 2 ranks, a core per node) drift
    apart as a random walk between FedAvg rounds: the FedAvg all-reduce waits for the later
    group, more with more steps between rounds; FSDP (one group) and groups that share cores
    (4 nodes of 1 rank on 2 cores, out of step there instead) are not touched."""
    def run(k, drift, **over):
        scn = load_scenario(SCENARIOS / "testbed.yaml", {
            "cluster.host_cores": 2, "algorithms.fl_fsdp.aggregate_every": k,
            "runtime.shared_cores.group_drift_ms_per_sqrt_s": drift, **over})
        return {a: simulate_algorithm(scn, scn.algorithm(a)).result for a in ("fsdp", "fl_fsdp")}

    waits = []
    for k in (1, 4):
        still, drifting = run(k, 0.0), run(k, 60.0)
        assert drifting["fsdp"] == still["fsdp"]
        wait = (drifting["fl_fsdp"]["aggregation_per_event_s"]
                - still["fl_fsdp"]["aggregation_per_event_s"])
        # a pair's expected latest arrival: 0.564 x 60 ms x sqrt(time since the last round
        # ended), less what the wait itself adds to the step
        apart = (still["fl_fsdp"]["step_time_s"] * k
                 - still["fl_fsdp"]["aggregation_per_event_s"])
        assert wait == pytest.approx(0.5642 * 0.060 * math.sqrt(apart), rel=0.15)
        waits.append(wait)
    assert waits[1] > 1.5 * waits[0]
    four = {k: v for k, v in FOUR.items() if k != "runtime.comm.overlap_compute"}
    assert run(2, 60.0, **four) == run(2, 0.0, **four)


ALL_ON = {"runtime.shared_cores.comm_slowdown": 0.3, "runtime.shared_cores.comm_cv": 0.05,
          "runtime.shared_cores.compute_slowdown": 0.15, "runtime.shared_cores.compute_cv": 0.2,
          "runtime.shared_cores.group_drift_ms_per_sqrt_s": 60.0,
          "runtime.shared_cores.host_us_per_MB": {"all_reduce": 3000.0, "all_gather": 500.0},
          "runtime.shared_cores.core_stack_Gbps": 0.6,
          "runtime.shared_cores.core_stack": True}  # testbed.yaml has it off since run 26


@pytest.mark.parametrize("switch, coefficients", [
    ("slowdown", ("comm_slowdown", "compute_slowdown")),
    ("spread", ("comm_cv", "compute_cv")),
    ("group_drift", ("group_drift_ms_per_sqrt_s",)),
    ("host_work", ("host_us_per_MB",)),
    ("core_stack", ("core_stack_Gbps",)),
])
def test_each_mechanism_has_its_own_switch(switch, coefficients):
    """runtime.shared_cores.<switch>: false turns one mechanism off and keeps its fitted
    coefficients: the same result as those coefficients at 0, and not the result with it on."""
    layout = (FOUR if switch != "group_drift"  # drift: groups on cores of their own
              else {"cluster.host_cores": 2, "runtime.comm.overlap_compute": False})

    def run(over):
        scn = load_scenario(SCENARIOS / "testbed.yaml", {**layout, **ALL_ON, **over})
        return simulate_algorithm(scn, scn.algorithm("fl_fsdp")).result

    on = run({})
    off = run({f"runtime.shared_cores.{switch}": False})
    zero = run({f"runtime.shared_cores.{c}": ({} if c == "host_us_per_MB" else 0.0)
                for c in coefficients})
    assert off == zero
    assert off["step_time_s"] < on["step_time_s"]


def test_no_section_no_contention_model():
    """Without shared-core coefficients (every shipped scenario: testbed.yaml only switches
    core_stack off), the engine gets the no-op default: one pass, no arrival bookkeeping."""
    from simfed.engine.host import NO_CONTENTION

    for name in ("testbed.yaml", "512gpu.yaml"):
        scn = load_scenario(SCENARIOS / name, {"training.steps": 2})
        assert _sim(scn, "fl_fsdp").contention is NO_CONTENTION


def test_core_stack_binds_only_where_a_core_carries_several_nodes():
    """core_stack_Gbps: a core's network stack shared by the nodes it carries. 4 nodes of one
    rank on 2 cores (2 nodes a core) at 0.5 Gb/s: FSDP's collectives across nodes move their
    ring bytes at 0.6 / 2 = 0.3 Gb/s instead of the link's 0.5 (the link's time grows by
    0.5 / 0.3); at 0.25 Gb/s (2 x 0.25 < 0.6) and on 2 nodes of 2 ranks (one node a core) the
    link binds and nothing changes."""
    from simfed.contention.shared_cores import core_stack_s, nodes_per_core

    c0, c1 = frozenset({0}), frozenset({1})
    assert nodes_per_core([c0, c1, c0, c1]) == 2.0  # 4x1 on 2 cores
    assert nodes_per_core([c0, c1]) == 1.0  # 2x2: a core each
    assert nodes_per_core([c0 | c1, c0 | c1]) == 1.0  # unpinned: half of each node a core

    assert core_stack_s(1e6, 2, 8 / 0.6e9, 8 / 0.5e9) == pytest.approx(
        1e6 * (2 * 8 / 0.6e9 - 8 / 0.5e9))
    assert core_stack_s(1e6, 1, 8 / 0.6e9, 8 / 0.5e9) == 0.0
    assert core_stack_s(1e6, 2, 8 / 0.6e9, 8 / 0.25e9) == 0.0

    def fsdp(over, rate):
        scn = load_scenario(SCENARIOS / "testbed.yaml", {
            **over, "runtime.comm.overlap_compute": False, "cluster.host_cores": 2,
            "cluster.node.nics.bw_Gbps": rate})
        return simulate_algorithm(scn, scn.algorithm("fsdp")).result

    four = {k: v for k, v in FOUR.items() if k != "runtime.comm.overlap_compute"}
    core = {"runtime.shared_cores.core_stack_Gbps": 0.6,
            "runtime.shared_cores.core_stack": True}  # testbed.yaml has it off since run 26
    plain, slow = fsdp(four, 0.5), fsdp({**four, **core}, 0.5)
    wire = plain["exposed_comm_s"]
    assert slow["exposed_comm_s"] > 1.2 * wire
    assert slow["exposed_comm_s"] < wire * 0.5 / 0.3 * 1.05
    assert fsdp({**four, **core}, 0.25) == fsdp(four, 0.25)
    assert fsdp(core, 0.5) == fsdp({}, 0.5)
