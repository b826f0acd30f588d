"""Calibration: recover known constants from synthetic measurements, read every input format,
and write a profile a scenario can run with."""

import json

import numpy as np
import pytest

from simfed.calibration import calibrate, read_inputs, write_profile
from simfed.calibration.fit import fit_comm
from simfed.calibration.samples import CommSample, OptimizerSample, Samples, UnitSample
from simfed.engine.actors import partition
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
    scn = load_scenario(TINY, TRUE)
    alg = scn.algorithm("hsdp")
    plan = alg.plan(scn.cluster)
    hw = Hardware.from_spec(scn.cluster, scn.runtime)
    sim = Simulation(hw=hw, plan=plan, part=partition(plan, StragglerSpec(), 1, 0), programs={},
                     aggregate_steps=set(), steps=1, comm=scn.runtime.comm, host=scn.runtime.host)
    return sim.collective(pg, 0, op, nbytes).solo_s


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
