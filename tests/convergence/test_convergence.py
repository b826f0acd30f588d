"""The convergence model, its fit and time to target (torch-free).

Oracles: the model's limits (one group ignores K; rho_1 = 1 and K = 1 is one model on all the
groups' batches; a larger batch never learns slower per step; the floor is never crossed); the
fit recovers the parameters of curves the model itself generated and predicts held-out
configurations of them; time to target is the simulated step times summed over the predicted
steps; bad input is one line naming the key."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from simfed.convergence.fit import (
    critical_batch,
    crossing,
    fit_profile,
    fit_runs,
    holdout,
)
from simfed.convergence.model import PARAMS, RunShape, loss_curves
from simfed.engine import simulate
from simfed.spec import SpecError, load_scenario

from ..conftest import ROOT, SCENARIOS

# log P_c, alpha, log B_0, beta, rho_1, log kappa, floor
TRUE = np.array([math.log(40.0), 0.8, math.log(300.0), 0.7, 0.6, math.log(0.5), 1.4])
L0 = 5.5


def curve(shape, theta=TRUE):
    return loss_curves(theta, L0, shape)[0]


def test_one_group_ignores_k_and_rho1_k1_is_one_model_on_all_batches():
    one = RunShape(batch_tokens=128, steps=32, warmup_steps=3)
    assert np.array_equal(curve(one), curve(RunShape(batch_tokens=128, aggregate_every=8,
                                                     steps=32, warmup_steps=3)))
    theta = TRUE.copy()
    theta[PARAMS.index("fl_rho1")] = 1.0
    fl = RunShape(batch_tokens=128, groups=16, aggregate_every=1, steps=32, warmup_steps=3)
    big = RunShape(batch_tokens=128 * 16, steps=32, warmup_steps=3)
    np.testing.assert_allclose(curve(fl, theta), curve(big, theta), rtol=1e-12)


def test_larger_batches_and_shorter_periods_never_learn_slower_per_step():
    shapes = [RunShape(batch_tokens=b, steps=48, warmup_steps=4) for b in (64, 256, 1024)]
    c = [curve(s) for s in shapes]
    assert np.all(c[0] >= c[1] - 1e-12) and np.all(c[1] >= c[2] - 1e-12)
    fl = [curve(RunShape(batch_tokens=64, groups=32, aggregate_every=k, steps=48,
                         warmup_steps=4)) for k in (1, 4, 16)]
    assert np.all(fl[0] <= fl[1] + 1e-12) and np.all(fl[1] <= fl[2] + 1e-12)
    assert fl[2][-1] < c[0][-1]  # averaging still beats one group alone
    for x in c + fl:
        assert np.all(np.diff(x) <= 1e-12) and x.min() > TRUE[-1]


def synthetic_study(noise_sd=0.003, seeds=(0, 1)):
    """A study file whose curves the model itself made (plus seeded noise), on the shipped
    study's grid: FSDP batch sweep and FL+FSDP over G and K."""
    rng = np.random.default_rng(7)
    runs = []
    grid = [("fsdp", n, 0) for n in (1, 2, 4, 8, 16, 32, 64, 128)]
    grid += [("fl_fsdp", g, k) for g in (2, 8, 32, 128) for k in (1, 2, 8, 32)]
    for seed in seeds:
        for alg, n, k in grid:
            groups = n if alg == "fl_fsdp" else 1
            b = 4 if alg == "fl_fsdp" else 4 * n
            shape = RunShape(batch_tokens=b * 32, groups=groups, aggregate_every=k, steps=64,
                             warmup_steps=6)
            c = curve(shape)
            ev = list(range(0, 65, 8))
            loss = [float(c[s] + (rng.normal(0, noise_sd) if s else 0.0)) for s in ev]
            runs.append({"key": f"{alg}/n{n}/k{k}/lr0.0003", "seed": seed, "algorithm": alg,
                         "groups": groups, "batch_per_model": b, "seq_len": 32,
                         "aggregate_every": k or None, "lr": 3e-4, "steps": 64,
                         "warmup_steps": 6, "lr_schedule": "cosine", "optimizer": "adamw",
                         "eval_steps": ev, "eval_loss": loss, "train_loss": [], "noise": []})
    return {"schema": "realrun.convergence_study/1", "experiment": "model-made",
            "what": "curves of known parameters", "path": "<memory>",
            "model": {"name": "llama-tiny", "params": 108864, "vocab": 256, "layers": 2,
                      "hidden": 64},
            "data": {"source": "synthetic", "entropy_floor_nats": 1.3862943611198908,
                     "describe": "synthetic Markov source"},
            "recipe": {"paper_lr": 3e-4}, "ranks_per_group": 4, "micro_batch": 1,
            "runs": runs}


def test_fit_recovers_the_curves_and_predicts_held_out_configurations():
    study = synthetic_study()
    prof = fit_profile(study, hold_out=True)
    assert prof["rms_error"] < 0.006  # the noise is 0.003
    check = holdout(study)
    assert check["check_runs"] == 2 * (4 + 4 - 1 + 2)  # G = 32 or K = 2, FSDP at 16 and 64
    assert check["points"] >= 20
    assert check["median_abs_error"] < 0.03
    # and the fitted model predicts a far configuration of the true one
    x = np.array([prof["params"][p] for p in PARAMS])
    far = RunShape(batch_tokens=4 * 32, groups=64, aggregate_every=4, steps=64, warmup_steps=6)
    np.testing.assert_allclose(loss_curves(x, prof["loss_init"], far)[0], curve(far),
                               atol=0.02)


def test_critical_batch_recovers_s_min_and_e_min():
    """Runs whose loss falls linearly and crosses 4.0 after S = 12 + 3000 / B steps (B in
    tokens): the fit of (S/S_min - 1)(E/E_min - 1) = 1 gives S_min 12, E_min 3000."""
    study = synthetic_study(seeds=(0,))
    study["runs"] = [r for r in study["runs"] if r["algorithm"] == "fsdp"]
    for r in study["runs"]:
        b = r["batch_per_model"] * r["seq_len"]
        s_target = 12 + 3000 / b
        r["eval_loss"] = [L0 - (L0 - 4.0) * s / s_target for s in r["eval_steps"]]
    crit = critical_batch(study, targets=[4.0])
    (t,) = crit["targets"]
    assert t["points"] == 8
    assert t["s_min"] == pytest.approx(12.0, rel=1e-9)
    assert t["e_min_tokens"] == pytest.approx(3000.0, rel=1e-9)
    assert t["b_crit_tokens"] == pytest.approx(250.0, rel=1e-9)


def test_crossing_interpolates_between_evaluation_points():
    steps, loss = np.array([0, 8, 16]), np.array([5.0, 4.0, 3.0])
    assert crossing(steps, loss, 3.5) == pytest.approx(12.0)
    assert crossing(steps, loss, 2.0) == math.inf


def test_a_fit_with_too_few_points_names_the_numbers():
    runs = synthetic_study()["runs"][:2]
    with pytest.raises(SpecError, match=r"convergence fit: 16 evaluation points for 7 "
                                        r"parameters; need at least 21"):
        fit_runs(runs, L0, 1.38)


def scenario_with(profile, **conv):
    over = {"training.steps": 64, "convergence.model": "noise_progress",
            "convergence.profile": profile, "cluster.nodes": 8}
    over.update({f"convergence.{k}": v for k, v in conv.items()})
    return load_scenario(SCENARIOS / "convergence-tiny.yaml", over)


@pytest.fixture(scope="module")
def profile():
    return fit_profile(synthetic_study(seeds=(0,)), hold_out=False, draws=2)


def test_time_to_target_sums_the_simulated_step_times(profile):
    scn = scenario_with(profile, target_loss=5.0)
    out, _ = simulate(scn)
    conv = out["convergence"]
    assert conv["target_loss"] == 5.0 and conv["extrapolation"] == []
    for a in out["algorithms"]:
        s = a["steps_to_target"]
        assert s is not None and 0 < s <= 64
        # the first step where the (groups' mean) model is at the target
        assert a["convergence"]["loss_curve"][s] <= 5.0 < a["convergence"]["loss_curve"][s - 1]
        k = a["aggregate_every"]
        off_round = bool(k) and s % k != 0 and s < 64
        assert a["fedavg_to_reach_target"] == off_round
        # off a FedAvg round a federated run pays one more FedAvg to make that model
        extra = a["aggregation_per_event_s"] if off_round else 0.0
        assert a["time_to_target_s"] == pytest.approx(sum(a["step_times_s"][:s]) + extra)
        assert a["tokens_to_target"] == s * out["tokens_per_step"]
        lo, hi = a["time_to_target_interval_s"]
        assert lo <= hi
    first = min(out["algorithms"], key=lambda a: a["time_to_target_s"])
    assert conv["first_to_target"] == first["label"]
    again, _ = simulate(scn)
    assert json.dumps(again, sort_keys=True) == json.dumps(out, sort_keys=True)


def test_extrapolation_is_listed_never_silent(profile):
    scn = scenario_with(profile, target_loss=5.0)
    scn2 = load_scenario(SCENARIOS / "convergence-tiny.yaml", {
        "convergence.model": "noise_progress", "convergence.profile": profile,
        "convergence.target_loss": 5.0, "training.seq_len": 64, "training.lr": 1e-3,
        "algorithms.fl_fsdp.aggregate_every": 64})
    out, _ = simulate(scn2)
    text = " | ".join(out["convergence"]["extrapolation"])
    assert "groups 128" not in text  # 128 groups were fitted
    assert "K 64 outside the fitted 1..32" in text
    assert "sequence length 64 (fitted at 32)" in text
    assert "learning rate 0.001 (fitted at 0.0003)" in text
    assert simulate(scn)[0]["convergence"]["extrapolation"] == []


@pytest.mark.parametrize(("conv", "message"), [
    ({"target_loss": 1.0}, r"convergence.target_loss: 1.0000 nats \(perplexity 2.72\) is at "
                           r"or below the loss floor 1.3\d+"),
    ({"target_loss": 6.0}, r"convergence.target_loss: 6.0000 is not below the untrained loss "
                           r"5.5000"),
    ({"transfer": True, "target_loss": 5.0}, r"convergence.loss_floor: transfer needs"),
])
def test_bad_targets_are_one_line_naming_the_key(profile, conv, message):
    with pytest.raises(SpecError, match=message):
        simulate(scenario_with(profile, **conv))


def test_both_targets_or_no_profile_are_refused_when_the_scenario_loads(profile):
    with pytest.raises(SpecError, match=r"^convergence: give target_loss \(5\) or "
                                        r"target_perplexity \(100\), not both$"):
        scenario_with(profile, target_loss=5.0, target_perplexity=100)
    with pytest.raises(SpecError, match=r"^convergence.profile: required for model "
                                        r"noise_progress"):
        load_scenario(SCENARIOS / "convergence-tiny.yaml",
                      {"convergence.model": "noise_progress", "convergence.target_loss": 5.0})


def test_a_profile_for_another_model_is_refused_unless_transferred(profile):
    over = {"convergence.model": "noise_progress", "convergence.profile": profile,
            "convergence.target_perplexity": 200.0, "training.steps": 64}
    with pytest.raises(SpecError, match=r"convergence.profile: fitted for model llama-tiny "
                                        r"\(vocab 256\) but the scenario's model "
                                        r"llama3.1-8b has vocab 128256"):
        simulate(load_scenario(SCENARIOS / "512gpu.yaml", over))
    over.update({"convergence.transfer": True, "convergence.loss_floor": 2.0})
    out, _ = simulate(load_scenario(SCENARIOS / "512gpu.yaml", over))
    conv = out["convergence"]
    assert conv["loss_init"] == pytest.approx(math.log(128256))
    assert any("transferred" in e for e in conv["extrapolation"])
    assert any(e.startswith("model llama") for e in conv["extrapolation"])


def test_calibrate_cli_fits_a_study_file_and_run_uses_the_profile(tmp_path):
    study = synthetic_study(seeds=(0,))
    del study["path"]
    src = tmp_path / "study.json"
    src.write_text(json.dumps(study))
    prof = tmp_path / "p.yaml"
    env_cmd = [sys.executable, "-m", "simfed.cli"]
    res = subprocess.run([*env_cmd, "calibrate", "--convergence", str(src), "--out", str(prof),
                          "--draws", "2"],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr
    assert "held-out steps to target: median |error|" in res.stdout
    rep = json.loads(prof.with_suffix(".json").read_text())
    assert rep["holdout"]["median_abs_error"] < 0.05
    scn = tmp_path / "s.yaml"
    scn.write_text(f"include: {SCENARIOS / 'convergence-tiny.yaml'}\n"
                   f"convergence: {{model: noise_progress, target_loss: 5.0, "
                   f"profile: {{include: {prof}}}}}\n")
    res = subprocess.run([*env_cmd, "run", str(scn), "--set", "cluster.nodes=8"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env={"COLUMNS": "250", "PATH": ""})
    assert res.returncode == 0, res.stderr
    assert "time to eval perplexity 148.4:" in res.stdout
    bad = subprocess.run([*env_cmd, "calibrate", "--convergence", str(scn), "--out",
                          str(tmp_path / "q.yaml")], capture_output=True, text=True, cwd=ROOT,
                         timeout=60)
    assert bad.returncode == 2
    assert bad.stderr.strip().startswith(f"error: {scn}: not JSON")  # a scenario, not a study


def test_shipped_time_to_target_scenarios_say_first_and_flag_extrapolation():
    out, _ = simulate(load_scenario(SCENARIOS / "tiny-time-to-target.yaml"))
    conv = out["convergence"]
    assert conv["extrapolation"] == []  # inside the fitted range
    assert conv["first_to_target"] in [a["label"] for a in out["algorithms"]]
    big, _ = simulate(load_scenario(SCENARIOS / "512gpu-time-to-target.yaml"))
    extra = " | ".join(big["convergence"]["extrapolation"])
    assert "model size (non-embedding params) 6.98e+09 outside the fitted" in extra
    assert "sequence length 2048 outside the fitted 32..32" in extra
    assert big["convergence"]["loss_init"] == pytest.approx(math.log(128256))


def test_report_tables_compare_the_paper_claim_per_lr():
    from simfed.convergence.report import claim_table, grid_table

    study = synthetic_study(seeds=(0, 1))
    for r in study["runs"]:
        if r["key"] in ("fsdp/n128/k0/lr0.0003", "fl_fsdp/n128/k8/lr0.0003"):
            r2 = dict(r, key=r["key"].replace("lr0.0003", "lr0.001"), lr=1e-3,
                      eval_loss=[v - 0.5 for v in r["eval_loss"]])
            study["runs"].append(r2)
    lines = grid_table(study)
    assert any(line.startswith("| fl_fsdp/n128/k8/lr0.0003 | 4 | 128 |") for line in lines)
    claim = "\n".join(claim_table(study))
    assert "| 0.0003 |" in claim and "| 0.001 |" in claim
    assert "Each method at its best lr of the sweep: FSDP" in claim
    assert "(lr 0.001)" in claim


def test_a_sweep_over_groups_and_k_reports_time_to_target():
    from simfed.sweep import Axis, SweepSpec, run_sweep

    spec = SweepSpec(scenario=str(SCENARIOS / "tiny-time-to-target.yaml"), name="ttt",
                     axes=(Axis(keys=("cluster.nodes",), values=((8,), (32,))),
                           Axis(keys=("algorithms.fl_fsdp.aggregate_every",),
                                values=((1,), (8,)))))
    res = run_sweep(spec, jobs=1, progress=False)
    fsdp = [r for r in res.rows if r["name"] == "fsdp"]
    fl = [r for r in res.rows if r["name"] == "fl_fsdp"]
    assert len(fsdp) == len(fl) == 4
    assert all(r["steps_to_target"] and r["time_to_target_s"] > 0 for r in fsdp)
    # more groups: a larger synchronous batch per step, so FSDP needs fewer steps
    by_nodes = {r["params"]["cluster.nodes"]: r["steps_to_target"] for r in fsdp}
    assert by_nodes[32] < by_nodes[8]
    assert {r["params"]["algorithms.fl_fsdp.aggregate_every"] for r in fl} == {1, 8}
