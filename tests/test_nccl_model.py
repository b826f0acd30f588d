"""NCCL's cost model against its own formulas (tuning.cc, constants in nccl_tuning.yaml):
per-hop latency by link class, algorithm availability by version and topology, protocol choice,
nccl-tests' bus bandwidth, and the `simfed collective` table."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from simfed.cli import main
from simfed.collectives.nccl import NcclModel, bus_factor, tuning_table, version_constants
from simfed.hardware import Hardware
from simfed.spec import load_scenario

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "scenarios" / "h100-1024.yaml"


def _hw(path=H100, **sets) -> Hardware:
    scn = load_scenario(path, sets)
    return Hardware.from_spec(scn.cluster, scn.runtime)


def test_ring_latency_charges_each_hop_by_its_link_class():
    c = version_constants("2.23")
    m = NcclModel(hw=_hw(), version="2.23", algorithms=("ring",), protocols=("Simple",))
    n, nodes = 32, 4  # 8 GPUs per node
    ch = m.best("all_reduce", 1, n, nodes)
    nsteps, n_inter = 2 * (n - 1), 2 * (nodes - 1)
    expect = (c["base_lat_us"]["ring"][2] + (nsteps - n_inter) * c["hw_lat_us"]["nvlink"]["ring"][2]
              + n_inter * c["hw_lat_us"]["net"]["ring"][2])
    assert ch.latency_s == pytest.approx(expect * 1e-6)
    # the old alpha-beta charge (every step at the slowest hop) is larger
    assert ch.latency_s < (c["base_lat_us"]["ring"][2] + nsteps
                           * c["hw_lat_us"]["net"]["ring"][2]) * 1e-6


def test_large_ring_messages_reach_the_links_bus_bandwidth():
    hw = _hw()
    m = NcclModel(hw=hw, algorithms=("ring",), protocols=("Simple",))
    s = 8 * 2**30
    ch = m.best("all_gather", s, 8, 1)
    busbw = s / ch.time_s * bus_factor("all_gather", 8)
    assert busbw == pytest.approx(hw.nvlink_Bps * hw.nvlink_efficiency, rel=5e-3)  # + latency


def test_small_messages_pick_a_low_latency_protocol_large_ones_simple():
    m = NcclModel(hw=_hw(), algorithms=("ring",))
    assert m.best("all_reduce", 4096, 8, 1).protocol == "LL"
    assert m.best("all_reduce", 2**32, 8, 1).protocol == "Simple"


def test_pat_only_with_one_gpu_per_node_from_2_23():
    m23 = NcclModel(hw=_hw(), version="2.23")
    m22 = NcclModel(hw=_hw(), version="2.22")
    algos = {c.algorithm for c in m23.candidates("all_gather", 2**20, 16, 16)}
    assert "pat" in algos
    assert "pat" not in {c.algorithm for c in m22.candidates("all_gather", 2**20, 16, 16)}
    assert "pat" not in {c.algorithm for c in m23.candidates("all_gather", 2**20, 32, 4)}
    # PAT's log-depth latency beats the ring's N-1 network hops for small messages
    assert m23.best("all_gather", 2**16, 64, 64).algorithm == "pat"


def test_tree_only_for_cross_node_all_reduce():
    m = NcclModel(hw=_hw())
    assert "tree" in {c.algorithm for c in m.candidates("all_reduce", 2**20, 64, 8)}
    assert "tree" not in {c.algorithm for c in m.candidates("all_reduce", 2**20, 8, 1)}
    assert "tree" not in {c.algorithm for c in m.candidates("all_gather", 2**20, 64, 8)}
    # tree latency: base + 2((q-1) intra + log2(N) inter)
    c = version_constants("2.23")
    tree = next(x for x in m.candidates("all_reduce", 1, 64, 8)
                if x.algorithm == "tree" and x.protocol == "Simple")
    expect = c["base_lat_us"]["tree"][2] + 2 * (7 * c["hw_lat_us"]["nvlink"]["tree"][2]
                                                + math.log2(8) * c["hw_lat_us"]["net"]["tree"][2])
    assert tree.latency_s == pytest.approx(expect * 1e-6)


def test_nvls_on_hopper_nvswitch_not_on_ampere():
    h = NcclModel(hw=_hw())
    a = NcclModel(hw=_hw(ROOT / "scenarios" / "512gpu.yaml"))
    assert h.best("all_reduce", 2**30, 8, 1).algorithm == "nvls"
    assert "nvls" not in {c.algorithm for c in a.candidates("all_reduce", 2**30, 4, 1)}
    big = h.best("all_reduce", 2**33, 8, 1)
    ring = h.ring_busbw_Bps(8, 1)
    assert big.busbw_Bps("all_reduce", 8) == pytest.approx(1.30 * ring, rel=0.01)


def test_version_table_is_sourced_and_ordered():
    t = tuning_table()
    assert set(t["versions"]) >= {"2.18", "2.22", "2.23"}
    assert version_constants("2.26.5") is t["versions"]["2.23"]
    assert version_constants("2.21.5") is t["versions"]["2.18"]


def test_collective_command_prints_an_nccl_tests_table():
    res = CliRunner().invoke(main, ["collective", str(H100), "--nodes", "2", "--op",
                                    "all_gather", "--min-bytes", "1M", "--max-bytes", "4M"])
    assert res.exit_code == 0, res.output
    rows = [ln.split() for ln in res.output.splitlines() if not ln.startswith("#")]
    assert [int(r[0]) for r in rows] == [2**20, 2**21, 2**22]
    for size, t_us, algbw, busbw, _ in rows:
        assert float(algbw) == pytest.approx(int(size) / float(t_us) / 1e3, rel=0.01)
        assert float(busbw) == pytest.approx(float(algbw) * 15 / 16, rel=0.01)
    bad = CliRunner().invoke(main, ["collective", str(H100), "--nodes", "999"])
    assert bad.exit_code == 2 and "does not fit" in bad.output


def test_bad_nccl_and_tile_settings_are_one_line_errors():
    from simfed.spec.schema import SpecError

    for key, value, words in (
            ("runtime.comm.nccl_algorithms", ["ring", "foo"], "foo"),
            ("runtime.comm.nccl_version", "two", "release like 2.23"),
            ("runtime.compute.gemm_tiles", [[0, 128, 1.0]], "gemm_tiles[0]")):
        with pytest.raises(SpecError, match=words.replace("[", r"\[").replace("]", r"\]")):
            load_scenario(H100, {key: value})


def test_a_bandwidth_curve_slows_the_simulated_collective_by_its_factor():
    """runtime.comm.nccl_bw_curve reaches the simulator: engine_cost's byte factor (ring/Simple
    bandwidth over the chosen one's) grows by 1 / curve, the latency stays; a step with the
    curve on its collectives takes longer than without."""
    from dataclasses import replace

    from simfed.collectives.nccl import engine_cost, nccl_model
    from simfed.engine import simulate

    scn = load_scenario(ROOT / "validation" / "published" / "collectives-h100.yaml",
                        {"cluster.nodes": 2})
    m = nccl_model(Hardware.from_spec(scn.cluster, scn.runtime), scn.runtime.comm)
    inst = (tuple(range(16)),)
    s = 64 << 20
    lat, f = engine_cost(m, "all_gather", s, inst)
    ch = m.best("all_gather", s, 16, 2)
    key = f"{ch.algorithm}/{ch.protocol}"
    cal = replace(m, bw_curve={"all_gather": {key: {"inter": [[1 << 20, 0.5]]}}})
    lat2, f2 = engine_cost(cal, "all_gather", s, inst)
    assert lat2 == lat and f2 == pytest.approx(2 * f)
    curve = {op: {k: {"intra": [[1, 0.5]], "inter": [[1, 0.5]]}
                  for k in ("ring/LL", "ring/LL128", "ring/Simple", "tree/Simple", "nvls/Simple")}
             for op in ("all_gather", "reduce_scatter", "all_reduce")}
    base = load_scenario(ROOT / "validation" / "published" / "fms-h100-llama7b-96gpu.yaml")
    slow = load_scenario(ROOT / "validation" / "published" / "fms-h100-llama7b-96gpu.yaml",
                         {"runtime.comm.nccl_bw_curve": curve})
    t0 = simulate(base, algorithms=[base.algorithms[0].name])[0]["algorithms"][0]
    t1 = simulate(slow, algorithms=[slow.algorithms[0].name])[0]["algorithms"][0]
    assert t1["step_time_s"] > t0["step_time_s"]


LEONARDO = ROOT / "validation" / "published" / "collectives-leonardo.yaml"


def test_shared_bandwidth_share_interpolates_in_log2_nodes_and_holds_at_the_ends():
    hw = _hw(LEONARDO, **{"cluster.fabric.shared_bandwidth": [[4, 1.0], [16, 0.5]]})
    assert hw.shared_bandwidth_share(1) == 1.0  # inside a node: no fabric
    assert hw.shared_bandwidth_share(2) == 1.0  # below the first knot: held
    assert hw.shared_bandwidth_share(8) == pytest.approx(0.75)  # halfway in log2
    assert hw.shared_bandwidth_share(256) == 0.5  # beyond the last knot: held
    quiet = _hw(LEONARDO, **{"cluster.fabric.shared_bandwidth": []})
    assert quiet.shared_bandwidth_share(256) == 1.0


def test_shared_bandwidth_scales_the_inter_node_ring_not_a_node():
    """On Leonardo's shared fabric NCCL's ring over 256 nodes gets the measured share of the
    quiet bus bandwidth (the cluster file's SL0 / SL1 ratio); inside a node nothing changes."""
    from simfed.collectives.nccl import nccl_model

    def model(**sets):
        scn = load_scenario(LEONARDO, sets)
        return nccl_model(Hardware.from_spec(scn.cluster, scn.runtime), scn.runtime.comm)

    shared, quiet = model(), model(**{"cluster.fabric.shared_bandwidth": []})
    share = shared.hw.shared_bandwidth_share(256)
    assert 0 < share < 1
    assert shared.ring_busbw_Bps(4, 256) == pytest.approx(share * quiet.ring_busbw_Bps(4, 256))
    assert shared.ring_busbw_Bps(4, 1) == quiet.ring_busbw_Bps(4, 1)
    big = 1 << 30
    assert (shared.time_s("all_reduce", big, 1024, 256)
            > quiet.time_s("all_reduce", big, 1024, 256))


def test_shared_bandwidth_slows_collectives_across_nodes_in_the_simulator_only():
    """The engine gives a collective spanning nodes only its share of the network links: FSDP
    over 8 nodes slows; FL+FSDP's groups of one node do not (their FedAvg across nodes does)."""
    from simfed.engine import simulate

    path = ROOT / "scenarios" / "512gpu.yaml"
    sets = {"cluster.nodes": 8, "training.steps": 8}

    def step(alg: str, share: list) -> dict:
        scn = load_scenario(path, {**sets, "cluster.fabric.shared_bandwidth": share})
        return simulate(scn, algorithms=[alg])[0]["algorithms"][0]

    q, s = step("fsdp", []), step("fsdp", [[2, 0.25]])
    assert s["step_time_s"] > q["step_time_s"]
    fq, fs = step("fl_fsdp", []), step("fl_fsdp", [[2, 0.25]])
    assert fs["phases_s"]["forward"] == pytest.approx(fq["phases_s"]["forward"])
    assert fs["aggregation_per_event_s"] > fq["aggregation_per_event_s"]  # FedAvg crosses nodes


def test_bad_shared_bandwidth_is_a_one_line_error():
    from simfed.spec.schema import SpecError

    for value in ([[4, 1.5]], [[0.5, 0.9]], [[4]]):
        with pytest.raises(SpecError, match="shared_bandwidth"):
            load_scenario(LEONARDO, {"cluster.fabric.shared_bandwidth": value})


def test_shared_fabric_rows_are_sourced_and_the_mechanism_earns_its_place_on_them():
    """validation/published/shared-fabric.yaml: every row sourced; on the default service
    level the measured shares bring the model from a third too fast to within the quiet rows'
    own error (docs/accuracy.md states the numbers)."""
    from simfed.calibration import shared_fabric

    rows = shared_fabric.compare()
    assert {r["nodes"] for r in rows} >= {2, 8, 64, 256}
    s = shared_fabric.summary(rows)
    assert s["shared_rows_off"] > 0.25 and s["shared_rows_on"] < 0.10
    assert s["quiet_rows"] < 0.10


def test_loaded_step_latency_is_paid_per_network_step_of_the_algorithm_nccl_picked():
    """fabric.loaded_step_us: a ring all-gather over n ranks pays it n - 1 times (every step of
    the ring, not only its inter-node hops), a ring all-reduce 2(n - 1), a tree over n nodes
    2 log2 n; NCCL's pick is made without it; inside a node and at 0 nothing changes (scope
    nodes: from two nodes on)."""
    us = 100.0
    scope = {"cluster.fabric.loaded_step_scope": "nodes"}
    for algos, op, nodes, steps in ((("ring",), "all_gather", 16, 127),
                                    (("ring",), "all_reduce", 16, 254),
                                    (("tree",), "all_reduce", 16, 2 * math.log2(16))):
        quiet = NcclModel(hw=_hw(), algorithms=algos)
        loaded = NcclModel(hw=_hw(**scope, **{"cluster.fabric.loaded_step_us": us}),
                           algorithms=algos)
        q, lo = quiet.best(op, 2**24, 8 * nodes, nodes), loaded.best(op, 2**24, 8 * nodes, nodes)
        assert (lo.algorithm, lo.protocol) == (q.algorithm, q.protocol)
        assert lo.time_s - q.time_s == pytest.approx(steps * us * 1e-6)
        assert lo.latency_s - q.latency_s == pytest.approx(steps * us * 1e-6)
    # one rank per node (HYBRID_SHARD's cross-node all-reduce): 2(n - 1) over its n ranks,
    # an eighth of what a ring over all 8 GPUs of the same 16 nodes pays
    ring = dict(algorithms=("ring",))
    q, lo = (NcclModel(hw=_hw(**sets), **ring).best("all_reduce", 2**24, 16, 16)
             for sets in ({}, {**scope, "cluster.fabric.loaded_step_us": us}))
    assert lo.time_s - q.time_s == pytest.approx(30 * us * 1e-6)
    inside = NcclModel(hw=_hw(**{"cluster.fabric.loaded_step_us": us}))
    base = NcclModel(hw=_hw())
    one_node = ("all_gather", 2**24, 8, 1)
    assert inside.best(*one_node).time_s == base.best(*one_node).time_s
    # the choice is NCCL's own: the same (algorithm, protocol) with or without the load
    m, m0 = NcclModel(hw=_hw(**{"cluster.fabric.loaded_step_us": 1e4})), NcclModel(hw=_hw())
    a, b = m.best("all_reduce", 2**26, 512, 64), m0.best("all_reduce", 2**26, 512, 64)
    assert (a.algorithm, a.protocol) == (b.algorithm, b.protocol) and a.time_s > b.time_s


def test_the_loaded_step_starts_where_a_collective_leaves_its_leaf_switch():
    """fabric.loaded_step_scope leaves (the default): packed nodes fill a leaf (32 nodes here)
    before the next, so a ring over 32 nodes pays nothing and over 33 every step; spread
    placement and an ideal fabric pay from two nodes; scope nodes pays from two nodes."""
    us, ring = 100.0, dict(algorithms=("ring",))

    def extra(nodes, **sets):
        sets = {"cluster.nodes": 64, **sets}
        a = NcclModel(hw=_hw(**sets), **ring).best("all_gather", 2**24, 8 * nodes, nodes)
        b = NcclModel(hw=_hw(**sets, **{"cluster.fabric.loaded_step_us": us}),
                      **ring).best("all_gather", 2**24, 8 * nodes, nodes)
        return (b.time_s - a.time_s) / (us * 1e-6)

    assert extra(2) == 0.0 and extra(32) == 0.0
    assert extra(33) == pytest.approx(8 * 33 - 1)
    assert extra(2, **{"cluster.fabric.placement": "spread"}) == pytest.approx(15)
    assert extra(2, **{"cluster.fabric.topology": "ideal"}) == pytest.approx(15)
    assert extra(2, **{"cluster.fabric.loaded_step_scope": "nodes"}) == pytest.approx(15)
    hw = _hw()
    assert not hw.spans_leaves(1) and not hw.spans_leaves(32) and hw.spans_leaves(33)


def test_loaded_steps_hit_full_sharding_over_many_nodes_harder_than_hybrid():
    """The mechanism's point on a published pair (Modalities 2.7B, micro-batch 2, Leonardo;
    published losses from 8 to 256 GPUs 49% FULL_SHARD, 16% HYBRID_SHARD): FULL_SHARD's rings
    over every node lose more per GPU with the fitted loaded-step latency than without, and
    more than HYBRID_SHARD, whose cross-node all-reduce NCCL runs as a tree at 64 nodes."""
    from simfed.calibration.published import DEFAULT_DIR
    from simfed.engine.run import simulate

    def tps(name, nodes, us=None):
        sets = {"cluster.nodes": nodes, "training.micro_batch": 2}
        if us is not None:
            sets["cluster.fabric.loaded_step_us"] = us
        scn = load_scenario(DEFAULT_DIR / name, sets)
        out, _ = simulate(scn, algorithms=[scn.algorithms[0].name])
        return out["algorithms"][0]["tokens_per_s_per_gpu"]

    full = "scale-modalities-leonardo-2.7b.yaml"
    hybrid = "scale-modalities-leonardo-2.7b-hybrid.yaml"
    loss = {k: 1 - tps(f, 64, us) / tps(f, 2, us)
            for k, f, us in (("full", full, None), ("full0", full, 0.0), ("hybrid", hybrid, None))}
    assert loss["full"] > loss["full0"] + 0.3  # about 5% without the term
    assert loss["full"] > loss["hybrid"] + 0.3


def test_the_island_term_adds_to_each_step_once_a_collective_spans_more_than_one_island():
    """fabric.loaded_step_island_us: a ring all-gather over 8 nodes of 4-node islands pays
    loaded_step_us + the island term per step; over the 4 nodes of one island, loaded_step_us
    alone; the choice is still NCCL's own."""
    sets = {"cluster.fabric.loaded_step_us": 10.0, "cluster.fabric.nodes_per_island": 4,
            "cluster.fabric.loaded_step_scope": "nodes"}
    ring = dict(algorithms=("ring",))
    base = NcclModel(hw=_hw(**sets), **ring)
    isl = NcclModel(hw=_hw(**sets, **{"cluster.fabric.loaded_step_island_us": 30.0}), **ring)
    for nodes, extra_us in ((4, 0.0), (8, 30.0)):
        n = 8 * nodes
        a, b = base.best("all_gather", 2**24, n, nodes), isl.best("all_gather", 2**24, n, nodes)
        assert (a.algorithm, a.protocol) == (b.algorithm, b.protocol)
        assert b.time_s - a.time_s == pytest.approx((n - 1) * extra_us * 1e-6)


def test_an_island_term_without_islands_is_a_one_line_error():
    from simfed.spec import SpecError

    with pytest.raises(SpecError) as exc:
        load_scenario(H100, {"cluster.fabric.loaded_step_island_us": 9.0})
    msg = str(exc.value)
    assert "\n" not in msg and "nodes_per_island" in msg and "9 us" in msg
