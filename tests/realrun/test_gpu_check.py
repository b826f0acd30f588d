"""The prepared GPU check (realrun.gpu_check, `make gpu-check`): its dry run on the CPU goes
through every stage with the CUDA calls skipped and says so; the scenario it would run on 1, 2
or 8 GPUs is valid; devices map to the repository's datasheet files; bad options and a used
results folder are one-line errors. On a GPU (marker gpu) the micro-timings run on CUDA."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from realrun import gpu_check
from simfed.spec import scenario_from_dict

from ..conftest import ROOT


@pytest.mark.slow
@pytest.mark.timeout(1000)
def test_the_dry_run_goes_through_every_stage_and_names_what_it_skipped(tmp_path):
    """(About a minute on a quiet 2-core host; the budget leaves room for a busy one.)"""
    results, work = tmp_path / "results", tmp_path / "work"
    res = subprocess.run([sys.executable, "-m", "realrun.gpu_check", "--dry-run", "--results",
                          str(results), "--work", str(work), "--budget-s", "900"],
                         capture_output=True, text=True, cwd=ROOT, timeout=960)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "dry run: skipped" in res.stdout and "NCCL" in res.stdout
    summary = json.loads((results / "summary.json").read_text())
    assert {n: s["status"] for n, s in summary["stages"].items()} == dict.fromkeys(
        ("env", "micro", "runs", "calibrate", "compare"), "ok")
    assert summary["dry_run"] and any("NCCL" in p for p in summary["skipped_cuda_parts"])
    assert set(summary["files"]) >= {"scenario.yaml", "micro.json", "runs.json",
                                     "calibrated.yaml", "compare.json"}
    micro = json.loads((results / "micro.json").read_text())
    assert {r["kind"] for r in micro["rows"]} == {"gemm", "attention", "memory"}
    assert all(r["p10_s"] <= r["time_s"] <= r["p90_s"] for r in micro["rows"])
    runs = json.loads((results / "runs.json").read_text())
    assert sorted(runs["summaries"]) == ["fl_fsdp", "fl_hsdp", "fsdp", "hsdp"]
    assert all(s["backend"] == "gloo" and s["world_size"] == 1
               and s["step_time_s_unprofiled"] > 0 for s in runs["summaries"].values())
    comp = json.loads((results / "compare.json").read_text())
    assert set(comp["micro"]["summary"]) == {"gemm", "attention", "memory"}
    assert [r["algorithm"] for r in comp["runs"]] == ["fl_fsdp", "fl_hsdp", "fsdp", "hsdp"]
    assert all(r["measured_from"] == "step_time_s_unprofiled" for r in comp["runs"])
    # the fit ran on the trace's operators; on a busy CPU a value may come out unidentified
    kern = summary["stages"]["calibrate"]["kernels"]
    assert kern["n"] > 0 and kern["device"] == "cpu"
    assert {"gemm_efficiency", "hbm_efficiency"} <= set(kern["params"] or {}) | set(
        kern["not_used"] or {})
    assert (results / "calibrated.yaml").is_file()
    assert (work / "runs" / "fsdp" / "profile_rank0.json").is_file()


@pytest.mark.parametrize("gpus, nodes, per_node", [(1, 1, 1), (2, 2, 1), (8, 2, 4)])
def test_the_gpu_scenario_is_valid_for_the_gpus_there_are(gpus, nodes, per_node):
    env = {"gpus": gpus, "device": "NVIDIA H200", "cluster": "scenarios/clusters/dgx-h200.yaml",
           "profile": "scenarios/profiles/dgx-h100.yaml"}
    data = gpu_check.run_scenario(env, dry_run=False)
    scn = scenario_from_dict(data)
    assert (scn.cluster.nodes, scn.cluster.node.gpus) == (nodes, per_node)
    assert scn.cluster.node.gpu.name == "H200-SXM-141GB"
    assert scn.cluster.node.gpu.hbm_bw_GBps == 4800
    assert [a.name for a in scn.algorithms] == ["fsdp", "hsdp", "fl_fsdp", "fl_hsdp"]
    assert scn.runtime.compute.model == "kernels"  # the H100 profile's kernel model
    plan = scn.algorithm("fl_fsdp").plan(scn.cluster)
    assert plan.groups == (2 if gpus >= 2 else 1)
    # an unknown device keeps the H100 figures but says its own name
    other = gpu_check.run_scenario({**env, "device": "NVIDIA B200", "cluster": None,
                                    "profile": None}, dry_run=False)
    assert other["cluster"]["node"]["gpu"]["name"] == "NVIDIA B200"


def test_devices_map_to_their_datasheet_files():
    assert gpu_check.device_files("NVIDIA H200", 139.8)[0].endswith("dgx-h200.yaml")
    assert gpu_check.device_files("NVIDIA H100 80GB HBM3", 79.2)[0].endswith("dgx-h100.yaml")
    assert gpu_check.device_files("NVIDIA A100-SXM4-80GB", 79.2)[1].endswith("a100.yaml")
    # the 40 GB A100's HBM2 runs at 1,555 GB/s, not the 80 GB part's 2,039: no file for it
    assert gpu_check.device_files("NVIDIA A100-SXM4-40GB", 39.4) == (None, None)
    assert gpu_check.device_files("NVIDIA L4", 22.0) == (None, None)


def test_time_op_on_the_cpu_gives_a_median_inside_its_spread():
    calls = []
    out = gpu_check.time_op(lambda: calls.append(1), torch.device("cpu"), reps=7, warmup=2)
    assert len(calls) == 9 and out["reps"] == 7
    assert 0 <= out["p10_s"] <= out["time_s"] <= out["p90_s"] and math.isfinite(out["time_s"])


def test_profiled_steps_are_left_out_of_the_step_time():
    times = [9.0, 1.0, 5.0, 5.0, 1.2, 1.1]  # step 0 warms up; steps 2, 3 profiled
    assert gpu_check.unprofiled_step_s(times, "2:4") == pytest.approx(1.1)
    assert gpu_check.unprofiled_step_s([9.0, 5.0], "1:2") is None


def test_a_budget_too_small_skips_the_stages_and_says_so(tmp_path, capsys):
    rc = gpu_check.main(["--dry-run", "--results", str(tmp_path / "r"), "--work",
                         str(tmp_path / "w"), "--budget-s", "1"])
    assert rc == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    for name in ("micro", "runs", "calibrate", "compare"):
        assert summary["stages"][name]["status"] == "skipped"
        assert "time budget" in summary["stages"][name]["why"]
    assert "micro: skipped (time budget" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--dry-run", "--budget-s", "nan"], "--budget-s: must be a number of seconds"),
    (["--dry-run", "--budget-s", "-3"], "--budget-s: must be a number of seconds"),
])
def test_bad_options_are_one_line(argv, message, capsys):
    assert gpu_check.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_used_results_folder_is_refused(tmp_path, capsys):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "summary.json").write_text("{}")
    assert gpu_check.main(["--dry-run", "--results", str(tmp_path / "r"), "--work",
                           str(tmp_path / "w")]) == 2
    assert "not empty" in capsys.readouterr().err
    assert (tmp_path / "r" / "summary.json").read_text() == "{}"  # nothing overwritten


def test_missing_dependencies_are_named_before_anything_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "missing_modules", lambda: ["pydantic", "simpy"])
    assert gpu_check.main(["--dry-run", "--results", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "not installed here: pydantic, simpy" in err and "docs/gpu-check.md" in err
    assert not (tmp_path / "r").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the real check runs")
def test_without_a_gpu_the_real_check_says_so(capsys):
    assert gpu_check.main([]) == 2
    assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_micro_timings_on_cuda():
    m = gpu_check.micro_timings(torch.device("cuda", 0), dry_run=False)
    assert m["dtype"] == "bfloat16" and not m["notes"]
    gemm = {r["name"]: r for r in m["rows"] if r["kind"] == "gemm"}
    # a large bf16 GEMM runs at more than a tenth of any datacenter GPU's tensor-core peak
    big = gemm["square 8192"]
    assert 2 * 8192**3 / big["time_s"] > 30e12
    assert {r["backend"] for r in m["rows"] if r["kind"] == "attention"} == {"flash"}
