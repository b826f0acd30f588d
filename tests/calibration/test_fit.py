"""Calibration: recover known constants from synthetic measurements, read every input format,
and write a profile a scenario can run with."""

import json
import math

import numpy as np
import pytest

from simfed.calibration import calibrate, read_inputs, write_profile
from simfed.calibration.fit import fit_comm
from simfed.calibration.samples import CommSample, OptimizerSample, Samples, UnitSample
from simfed.contention import for_run as contention_for_run
from simfed.engine.actors import partition
from simfed.engine.host import NO_CONTENTION
from simfed.engine.sim import Simulation
from simfed.hardware import Hardware
from simfed.spec import load_scenario
from simfed.spec.scenario import StragglerSpec

from ..conftest import ROOT

TINY = ROOT / "tests" / "fixtures" / "tiny2x2.yaml"
TRUE = {"runtime.comm.launch_us": 50.0, "cluster.node.nvlink.latency_us": 20.0,
        "cluster.node.nics.latency_us": 80.0, "cluster.node.nvlink.bw_GBps": 3.0,
        "cluster.node.nics.bw_Gbps": 0.4}


def _truth_time(op: str, pg: str, nbytes: int) -> float:
    """What the simulator itself predicts for a collective with the TRUE constants."""
    return _time_at(TRUE, TRUE["cluster.node.nics.bw_Gbps"], op, pg, nbytes)


def _synthetic_comm(noise: float, seed: int = 0) -> Samples:
    rng = np.random.default_rng(seed)
    out = Samples(sources=["synthetic"])
    # hsdp on 2 nodes x 2 GPUs: shard = intra-node pairs, replicate = inter-node pairs
    for pg, inst in (("shard", ((0, 1),)), ("replicate", ((0, 2),))):
        for op in ("all_gather", "all_reduce"):
            for nbytes in (4_096, 65_536, 1_048_576, 8_388_608):
                t = _truth_time(op, pg, nbytes) * (1 + noise * rng.standard_normal())
                out.comm.append(CommSample(op=op, instances=inst, nbytes=nbytes, time_s=t,
                                           world=4, gpus_per_node=2, source="synthetic",
                                           label=f"{op} {pg} {nbytes}"))
    return out


def test_fit_recovers_the_simulators_own_constants():
    scn = load_scenario(TINY)  # nominal figures differ from the truth
    res = fit_comm(scn, _synthetic_comm(noise=0.0))
    got = {p.name: p.value for p in res.params}
    assert got["nvlink_bw_GBps"] == pytest.approx(3.0, rel=1e-3)
    assert got["nic_bw_Gbps"] == pytest.approx(0.4, rel=1e-3)
    assert got["launch_us"] + got["nvlink_step_latency_us"] == pytest.approx(70.0, rel=1e-2)
    assert res.rms_rel_error < 1e-6


def test_fit_with_noise_reports_intervals_that_cover_the_truth():
    scn = load_scenario(TINY)
    res = fit_comm(scn, _synthetic_comm(noise=0.03, seed=3))
    bw = next(p for p in res.params if p.name == "nic_bw_Gbps")
    assert bw.ci95[0] < 0.4 < bw.ci95[1]
    assert 0.005 < res.rms_rel_error < 0.1
    assert len(res.residuals) == 16


def test_profile_round_trip_predicts_with_the_fitted_constants(tmp_path):
    scn = load_scenario(TINY)
    samples = _synthetic_comm(noise=0.0)
    samples.units = [UnitSample(phase=ph, flops=f, time_s=2e-4 + f / 5e9, source="s")
                     for ph in ("forward", "backward") for f in (1e6, 1e7, 1e8)]
    samples.optimizer = [OptimizerSample(params=n, time_s=1e-3 + n * 14 / 2e9, source="s")
                         for n in (1e5, 1e6)]
    profile, report = calibrate(scn, samples)
    path = write_profile(tmp_path / "p.yaml", profile, header="test")
    calibrated = load_scenario(TINY, profile=path)
    assert calibrated.cluster.node.nics.bw_Gbps * calibrated.runtime.comm.nic_efficiency == \
        pytest.approx(0.4, rel=1e-3)
    peak = calibrated.cluster.node.gpu.peak_tflops * 1e12
    assert peak * calibrated.runtime.compute.efficiency_forward == pytest.approx(5e9, rel=1e-6)
    assert calibrated.runtime.compute.unit_overhead_forward_us == pytest.approx(200, rel=1e-3)
    assert calibrated.runtime.compute.optimizer_overhead_us == pytest.approx(1000, rel=1e-3)
    assert "fitted" in calibrated.runtime.provenance["runtime.compute.efficiency_forward"]
    assert report["fits"]["compute"]["rms_rel_error"] < 1e-6


def test_profile_rejects_foreign_sections(tmp_path):
    from simfed.spec import SpecError

    bad = tmp_path / "bad.yaml"
    bad.write_text("training: {steps: 3}\n")
    with pytest.raises(SpecError, match="a profile holds only cluster and runtime"):
        load_scenario(TINY, profile=bad)


def test_reads_pytorch_profiler_chrome_traces(tmp_path):
    events = [
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather_RING_LL(ncclDevComm*)",
         "ts": 10.0, "dur": 250.0,
         "args": {"Collective name": "_allgather_base", "In msg nelems": 1024,
                  "Out msg nelems": 4096, "dtype": "BFloat16", "Group size": 4,
                  "Process Group Ranks": "[0, 1, 2, 3]"}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
         "ts": 300.0, "dur": 500.0,
         "args": {"Collective name": "allreduce", "In msg nelems": 2048, "Out msg nelems": 2048,
                  "dtype": "BFloat16", "Group size": 2, "Process Group Ranks": "[0, 4]"}},
        {"ph": "X", "cat": "kernel", "name": "ampere_bf16_gemm", "ts": 0, "dur": 9.0,
         "args": {}},
    ]
    p = tmp_path / "trace.json"
    p.write_text(json.dumps({"traceEvents": events}))
    s = read_inputs([p], gpus_per_node=4)
    assert [(c.op, c.nbytes, c.instances) for c in s.comm] == [
        ("all_gather", 4096 * 2, ((0, 1, 2, 3),)), ("all_reduce", 2048 * 2, ((0, 4),))]
    assert s.comm[0].time_s == pytest.approx(250e-6)


def test_missing_input_is_a_one_line_error(tmp_path):
    from simfed.spec import SpecError

    with pytest.raises(SpecError, match="input not found"):
        read_inputs([tmp_path / "nope"], 4)


# ---- host work per byte and per-domain bandwidth factors (CPU testbeds) ----------------------

HOST_TRUE = {**TRUE, "runtime.shared_cores.host_us_per_MB.all_reduce.inter": 30_000.0,
             "runtime.comm.op_bw_factor.all_gather.intra": 0.5,
             "runtime.comm.op_bw_factor.all_gather.inter": 0.8}


def _time_at(truth: dict, rate_Gbps: float, op: str, pg: str, nbytes: int,
             alg: str = "hsdp") -> float:
    """The simulator's time for one collective of `alg`'s process group `pg` (hsdp on 2 x 2:
    shard = a node's pair, replicate = a pair across nodes; fsdp: shard = the 4-rank ring)."""
    scn = load_scenario(TINY, {**truth, "cluster.node.nics.bw_Gbps": rate_Gbps})
    plan = scn.algorithm(alg).plan(scn.cluster)
    hw = Hardware.from_spec(scn.cluster, scn.runtime)
    part = partition(plan, StragglerSpec(), 1, 0)
    sim = Simulation(hw=hw, plan=plan, part=part, programs={}, aggregate_steps=set(), steps=1,
                     comm=scn.runtime.comm, host=scn.runtime.host,
                     contention=contention_for_run(scn.runtime.shared_cores, hw, plan, part)
                     or NO_CONTENTION)
    return sim.collective(pg, 0, op, nbytes).solo_s


def test_fit_tells_wire_time_from_host_work_with_two_link_rates():
    # all-reduce across nodes does 30 ms of host work per MB on top of its wire time (20 ms/MB
    # at 0.4 Gb/s, 40 at 0.2): at one rate that is just a slower wire, two rates tell them apart
    out = Samples(sources=["synthetic"])
    for rate in (0.4, 0.2):
        for pg, inst in (("shard", ((0, 1),)), ("replicate", ((0, 2),))):
            for op in ("all_gather", "all_reduce"):
                for nbytes in (4_096, 65_536, 1_048_576, 8_388_608):
                    out.comm.append(CommSample(
                        op=op, instances=inst, nbytes=nbytes, world=4, gpus_per_node=2,
                        time_s=_time_at(HOST_TRUE, rate, op, pg, nbytes), source="synthetic",
                        link_Gbps=rate, label=f"{op} {pg} {nbytes} @{rate}"))
    res = fit_comm(load_scenario(TINY, {"cluster.node.nics.bw_Gbps": 0.4}), out)
    got = {p.name: p.value for p in res.params}
    assert got["nic_bw_Gbps"] == pytest.approx(0.4, rel=1e-2)
    assert got["host_us_per_MB_all_reduce_inter"] == pytest.approx(30_000, rel=1e-2)
    assert got["bw_factor_all_gather_intra"] == pytest.approx(0.5, rel=1e-2)
    assert got["bw_factor_all_gather_inter"] == pytest.approx(0.8, rel=1e-2)
    assert res.rms_rel_error < 1e-3


def test_one_link_rate_fits_no_host_work():
    out = _synthetic_comm(noise=0.0)
    res = fit_comm(load_scenario(TINY), out)
    assert not [p for p in res.params if p.name.startswith("host_us_per_MB")]


def test_host_work_and_factors_in_the_simulator():
    base = {**TRUE, "cluster.node.nics.bw_Gbps": 0.4}
    t = lambda extra, op, pg, n=8_388_608: _time_at({**base, **extra}, 0.4, op, pg, n)  # noqa: E731
    # a factor inside the node leaves collectives across nodes alone, and the other way round
    half_intra = {"runtime.comm.op_bw_factor.all_gather.intra": 0.5}
    assert t(half_intra, "all_gather", "replicate") == pytest.approx(
        t({}, "all_gather", "replicate"))
    assert t(half_intra, "all_gather", "shard") > 1.5 * t({}, "all_gather", "shard") - 1e-3
    # host work adds to the wire time: E = S bytes per rank for a 2-rank all-reduce, times the
    # ranks sharing a core (one here: the pair is one rank of each node)
    wire = t({}, "all_reduce", "replicate")
    host = {"runtime.shared_cores.host_us_per_MB.all_reduce.inter": 1_000.0}
    assert t(host, "all_reduce", "replicate") == pytest.approx(wire + 8_388_608 * 1e-9)
    assert t(host, "all_reduce", "shard") == pytest.approx(t({}, "all_reduce", "shard"))
    # all four ranks of the 2 x 2 cluster pinned to one host core: four times the host time
    assert t({**host, "cluster.host_cores": 1, "cluster.node.cpu_cores": 1},
             "all_reduce", "replicate") == pytest.approx(wire + 4 * 8_388_608 * 1e-9)
    # gloo's reduce-scatter runs as an all-reduce, but with its own factor
    gloo = {"runtime.comm.reduce_scatter_impl": "all_reduce"}
    assert t(gloo, "reduce_scatter", "replicate") == pytest.approx(
        t({}, "all_reduce", "replicate"))
    assert t({**gloo, "runtime.comm.op_bw_factor.reduce_scatter": 0.5},
             "reduce_scatter", "replicate") > 1.5 * t({}, "all_reduce", "replicate") - 1e-3


PAIR_TRUE = {**TRUE, "runtime.comm.op_bw_factor.all_gather.inter": 0.9,
             "runtime.comm.op_bw_factor.all_gather.inter_pair": 0.6}


def _pair_and_ring_samples(truth: dict) -> Samples:
    """All-gathers and all-reduces over a pair across nodes and over the 4-rank ring."""
    out = Samples(sources=["synthetic"])
    for alg, pg, inst in (("hsdp", "replicate", ((0, 2),)), ("fsdp", "shard", ((0, 1, 2, 3),))):
        for op in ("all_gather", "all_reduce"):
            for nbytes in (65_536, 1_048_576, 8_388_608):
                out.comm.append(CommSample(
                    op=op, instances=inst, nbytes=nbytes, world=4, gpus_per_node=2,
                    time_s=_time_at(truth, 0.4, op, pg, nbytes, alg), source="synthetic",
                    label=f"{op} {alg}-{pg} {nbytes}"))
    return out


def test_two_rank_rings_get_their_own_factor_where_longer_rings_were_measured():
    scn = load_scenario(TINY, {"cluster.node.nics.bw_Gbps": 0.4})
    res = fit_comm(scn, _pair_and_ring_samples(PAIR_TRUE))
    got = {p.name: p.value for p in res.params}
    # (the 50 us launch is not identified at a 1% timing scatter: the hops take it, +-2%)
    assert got["bw_factor_all_gather_inter_pair"] == pytest.approx(0.6, rel=2e-2)
    assert got["bw_factor_all_gather_inter"] == pytest.approx(0.9, rel=2e-2)
    assert res.rms_rel_error < 2e-2
    # only pairs measured: one factor for the domain, which longer rings then use as well
    pairs = Samples(comm=[c for c in _pair_and_ring_samples(PAIR_TRUE).comm
                          if len(c.instances[0]) == 2])
    names = {p.name for p in fit_comm(scn, pairs).params}
    assert "bw_factor_all_gather_inter" in names
    assert not any(n.endswith("_pair") for n in names)


def test_the_pair_factor_applies_to_two_rank_rings_only():
    base = {**TRUE, "cluster.node.nics.bw_Gbps": 0.4}
    slow = {**base, "runtime.comm.op_bw_factor.all_gather.inter_pair": 0.5}
    n = 8_388_608
    pair, ring = ("all_gather", "replicate", n, "hsdp"), ("all_gather", "shard", n, "fsdp")
    assert _time_at(slow, 0.4, *pair) > 1.5 * _time_at(base, 0.4, *pair)
    assert _time_at(slow, 0.4, *ring) == pytest.approx(_time_at(base, 0.4, *ring))
    # without a pair factor, pairs use the domain's
    inter = {**base, "runtime.comm.op_bw_factor.all_gather.inter": 0.5}
    assert _time_at(inter, 0.4, *pair) == pytest.approx(_time_at(slow, 0.4, *pair))


def test_ranks_per_core_follows_the_testbed_pinning():
    from simfed.spec.scenario import ranks_per_core

    assert ranks_per_core(range(4), 2, 1, 2) == 2.0      # 2 nodes x 2 ranks on 1 core each
    assert ranks_per_core((0, 2), 2, 1, 2) == 1.0        # one rank of each node
    assert ranks_per_core(range(4), 1, 1, 2) == 2.0      # 4 nodes of 1 rank on 2 host cores
    assert ranks_per_core((0, 1), 1, 1, 2) == 1.0
    assert ranks_per_core(range(8), 4, 0, 0) == 1.0      # a real cluster: cores of its own
    assert ranks_per_core(range(4), 4, 0, 2) == 2.0      # unpinned: all share the host's
    scn = load_scenario(ROOT / "scenarios" / "testbed.yaml", {"cluster.host_cores": 2})
    assert scn.cluster.ranks_per_core == 2.0
    assert load_scenario(TINY).cluster.ranks_per_core == 1.0


@pytest.mark.parametrize("key, value, msg", [
    ("runtime.shared_cores.host_us_per_MB.all_gather.across", 5.0,
     "runtime.shared_cores.host_us_per_MB.all_gather.across: expected one of intra, inter, "
     "intra_pair, inter_pair"),
    ("runtime.comm.op_bw_factor.all_gather.intra", 0.0,
     "op_bw_factor.all_gather.intra: must be > 0, got 0.0"),
    ("runtime.shared_cores.host_us_per_MB.broadcast", 5.0,
     "runtime.shared_cores.host_us_per_MB.broadcast: expected all_gather, reduce_scatter or "
     "all_reduce"),
])
def test_bad_per_op_tables_are_one_line_errors(key, value, msg):
    from simfed.spec import SpecError

    with pytest.raises(SpecError, match=msg.replace(".", r"\.")):
        load_scenario(TINY, {key: value})


def test_bench_groups_of_node_blocks_map_to_their_ranks():
    from simfed.calibration.samples import _bench_instances

    # realrun bench's "fl" kind: FL groups of 2 nodes, one rank per node position in each
    assert _bench_instances("nodes2", 2, 2, 4, 1) == ((0, 1), (2, 3))
    assert _bench_instances("nodes2", 2, 4, 4, 2) == ((0, 2), (1, 3), (4, 6), (5, 7))
    assert _bench_instances("nodes2", 2, 1, 4, 2) == ((0, 2),)


def test_out_of_step_slowdown_from_the_bench(tmp_path):
    """One group's collective while the other groups ran a training-like loop out of step with
    it, against the same case run by every group at once, in step: the ratio is the simulator's
    slowdown; those rows stay out of the collective fit (not wire or host work of its own)."""
    from simfed.calibration.fit import fit_out_of_step
    from simfed.calibration.samples import read_bench

    rows = []
    for op, nbytes, t_all in (("all_gather", 1 << 20, 0.010), ("all_gather", 4 << 20, 0.036),
                              ("all_reduce", 4 << 20, 0.050)):
        base = {"op": op, "group": "nodes2", "group_size": 2, "nodes": 2, "nbytes": nbytes,
                "impl": "gloo", "samples": 3}
        rows += [{**base, "concurrent_groups": 2, "time_s": t_all, "rank_cv": 0.03},
                 {**base, "concurrent_groups": 1, "time_s": 0.8 * t_all, "rank_cv": 0.01},
                 {**base, "concurrent_groups": 1, "beside": "busy", "time_s": 1.25 * t_all,
                  "rank_cv": 0.05}]
    block = {"phase": "forward_backward", "flops": 5e8, "hidden": 256, "ffn_hidden": 688}
    compute = [{**block, "concurrent": 4, "time_s": 0.010, "rank_cv": 0.12},
               {**block, "concurrent": 2, "beside": "busy", "time_s": 0.0115, "rank_cv": 0.2}]
    meta = {"nodes": 4, "ranks_per_node": 1, "network": "testbed", "cores": 1,
            "host_cores": 2, "link_rate_Gbps": 0.5, "impl": {}}
    (tmp_path / "bench-summary.json").write_text(json.dumps({"meta": meta, "comm": rows,
                                                             "compute": compute}))
    samples = read_bench(tmp_path)
    assert len(samples.comm) == 6  # the beside rows are not collective samples
    assert len(samples.beside) == 3
    assert not samples.units  # nor is the compute block a unit sample
    assert [b["idle_s"] / b["all_groups_s"] for b in samples.beside] == pytest.approx([0.8] * 3)
    res = fit_out_of_step(samples)
    slow, cv = res.params
    assert slow.value == pytest.approx(0.25)
    assert slow.ci95[0] <= 0.25 <= slow.ci95[1]
    assert cv.value == pytest.approx(0.04)  # sqrt(0.05^2 - 0.03^2): beyond the in-step spread
    slow, cv = fit_out_of_step(samples, "compute").params
    assert slow.value == pytest.approx(0.15) and cv.value == pytest.approx(0.16)
    profile, rep = calibrate(load_scenario(TINY), samples)
    shared = profile["runtime"]["shared_cores"]
    assert shared["comm_slowdown"] == pytest.approx(0.25)
    assert shared["comm_cv"] == pytest.approx(0.04)
    assert shared["compute_slowdown"] == pytest.approx(0.15)
    # one compute case: no 95% interval, so not used (the scenario's value stands)
    assert rep["fits"]["out_of_step_compute"]["not_used"]["out_of_step_cv"]["value"] == \
        pytest.approx(0.16)
    assert profile["runtime"]["provenance"]["runtime.shared_cores.comm_slowdown"].startswith(
        "fitted (out_of_step_comm, n=3")
    # faster beside busy groups than in step: no slowdown
    for b in samples.beside:
        b["time_s"] = 0.9 * b["all_groups_s"]
    assert fit_out_of_step(samples).params[0].value == 0.0
    # no such rows (ranks with cores of their own): nothing fitted, and a note says why
    samples.beside = []
    res = fit_out_of_step(samples)
    assert not res.params and "no beside-busy samples" in res.note


def test_collective_spread_from_the_free_running_loop(tmp_path):
    """The bench's training-like loop (block, then an all-gather) beside out-of-step ranks and
    beside idle ones: the arrival spread beyond the idle one's, less the block's own spread, is
    the collectives' end spread the simulator turns into waits; the fit gives each case's
    spread back, and a re-benchmark adds its loop cases to the others."""
    from simfed.calibration.fit import _loop_solo_s, fit_out_of_step
    from simfed.calibration.samples import Samples, read_bench
    from simfed.spec.stats import expected_max_normal

    loop = {"phase": "loop", "flops": 5e8, "hidden": 256, "ffn_hidden": 688, "concurrent": 2,
            "nbytes": 2_902_016}
    block = {"phase": "forward_backward", "flops": 5e8, "hidden": 256, "ffn_hidden": 688}
    compute = [{**loop, "beside": "idle", "time_s": 0.008, "coll_time_s": 0.042,
                "arrival_sd_s": 0.010},
               {**loop, "beside": "busy", "time_s": 0.012, "coll_time_s": 0.051,
                "arrival_sd_s": 0.013},
               {**block, "concurrent": 4, "time_s": 0.010, "rank_cv": 0.0},
               {**block, "concurrent": 2, "beside": "busy", "time_s": 0.010, "rank_cv": 0.25}]
    meta = {"nodes": 4, "ranks_per_node": 1, "network": "testbed", "cores": 1,
            "host_cores": 2, "link_rate_Gbps": 0.5, "impl": {}}
    (tmp_path / "bench-summary.json").write_text(json.dumps({"meta": meta, "comm": [],
                                                             "compute": compute}))
    samples = read_bench(tmp_path)
    assert len(samples.loops) == 1 and not samples.beside
    solo = 0.042 - expected_max_normal(2) * 0.010  # the all-gather less its mean wait
    assert _loop_solo_s(samples.loops[0]) == pytest.approx(solo)
    want = math.sqrt(0.013**2 - 0.010**2 - (0.25 * 0.012) ** 2) / solo
    res = fit_out_of_step(samples, "comm", compute_cv=0.25)
    assert [p.name for p in res.params] == ["out_of_step_cv"]  # no slowdown without its cases
    assert res.params[0].value == pytest.approx(want)
    assert res.residuals[0]["predicted_s"] == pytest.approx(0.013)
    _, rep = calibrate(load_scenario(TINY), samples)
    # one loop case: no 95% interval, so not used (the scenario's value stands)
    assert "out_of_step_cv" in rep["fits"]["out_of_step_comm"]["not_used"]
    # without the compute block's share the whole excess goes to the collective
    assert fit_out_of_step(samples, "comm").params[0].value == pytest.approx(
        math.sqrt(0.013**2 - 0.010**2) / solo)
    # a re-benchmark: its rates replace the first bench's, its out-of-step cases join them
    fresh = read_bench(tmp_path)
    fresh.units = [object()]  # a unit sample measured right before the runs
    both = samples.refreshed(fresh)
    assert len(both.loops) == 2 and len(both.compute_beside) == 2
    assert both.units == fresh.units and not samples.units and len(samples.loops) == 1
    assert isinstance(both, Samples)


def test_group_drift_is_a_random_walk_pooled_over_the_drift_cases(tmp_path):
    """Two groups' ends differ by d after T seconds: a rank's variance grows as rate x T,
    sd(d)^2 = 2 x rate x T, sd(d) taken from the mean |d| as for a normal d (the waits it
    makes are mean waits; a stalled round does not set the rate through the rms); the rate
    pools the cases by rounds, the parameter is a rank's sd after 1 s (ms), with a chi-square
    interval around it, and it lands in the profile."""
    from scipy import stats

    from simfed.calibration.fit import fit_group_drift
    from simfed.calibration.samples import Samples, read_bench

    drift = {"phase": "drift", "flops": 5e8, "hidden": 256, "ffn_hidden": 688, "concurrent": 4,
             "nbytes": 2_902_016, "group_size": 2}
    compute = [{**drift, "loop_iters": 48, "time_s": 0.8, "drift_rms_s": 0.200,
                "drift_mean_abs_s": 0.060, "samples": 16},
               {**drift, "loop_iters": 12, "time_s": 0.2, "drift_rms_s": 0.030,
                "drift_mean_abs_s": 0.025, "samples": 8},
               {**drift, "loop_iters": 6, "time_s": 0.1, "drift_rms_s": 0.02, "samples": 1}]
    meta = {"nodes": 2, "ranks_per_node": 2, "network": "testbed", "cores": 1,
            "host_cores": 2, "link_rate_Gbps": 0.5, "impl": {}}
    (tmp_path / "bench-summary.json").write_text(json.dumps({"meta": meta, "comm": [],
                                                             "compute": compute}))
    samples = read_bench(tmp_path)
    assert len(samples.drifts) == 2  # one round cannot say how far apart groups end
    sd = [0.060 * math.sqrt(math.pi / 2), 0.025 * math.sqrt(math.pi / 2)]
    rate = (16 * sd[0] ** 2 / 1.6 + 8 * sd[1] ** 2 / 0.4) / 24
    res = fit_group_drift(samples)
    (p,) = res.params
    assert p.name == "group_drift_ms_per_sqrt_s" and p.value == pytest.approx(
        math.sqrt(rate) * 1e3)
    assert p.ci95[0] == pytest.approx(math.sqrt(rate * 24 / stats.chi2.ppf(0.975, 24)) * 1e3)
    assert p.ci95[0] < p.value < p.ci95[1]
    assert [r["measured_s"] for r in res.residuals] == [0.060, 0.025]
    assert [r["predicted_s"] for r in res.residuals] == pytest.approx(
        [math.sqrt(2 * rate * t * 2 / math.pi) for t in (0.8, 0.2)])
    profile, _ = calibrate(load_scenario(TINY), samples)
    assert profile["runtime"]["shared_cores"]["group_drift_ms_per_sqrt_s"] == pytest.approx(
        p.value, abs=1e-3)
    assert "group_drift" in profile["runtime"]["provenance"][
        "runtime.shared_cores.group_drift_ms_per_sqrt_s"]
    # no drift case: nothing fitted, groups stay in step
    assert not fit_group_drift(Samples()).params
    # a re-benchmark's drift cases join the first bench's
    assert len(samples.refreshed(read_bench(tmp_path)).drifts) == 4


PINNED = {"cluster.host_cores": 2, "cluster.node.cpu_cores": 1, "cluster.node.nics.bw_Gbps": 0.4}
FOUR_BY_ONE = {"cluster.nodes": 4, "cluster.node.gpus": 1}


def _core_samples(truth: dict, layouts: tuple[str, ...]) -> Samples:
    """Collectives across nodes timed by the simulator with `truth`: on 2 nodes of 2 ranks
    (one node a host core) and/or on 4 nodes of 1 rank over 2 cores (two nodes a core)."""
    out = Samples(sources=["synthetic"], meta={"host_cores": 2})
    cases = {"2x2": ({}, 2, (("hsdp", "replicate", ((0, 2), (1, 3))),
                             ("fsdp", "shard", ((0, 1, 2, 3),)))),
             "4x1": (FOUR_BY_ONE, 1, (("fsdp", "shard", ((0, 1, 2, 3),)),))}
    for layout in layouts:
        over, per_node, groups = cases[layout]
        for alg, pg, inst in groups:
            for op in ("all_gather", "all_reduce"):
                for nbytes in (65_536, 1_048_576, 8_388_608):
                    out.comm.append(CommSample(
                        op=op, instances=inst, nbytes=nbytes, world=4, gpus_per_node=per_node,
                        time_s=_time_at({**truth, **PINNED, **over}, 0.4, op, pg, nbytes, alg),
                        source="synthetic", label=f"{layout} {op} {alg}-{pg} {nbytes}"))
    return out


def test_a_cores_network_stack_is_fitted_where_a_core_carries_two_nodes():
    """core_stack_Gbps (0.6: two nodes' flows of 0.4 Gb/s each on one core move at 0.3): the
    4x1 layout's collectives across nodes identify it; the 2x2 layout alone (one node a core)
    cannot, and without it nothing is fitted."""
    truth = {**TRUE, "runtime.shared_cores.core_stack_Gbps": 0.6}
    scn = load_scenario(TINY, PINNED)
    res = fit_comm(scn, _core_samples(truth, ("2x2", "4x1")))
    got = {p.name: p for p in res.params}
    assert got["core_stack_Gbps"].value == pytest.approx(0.6, rel=1e-2)
    assert got["nic_bw_Gbps"].value == pytest.approx(0.4, rel=1e-2)
    assert res.rms_rel_error < 1e-3
    assert "core_stack_Gbps" not in {p.name for p in fit_comm(
        scn, _core_samples(truth, ("2x2",))).params}
    # no core effect in the samples: the core never binds, and it is not used
    plain = fit_comm(scn, _core_samples(TRUE, ("2x2", "4x1")))
    assert "core_stack_Gbps" not in {p.name for p in plain.params}
    assert "core_stack_Gbps" in plain.not_used
    # the profile carries it to the simulator
    prof, _ = calibrate(scn, _core_samples(truth, ("2x2", "4x1")))
    assert prof["runtime"]["shared_cores"]["core_stack_Gbps"] == pytest.approx(0.6, rel=1e-2)
