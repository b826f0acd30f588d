"""`simfed run`'s "how sure" lines: the published validation's claim, and what of a scenario the
published runs do not cover (simfed.calibration.envelope)."""

from __future__ import annotations

import yaml
from click.testing import CliRunner

from simfed.calibration.envelope import for_run, outside, published_envelope
from simfed.calibration.published import DEFAULT_DIR, load_cases
from simfed.cli import main
from simfed.spec import load_scenario


def test_the_envelope_is_the_published_runs_range_and_their_claims():
    env = published_envelope()
    gpus = [c["gpus"] for c in load_cases()]
    assert env["ranges"]["gpus"] == [min(gpus), max(gpus)]
    assert env["cases"] == len(gpus)
    claims = yaml.safe_load((DEFAULT_DIR / "cases.yaml").read_text())["claims"]
    assert env["claims"] == claims
    assert set(env["gpus_families"]) == {"A100", "H100"}


def test_a_published_run_lies_inside_and_the_paper_scenario_outside():
    env = published_envelope()
    case = load_cases()[0]
    assert outside(load_scenario(DEFAULT_DIR / case["scenario"]), env) == []
    lines = outside(load_scenario("scenarios/512gpu.yaml"), env)
    # 512 GPUs against at most 128 published: two doublings; the paper's debug checks and
    # Dragonfly+ fabric no published run had
    top = env["ranges"]["gpus"][1]
    assert top == 128
    assert any(x.startswith("GPUs 512 (runs: 8..128, 2.0 doublings out)") for x in lines)
    assert any(x.startswith("runtime.host.debug_checks detail") for x in lines)
    assert any(x.startswith("cluster.fabric.topology dragonfly_plus") for x in lines)


def test_float8_is_flagged_as_checked_only_by_speedups():
    scn = load_scenario("scenarios/h100-8b-float8.yaml", {"training.float8": "tensorwise"})
    lines = outside(scn, published_envelope())
    f8 = [x for x in lines if x.startswith("training.float8 tensorwise")]
    assert f8 and "speedups.yaml" in f8[0]
    # compile is in the published runs (fms-fsdp's were compiled): not flagged
    assert not any(x.startswith("training.compile") for x in lines)


def test_only_the_kernel_model_without_the_repository_folder_says_nothing(tmp_path):
    assert for_run(load_scenario("scenarios/cpu4.yaml")) == []  # constant compute model
    assert for_run(load_scenario("scenarios/h100-1024.yaml"), tmp_path) == []
    (tmp_path / "cases.yaml").write_text("cases:\n  - {name: x}\n")  # broken: still nothing
    assert for_run(load_scenario("scenarios/h100-1024.yaml"), tmp_path) == []
    lines = for_run(load_scenario("scenarios/h100-1024.yaml"))
    assert lines[0].startswith("how sure: on 26 published FSDP runs")
    assert "GPUs 1,024" in lines[1]


def test_run_prints_it_unless_quiet():
    res = CliRunner().invoke(main, ["run", "scenarios/h100-1024.yaml", "-a", "fsdp",
                                    "--set", "cluster.nodes=8", "--set", "training.steps=2"])
    assert res.exit_code == 0, res.output
    assert "how sure:" in res.output
    assert "this scenario lies within their range" in res.output
    assert "--robustness: does the winner hold" in res.output
    quiet = CliRunner().invoke(main, ["run", "scenarios/h100-1024.yaml", "-a", "fsdp", "-q",
                                      "--set", "cluster.nodes=8", "--set", "training.steps=2"])
    assert "how sure:" not in quiet.output
