"""Per-operator calibration from torch.profiler traces (simfed.calibration.profiler).

- A SYNTHETIC CUDA trace in Kineto's format (tests/fixtures/profiler/make_gpu_trace.py: kernels
  linked to CPU operators by "External id", backward on the autograd thread, split-K GEMMs,
  flash attention's several kernels, FSDP copies, views): the parser finds exactly the operators
  written, with their shapes, bytes and summed kernel times, and the fit recovers the
  efficiencies the trace was made with.
- Two REAL CPU traces (realrun run --profile-steps 2:5 of tests/fixtures/profiler/cpu1.yaml at
  micro-batch 2 and 8, one rank, OMP_NUM_THREADS=1; see that folder's README.md): fit on
  micro-batch 2, predict micro-batch 8's operator times (held out). The tolerances were set from
  a first measurement, recorded in test_fit_on_one_micro_batch_predicts_the_other; the same
  check with the scenario's unfitted efficiencies fails them.
- `simfed calibrate` writes what is identified into the profile, with provenance, and says
  what is not used and why; bad traces are one-line errors.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from simfed.calibration import read_inputs
from simfed.calibration.profiler import (
    PARAMS,
    OpSample,
    fit_scenario,
    op_samples,
    pooled,
    predict_for,
    read_profiler,
)
from simfed.cli import main
from simfed.spec import load_scenario

from ..conftest import ROOT

FIX = ROOT / "tests" / "fixtures" / "profiler"
GPU_TRACE = FIX / "gpu_h100_synthetic.json"
H100 = FIX / "h100.yaml"
CPU1 = FIX / "cpu1.yaml"


def _generator():
    spec = importlib.util.spec_from_file_location("make_gpu_trace", FIX / "make_gpu_trace.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


GEN = _generator()


# ---- the GPU format (synthetic) ----------------------------------------------------------
def test_the_gpu_fixture_is_what_its_generator_writes_and_says_it_is_synthetic():
    doc, _ = GEN.build()
    on_disk = json.loads(GPU_TRACE.read_text())
    assert on_disk == json.loads(json.dumps(doc))
    assert on_disk["simfed_fixture"].startswith("SYNTHETIC")


def test_gpu_trace_gives_the_operators_written_with_their_shapes_bytes_and_kernel_times():
    _, expected = GEN.build()
    got = read_profiler(GPU_TRACE)
    assert {s.device for s in got} == {"NVIDIA H100 80GB HBM3"}  # deviceProperties' name
    # every operator written once per call, none else: the FSDP copy, the view (no kernel),
    # the wrappers (linear, matmul, to) and what runs inside attention are not samples
    assert sum(len(s.times_s) for s in got) == len(expected)
    by_kind = {k: sorted(round(e["time_us"], 3) for e in expected if e["kind"] == k)
               for k in ("gemm", "memory", "attention")}
    for kind, times in by_kind.items():
        # kernel durations summed per operator (split-K's reduction kernel, flash backward's
        # three kernels and the memset launched inside it)
        assert sorted(round(t * 1e6, 3) for s in got if s.kind == kind
                      for t in s.times_s) == pytest.approx(times, abs=2e-3), kind
    gemms = {(s.phase, s.gemm) for s in got if s.kind == "gemm"}
    assert gemms == {(e["phase"], tuple(e["gemm"])) for e in expected if e["kind"] == "gemm"}
    mem = {(s.phase, s.op, s.nbytes) for s in got if s.kind == "memory"}
    assert mem == {(e["phase"], e["op"], e["nbytes"]) for e in expected if e["kind"] == "memory"}
    att = {s.phase: s for s in got if s.kind == "attention"}
    b, h, t, dh = GEN.B, GEN.H, GEN.T, GEN.DH
    assert att["forward"].causal and att["backward"].causal  # from "Concrete Inputs"
    assert att["forward"].flops == 4.0 * b * h * t * t * dh
    assert att["backward"].flops == 2.5 * att["forward"].flops
    assert {s.phase for s in got} == {"forward", "backward", "optimizer"}


def test_gpu_fit_recovers_the_efficiencies_the_trace_was_made_with():
    scn = load_scenario(H100)
    gpu, rt = scn.cluster.node.gpu, scn.runtime.compute
    # the generator's GPU is the scenario's (else the truth would not be the model's)
    assert (gpu.peak_tflops * 1e12, gpu.hbm_bw_GBps * 1e9, gpu.sms) == (GEN.PEAK, GEN.HBM,
                                                                       GEN.SMS)
    assert tuple(tuple(x) for x in rt.gemm_tiles) == GEN.TILES and rt.causal_skip
    res, device = fit_scenario(scn, read_profiler(GPU_TRACE))
    assert device == "NVIDIA H100 80GB HBM3"
    got = {p.name: p for p in res.params}
    for name in ("gemm_efficiency", "hbm_efficiency", "attention_efficiency_forward",
                 "attention_efficiency_backward"):
        p = got[name]
        assert p.ci95[0] <= GEN.TRUTH[name] <= p.ci95[1], (name, p)
        assert p.value == pytest.approx(GEN.TRUTH[name], rel=0.03), name
    # a 3 us per-kernel time under 50-2,500 us kernels with 2% scatter: not identified, the
    # scenario's value stands
    assert "kernel_gap_us" in res.not_used
    assert "wider than" in res.not_used["kernel_gap_us"]["reason"]
    assert res.rms_rel_error < 0.03


def test_calibrate_writes_the_identified_efficiencies_with_provenance(tmp_path):
    out = tmp_path / "h100.yaml"
    res = CliRunner().invoke(main, ["calibrate", str(GPU_TRACE), "--scenario", str(H100),
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "not used: kernel_gap_us (95% interval" in res.output
    prof = yaml.safe_load(out.read_text())
    compute = prof["runtime"]["compute"]
    assert compute["gemm_efficiency"] == pytest.approx(0.72, rel=0.03)
    assert "kernel_gap_us" not in compute
    prov = prof["runtime"]["provenance"]["runtime.compute.gemm_efficiency"]
    assert "torch.profiler" in prov and "NVIDIA H100 80GB HBM3" in prov and "95% CI" in prov
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["fits"]["kernels"]["device"] == "NVIDIA H100 80GB HBM3"
    assert len(report["fits"]["kernels"]["residuals"]) == len(read_profiler(GPU_TRACE))
    # the profile runs: its values reach the scenario's kernel model
    scn = load_scenario(H100, profile=out)
    assert scn.runtime.compute.gemm_efficiency == compute["gemm_efficiency"]


def test_a_kernel_carrying_its_launchs_id_is_linked_through_the_launch():
    """Some traces (e.g. HolisticTraceAnalysis' tests/data/trace_filter/sampled_rank-0.json.gz)
    give a kernel and its cudaLaunchKernel the launch's correlation as "External id", not the
    operator's: the kernel belongs to the innermost operator around its launch."""
    mm = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 100.0,
          "dur": 30.0, "args": {"External id": 5, "Input Dims": [[64, 32], [32, 16]],
                                "Input type": ["float", "float"]}}
    outer = {**mm, "name": "aten::matmul", "ts": 90.0, "dur": 50.0,
             "args": {"External id": 4, "Input Dims": [[64, 32], [32, 16]],
                      "Input type": ["float", "float"]}}
    launch = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
              "ts": 110.0, "dur": 5.0, "args": {"External id": 77, "correlation": 77}}
    kernel = {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 120.0,
              "dur": 12.5, "args": {"External id": 77, "correlation": 77, "device": 0}}
    got = op_samples({"traceEvents": [outer, mm, launch, kernel]}, "inline")
    assert [(s.op, s.gemm) for s in got] == [("aten::mm", (1, 64, 16, 32))]
    assert got[0].times_s == pytest.approx((12.5e-6,))


def test_traces_of_two_devices_fit_the_scenarios_gpu_and_report_the_other(tmp_path):
    cpu = read_profiler(FIX / "cpu_mb2.json.gz")
    gpu = read_profiler(GPU_TRACE)
    samples = read_inputs([GPU_TRACE, FIX / "cpu_mb2.json.gz"], 8)
    assert len(samples.ops) == len(cpu) + len(gpu)
    from simfed.calibration import calibrate

    profile, report = calibrate(load_scenario(H100), samples)
    assert report["fits"]["kernels"]["device"] == "NVIDIA H100 80GB HBM3"  # named like H100-SXM
    assert profile["runtime"]["compute"]["gemm_efficiency"] == pytest.approx(0.72, rel=0.03)
    assert report["fits"]["kernels cpu"]["device"] == "cpu"
    assert "not the scenario's GPU" in report["fits"]["kernels cpu"]["note"]


def test_flash_attn_custom_ops_are_attention_in_their_own_layout():
    """Dao's flash-attn 2 ops take (batch, tokens, heads, head dim); is_causal is argument 5
    forward, 11 backward; the kernel time of the op and what it calls."""
    q, kv = [2, 1024, 16, 64], [2, 1024, 4, 64]
    fwd = {"ph": "X", "cat": "cpu_op", "name": "flash_attn::_flash_attn_forward", "pid": 1,
           "tid": 1, "ts": 10.0, "dur": 20.0, "args": {
               "External id": 1, "Input Dims": [q, kv, kv, [], [], [], [], [], [], [], []],
               "Input type": ["c10::BFloat16"] * 3 + ["Scalar"] * 8,
               "Concrete Inputs": ["", "", "", "0.", "0.125", "True", "-1", "-1", "0.", "",
                                   "False"]}}
    kernel = {"ph": "X", "cat": "kernel", "name": "flash_fwd_kernel", "pid": 0, "tid": 7,
              "ts": 40.0, "dur": 100.0, "args": {"External id": 1, "correlation": 9}}
    got = op_samples({"traceEvents": [fwd, kernel]}, "inline")
    assert len(got) == 1 and got[0].kind == "attention" and got[0].causal
    assert got[0].flops == 4.0 * 2 * 16 * 1024 * 1024 * 64


def test_one_shape_does_not_identify_an_efficiency_and_the_gap_apart():
    scn = load_scenario(H100)
    one = OpSample(kind="gemm", op="aten::mm", phase="forward", times_s=(1e-3, 1.01e-3),
                   device="gpu", source="made up", shapes="[8192, 4096];[4096, 4096]",
                   flops=2.0 * 8192 * 4096 * 4096, nbytes=2.0 * 3 * 4096 * 8192,
                   gemm=(1, 8192, 4096, 4096))
    res, _ = fit_scenario(scn, [one])
    assert res.params == []
    assert set(res.not_used) == set(PARAMS)
    assert "no 95% interval" in res.not_used["gemm_efficiency"]["reason"]
    assert "no samples of its kind" in res.not_used["hbm_efficiency"]["reason"]


# ---- a real CPU trace --------------------------------------------------------------------
def test_a_real_cpu_trace_holds_the_models_operators_per_step():
    scn = load_scenario(CPU1)
    got = pooled(read_profiler(FIX / "cpu_mb2.json.gz"))
    tok, d, kv, f, v = (scn.training.micro_batch * scn.training.seq_len, scn.model.hidden,
                        scn.model.kv_dim, scn.model.ffn_hidden, scn.model.vocab)
    steps, layers = 3, scn.model.layers  # --profile-steps 2:5
    fwd = {s.gemm: len(s.times_s) for s in got if s.kind == "gemm" and s.phase == "forward"}
    # q and o (d x d), k and v (kv x d), gate and up (f x d), down (d x f), the tied head
    # (v x d: the vocabulary is as wide as the hidden size here, so it adds to q and o's)
    want = Counter({(1, tok, d, d): 2 * steps * layers, (1, tok, kv, d): 2 * steps * layers,
                    (1, tok, f, d): 2 * steps * layers, (1, tok, d, f): steps * layers})
    want[(1, tok, v, d)] += steps
    assert fwd == dict(want)
    bwd = sum(len(s.times_s) for s in got if s.kind == "gemm" and s.phase == "backward")
    assert bwd == 2 * sum(fwd.values())  # input and weight gradient of each
    att = {s.phase: len(s.times_s) for s in got if s.kind == "attention"}
    assert att == {"forward": steps * layers, "backward": steps * layers}
    assert all(s.causal for s in got if s.kind == "attention")
    assert {s.phase for s in got if s.kind == "memory"} == {"forward", "backward", "optimizer"}


def _errors(scn, samples, fit) -> dict[str, tuple[float, float]]:
    """Per kind: (median |relative error| of the operators' median times, relative error of
    their summed time, calls x median)."""
    pred = predict_for(scn, samples, fit)
    meas = np.array([s.time_s for s in samples])
    calls = np.array([len(s.times_s) for s in samples])
    out = {}
    for kind in ("gemm", "memory", "attention", "all"):
        sel = np.array([kind in ("all", s.kind) for s in samples])
        rel = (pred[sel] - meas[sel]) / meas[sel]
        total = (calls[sel] @ pred[sel] - calls[sel] @ meas[sel]) / (calls[sel] @ meas[sel])
        out[kind] = (float(np.median(np.abs(rel))), float(total))
    return out


def test_fit_on_one_micro_batch_predicts_the_other():
    """Fit on micro-batch 2 (256 tokens), predict micro-batch 8 (1,024 tokens, held out).
    First measurement (this code, these fixtures): fitted gemm_efficiency 0.690, hbm 0.602,
    attention 0.217 / 0.277 (kernel_gap_us not identified); held out: GEMMs' median |error|
    15.8%, their summed time +2.2%; attention's summed time +11.1%; every operator's summed
    time -7.4% (memory-bound operators' -51.6%, median |error| 55%: a CPU's elementwise operators
    are not bytes over one bandwidth, see docs/calibrate-gpu.md). The scenario's unfitted
    efficiencies on the same held-out trace: GEMMs -11.8%, attention -45.6%, all -24.7%."""
    scn = load_scenario(CPU1)
    fit_set = pooled(read_profiler(FIX / "cpu_mb2.json.gz"))
    held = pooled(read_profiler(FIX / "cpu_mb8.json.gz"))
    res, device = fit_scenario(scn, fit_set)
    assert device == "cpu"
    assert {p.name for p in res.params} >= {"gemm_efficiency", "hbm_efficiency"}
    err = _errors(scn, held, res)
    assert err["gemm"][0] <= 0.20 and abs(err["gemm"][1]) <= 0.05, err
    assert abs(err["attention"][1]) <= 0.15, err
    assert abs(err["all"][1]) <= 0.10, err
    # the check can fail: the scenario's own efficiencies miss it
    base = _errors(scn, held, None)
    assert abs(base["gemm"][1]) > 0.05 and abs(base["all"][1]) > 0.10, base


def test_a_run_folder_is_read_with_its_profiler_traces(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    raw = gzip.decompress((FIX / "cpu_mb2.json.gz").read_bytes())
    (run / "profile_rank0.json").write_bytes(raw)
    got = read_inputs([run], 1)
    assert len(got.ops) == len(read_profiler(FIX / "cpu_mb2.json.gz"))
    assert got.comm == []  # a CPU trace has no NCCL kernels; collectives come from .jsonl


def test_a_trace_without_shapes_says_so(tmp_path):
    """A profile taken with record_shapes=False (as realrun's once were) has operators but
    no "Input Dims": nothing is fitted and the output says why."""
    doc = json.loads(GPU_TRACE.read_text())
    for e in doc["traceEvents"]:
        for key in ("Input Dims", "Input type", "Input Strides", "Concrete Inputs"):
            (e.get("args") or {}).pop(key, None)
    bare = tmp_path / "run" / "profile_rank0.json"
    bare.parent.mkdir()
    bare.write_text(json.dumps(doc))
    for given in (bare, bare.parent):
        out = tmp_path / "p.yaml"
        res = CliRunner().invoke(main, ["calibrate", str(given), "--scenario", str(H100),
                                        "--out", str(out)])
        assert res.exit_code == 0, res.output
        assert f"kernels: no operator samples: {bare} has no shapes" in res.output
        assert "record_shapes=True" in res.output
        assert "gemm_efficiency" not in out.read_text()


# ---- bad input -------------------------------------------------------------------------------
@pytest.mark.parametrize("body, message", [
    ('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": "soon", '
     '"dur": 1, "args": {"Input Dims": [[2, 2], [2, 2]], "Input type": ["float", "float"]}}]}',
     "malformed input"),
    ('{"traceEvents": [{"ph": "X", "cat": "cpu_op", ', "not JSON (line 1, column 47"),
    ('{"traceEvents": ' + '[' * 100_000 + ']' * 100_000 + '}', "nested deeper than 64"),
    ('{"traceEvents": {"ph": "X"}}', "traceEvents is not a list"),
])
def test_a_bad_trace_is_one_line_and_exit_2(tmp_path, body, message):
    bad = tmp_path / "bad.json"
    bad.write_text(body)
    res = CliRunner().invoke(main, ["calibrate", str(bad), "--scenario", str(H100),
                                    "--out", str(tmp_path / "p.yaml")])
    assert res.exit_code == 2, res.output
    assert message in res.output and len(res.output.strip().splitlines()) == 1
    assert "Traceback" not in res.output


# ---- realrun writes such a trace ---------------------------------------------------------
@pytest.mark.slow
def test_realrun_profile_steps_writes_a_trace_with_shapes(tmp_path):
    """One CPU rank, two steps, the second profiled (gloo; CUDA activities on a GPU)."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "realrun.cli", "run", str(CPU1), "-a", "fsdp", "--out",
           str(out), "--nproc", "1", "--set", "training.steps=2", "--profile-steps", "1:2",
           "-q"]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    trace = out / "profile_rank0.json"
    data = json.loads(trace.read_text())
    assert data.get("record_shapes") == 1
    got = read_inputs([out], 1)  # the run folder: its .jsonl and its profile
    gemms = [s for s in got.ops if s.kind == "gemm"]
    scn = load_scenario(CPU1)
    tok = scn.training.micro_batch * scn.training.seq_len
    assert (1, tok, scn.model.hidden, scn.model.hidden) in {s.gemm for s in gemms}
    assert {s.phase for s in gemms} == {"forward", "backward"}
