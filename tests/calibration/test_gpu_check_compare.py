"""The GPU check's comparison (simfed.calibration.gpu_check): micro-timings against the kernel
model with the H100's shipped constants, by hand; a measurement slower than the model reads as
the model too fast; realrun runs against `simfed run`; bad results folders are one line."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from simfed.calibration import gpu_check as gc
from simfed.engine import simulate
from simfed.spec import load_scenario

from ..conftest import ROOT, SCENARIOS

PROFILER = ROOT / "tests" / "fixtures" / "profiler"


@pytest.fixture
def h100_scenario(tmp_path):
    """A one-GPU H100 scenario with the shipped dgx-h100 profile, includes resolved."""
    src = tmp_path / "src.yaml"
    src.write_text(yaml.safe_dump({
        "name": "gpu-check", "cluster": {"include": str(SCENARIOS / "clusters/dgx-h100.yaml"),
                                         "nodes": 1, "node": {"gpus": 1}},
        "model": {"include": str(SCENARIOS / "models/llama3.1-8b.yaml")},
        "training": {"seq_len": 8192, "micro_batch": 1, "steps": 2},
        "runtime": {"include": str(SCENARIOS / "profiles/dgx-h100.yaml")},
        "algorithms": [{"name": "fsdp"}]}))
    folder = tmp_path / "results"
    folder.mkdir()
    from simfed.spec import load_scenario_data
    (folder / "scenario.yaml").write_text(yaml.safe_dump(load_scenario_data(src)))
    return folder


ROWS = [
    {"kind": "gemm", "name": "square 8192", "m": 8192, "n": 8192, "k": 8192},
    {"kind": "gemm", "name": "K sweep k=768", "m": 16384, "n": 8192, "k": 768},
    {"kind": "gemm", "name": "K sweep k=4096", "m": 16384, "n": 8192, "k": 4096},
    {"kind": "attention", "name": "s8192 d128", "direction": "forward", "batch": 1,
     "heads": 32, "seq": 8192, "head_dim": 128, "causal": True},
    {"kind": "attention", "name": "s8192 d128", "direction": "backward", "batch": 1,
     "heads": 32, "seq": 8192, "head_dim": 128, "causal": True},
    {"kind": "memory", "name": "copy", "op": "copy", "elements": 2**29},
    {"kind": "memory", "name": "rmsnorm composite", "op": "rmsnorm_composite",
     "elements": 8192 * 4096},
]


def _write_micro(folder, rows):
    (folder / "micro.json").write_text(json.dumps({"dtype": "bfloat16", "rows": rows,
                                                   "env": {"device": "NVIDIA H100"}}))


def test_predictions_follow_the_kernel_model_by_hand(h100_scenario):
    scn = load_scenario(h100_scenario / "scenario.yaml")
    rt = scn.runtime.compute
    gap = rt.kernel_gap_us * 1e-6
    peak, hbm = 989e12, 3350e9
    # measured exactly 10% slower than the model's own time
    timed = []
    for r in ROWS:
        pred = gc.predict_row({**r, "time_s": 1.0}, scn, 2, "t")["predicted_s"]
        timed.append({**r, "time_s": 1.1 * pred})
    _write_micro(h100_scenario, timed)
    out = gc.compare_folder(h100_scenario)["micro"]
    rows = {(r["name"], r.get("direction")): r for r in out["rows"]}
    sq = rows[("square 8192", None)]
    # 8192^2 outputs in 128x128 tiles: 4096 tiles over 132 SMs = 31.03 waves -> 32
    wave = 4096 / (32 * 132)
    assert sq["model_efficiency"] == pytest.approx(rt.gemm_efficiency * wave)
    assert sq["predicted_s"] == pytest.approx(2 * 8192**3 / (peak * rt.gemm_efficiency * wave)
                                              + gap)
    fwd = rows[("s8192 d128", "forward")]
    flops = 4.0 * 32 * 8192**2 * 128 / 2  # causal half skipped
    assert fwd["predicted_s"] == pytest.approx(flops / (peak * rt.attention_efficiency_forward)
                                               + gap)
    assert rows[("s8192 d128", "backward")]["flops"] == pytest.approx(2.5 * flops)
    assert rows[("copy", None)]["bytes"] == 2 * 2 * 2**29
    assert rows[("rmsnorm composite", None)]["bytes"] == (28 + 4 * 2) * 8192 * 4096
    assert rows[("copy", None)]["predicted_s"] == pytest.approx(
        4 * 2**29 / (hbm * rt.hbm_efficiency) + gap)
    for r in out["rows"]:  # + error: the model too fast
        assert r["error"] == pytest.approx(1 / 1.1 - 1)
    for s in out["summary"].values():
        assert s["median_measured_over_predicted"] == pytest.approx(1.1)
    assert [r["k"] for r in out["gemm_efficiency_by_k"]] == [768, 4096]
    assert set(out["attention_efficiency_by_head_dim"]) == {"head_dim 128 forward",
                                                            "head_dim 128 backward"}


def test_implied_efficiency_is_the_model_constant_when_measured_equals_predicted(
        h100_scenario):
    scn = load_scenario(h100_scenario / "scenario.yaml",
                        {"runtime.compute.kernel_gap_us": 0.0})
    row = {**ROWS[2], "time_s": 1.0}
    pred = gc.predict_row(row, scn, 2, "t")
    same = gc.predict_row({**row, "time_s": pred["predicted_s"]}, scn, 2, "t")
    assert same["implied_efficiency"] == pytest.approx(same["model_efficiency"])


def test_runs_are_compared_with_simfed_run(tmp_path):
    folder = tmp_path / "r"
    folder.mkdir()
    shutil.copy(PROFILER / "cpu1.yaml", folder / "scenario.yaml")
    (folder / "runs.json").write_text(json.dumps({"summaries": {"fsdp": {
        "world_size": 1, "backend": "gloo", "step_time_s_after_first": 0.2,
        "step_time_s_unprofiled": 0.05}}}))
    out = gc.compare_folder(folder)
    (row,) = out["runs"]
    want = simulate(load_scenario(folder / "scenario.yaml"))[0]["algorithms"][0]["step_time_s"]
    assert row["measured_from"] == "step_time_s_unprofiled"
    assert row["predicted_step_s"] == pytest.approx(want)
    assert row["error"] == pytest.approx(want / 0.05 - 1)
    assert "micro" not in out


@pytest.mark.parametrize("micro, message", [
    ({"dtype": "bfloat16", "rows": []}, "rows: expected a non-empty list"),
    ({"dtype": "int8", "rows": [ROWS[0]]}, "dtype: expected one of"),
    ({"dtype": "bfloat16", "rows": [{**ROWS[0], "time_s": float("nan")}]},
     "rows[0]: time_s: expected a finite number"),
    ({"dtype": "bfloat16", "rows": [{**ROWS[0], "time_s": -1.0}]}, "rows[0]: time_s: must be"),
    ({"dtype": "bfloat16", "rows": [{**ROWS[0], "kind": "fft", "time_s": 1.0}]},
     "rows[0]: kind: expected one of gemm, attention, memory"),
    ({"dtype": "bfloat16", "rows": [{**ROWS[5], "op": "gelu", "time_s": 1.0}]},
     "rows[0]: op: expected one of"),
    ({"dtype": "bfloat16", "rows": [{**ROWS[3], "direction": "up", "time_s": 1.0}]},
     "rows[0]: direction: expected forward or backward"),
])
def test_bad_micro_timings_are_one_line_errors(h100_scenario, micro, message, capsys):
    (h100_scenario / "micro.json").write_text(json.dumps(micro))
    assert gc.main([str(h100_scenario)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (h100_scenario / "compare.json").exists()


def test_bad_folders_are_one_line_errors(tmp_path, h100_scenario, capsys):
    assert gc.main([str(tmp_path / "none")]) == 2
    assert "not a folder of GPU-check results" in capsys.readouterr().err
    assert gc.main([str(h100_scenario)]) == 2  # a scenario and nothing measured
    assert "nothing to compare" in capsys.readouterr().err
    (h100_scenario / "micro.json").write_text("{not json")
    assert gc.main([str(h100_scenario)]) == 2
    assert "micro.json: not JSON" in capsys.readouterr().err
    assert gc.main([]) == 2 and "usage" in capsys.readouterr().err
