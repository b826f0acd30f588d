"""`simfed run`'s "how sure" lines: the check set's claim, widened by what the check set says
each factor the validated runs do not cover costs (simfed.calibration.envelope)."""

from __future__ import annotations

import math

import pytest
from click.testing import CliRunner

from simfed.calibration.envelope import (
    for_run,
    memory_lines,
    outside,
    published_envelope,
    scenario_framework,
    widened,
)
from simfed.calibration.published import DEFAULT_DIR, load_cases, load_claims
from simfed.cli import main
from simfed.spec import load_scenario


def test_the_envelope_is_the_published_runs_range_and_their_claims():
    env = published_envelope()
    gpus = [c["gpus"] for c in load_cases()]
    assert env["ranges"]["gpus"] == [min(gpus), max(gpus)]
    assert env["cases"] == len(gpus)
    assert env["claims"] == load_claims()
    assert set(env["gpus_families"]) == {"A100", "H100", "H200"}
    assert set(env["frameworks"]) == {"pytorch-fsdp1", "pytorch-fsdp2", "jax-xla",
                                      "deepspeed-zero3"}


def _small_case():
    """A validated run under the GPU counts of the claims' first `by_gpus` band."""
    first = published_envelope()["claims"]["by_gpus"][0]["from"]
    return next(c for c in load_cases() if c["gpus"] < first and not c.get("overrides"))


def test_a_validated_run_gets_the_check_sets_bound():
    env = published_envelope()
    scn = load_scenario(DEFAULT_DIR / _small_case()["scenario"])
    bound, factors = widened(scn, env)
    assert factors == [] and outside(scn, env) == []
    assert bound == env["claims"]["p90_abs_error"]


def test_a_run_at_scale_gets_the_bound_of_the_check_runs_at_its_gpu_count():
    """From the claims' first `by_gpus` band up, a scenario gets the bound of the check runs at
    or above its band's GPU count where that is wider than the whole check set's."""
    env = published_envelope()
    c = env["claims"]
    for band in c["by_gpus"]:
        assert band["p90_abs_error"] > c["p90_abs_error"]  # each wider, so each applies
        scn = load_scenario("scenarios/h100-1024.yaml", {"cluster.nodes": band["from"] // 8})
        bound, factors = widened(scn, env)
        assert [t.split(":")[0] for t, _ in factors] == [f"GPUs {band['from']:,}"]
        assert f"the {band['cases']} check runs at {band['from']:,} GPUs or more" in factors[0][0]
        assert bound == pytest.approx(band["p90_abs_error"])


def test_each_uncovered_factor_widens_by_the_check_sets_measure_of_it():
    env = published_envelope()
    w = env["claims"]["widen"]
    top = env["ranges"]["gpus"][1]
    # 16,384 GPUs: log2(16384 / top) doublings beyond the validated GPU counts. FSDP2 is
    # validated (torchtitan's runs): not widened; an envelope without those runs widens it
    scn = load_scenario("scenarios/h100-1024.yaml", {"cluster.nodes": 2048,
                                                      "training.fsdp_version": 2})
    assert scenario_framework(scn) == "pytorch-fsdp2"
    assert [t.split(" ")[0] for t, _ in widened(scn, env)[1]] == ["GPUs", "GPUs"]
    env = {**env, "frameworks": [f for f in env["frameworks"] if f != "pytorch-fsdp2"]}
    bound, factors = widened(scn, env)

    doublings = math.log2(16384 / top)
    assert [t.split(" ")[0] for t, _ in factors] == ["GPUs", "GPUs", "framework"]
    at_scale = env["claims"]["by_gpus"][-1]["p90_abs_error"] - env["claims"]["p90_abs_error"]
    assert factors[0][1] == pytest.approx(at_scale)  # the check runs at the most GPUs
    assert factors[1][1] == pytest.approx(doublings * w["per_gpu_doubling"])
    assert factors[2][1] == w["framework"]
    assert bound == pytest.approx(env["claims"]["p90_abs_error"] + sum(x for _, x in factors))
    # a GPU family no validated run had: the check set's largest GPU-type distance
    b200 = load_scenario("scenarios/h100-1024.yaml", {"cluster.node.gpu.name": "B200",
                                                      "cluster.nodes": 4,
                                                      "algorithms": [{"name": "fsdp"}]})
    bound, factors = widened(b200, env)
    assert [t.split(" ")[0] for t, _ in factors] == ["GPU"] and factors[0][1] == w["gpu_type"]
    assert "validated: A100, H100" in factors[0][0]
    assert not any(x.startswith("GPU") for x in outside(b200, env))
    # memory: a run whose peak leaves less headroom than any validated run (or does not fit)
    out = {"algorithms": [{"peak_memory_bytes": 79, "memory_capacity_bytes": 80}]}
    one = load_scenario(DEFAULT_DIR / _small_case()["scenario"])
    bound, factors = widened(one, env, out)
    assert [t.split(":")[0] for t, _ in factors] == ["memory headroom"]
    assert bound == pytest.approx(env["claims"]["p90_abs_error"] + w["memory_headroom"])


def test_other_settings_are_named_not_widened():
    env = published_envelope()
    lines = outside(load_scenario("scenarios/512gpu.yaml"), env)
    assert any(x.startswith("runtime.host.debug_checks detail") for x in lines)
    # Modalities' Leonardo runs (validation/published) ran on its Dragonfly+: not outside
    assert not any(x.startswith("cluster.fabric.topology") for x in lines)
    assert not any(x.startswith("GPUs") for x in lines)  # GPUs widen instead
    f8 = [x for x in outside(load_scenario("scenarios/h100-8b-float8.yaml",
                                           {"training.float8": "tensorwise"}), env)
          if x.startswith("training.float8")]
    assert f8 == []  # the scale studies ran float8 (MaxText, Paxml FP8)


def test_only_the_kernel_model_without_the_repository_folder_says_nothing(tmp_path):
    assert for_run(load_scenario("scenarios/cpu4.yaml")) == []  # constant compute model
    assert for_run(load_scenario("scenarios/h100-1024.yaml"), tmp_path) == []
    (tmp_path / "cases.yaml").write_text("cases:\n  - {name: x}\n")  # broken: still nothing
    assert for_run(load_scenario("scenarios/h100-1024.yaml"), tmp_path) == []
    c = load_claims()
    lines = for_run(load_scenario("scenarios/h100-1024.yaml", {"cluster.nodes": 2048}))
    assert lines[0].startswith(f"how sure: on {c['check_cases']} held-out published runs "
                               "(the check set)")
    assert f"within {100 * c['p90_abs_error']:.1f}% for 9 in 10" in lines[0]
    assert "widened for:" in lines[0] and lines[1].startswith("  GPUs 16,384")


def test_an_algorithm_that_leans_on_its_collectives_gets_its_bands_bound():
    """Each algorithm whose communication share reaches a band with a wider bound than the check
    set's gets a line with that band's runs, median and bound (plus the scenario's widenings);
    one under the lowest band gets none."""
    env = published_envelope()
    bands = env["claims"]["by_comm_share"]
    scn = load_scenario("scenarios/512gpu.yaml")
    node = scn.cluster.node
    per_gpu_nic = node.nics.bw_Gbps * 1e9 / 8 * node.nics.count / node.gpus

    def alg(label, share):
        return {"label": label, "compute_s": 1.0,
                "bytes_by_link_per_gpu": {"inter_node": share * per_gpu_nic, "nvlink": 0.0}}

    top = bands[-1]
    out = {"algorithms": [alg("FSDP", top["from"] + 0.057), alg("FL+FSDP", 0.05)]}
    lines = for_run(scn, out=out)
    mine = [x for x in lines if x.startswith("  FSDP: its collectives")]
    # the share shown cut, not rounded, to 0.01: never above the band it is in
    assert len(mine) == 1 and f"take {top['from'] + 0.05:.2f}x its compute time," in mine[0]
    assert (f"the {top['cases']} at {top['from']:.1f}x or more "
            f"{100 * top['median_abs_error']:.1f}% median" in mine[0])
    bound, factors = widened(scn, env, out)
    # the GPU-count band is a floor the communication band replaces, not adds to
    at_scale = sum(x for t, x in factors if t.startswith("GPUs 512:"))
    assert at_scale > 0
    extra = bound - env["claims"]["p90_abs_error"] - at_scale
    assert f"within {100 * (top['p90_abs_error'] + extra):.1f}% for 9 in 10" in mine[0]
    assert not any(x.startswith("  FL+FSDP: its collectives") for x in lines)


def test_run_prints_it_unless_quiet():
    res = CliRunner().invoke(main, ["run", "scenarios/h100-1024.yaml", "-a", "fsdp",
                                    "--set", "cluster.nodes=4", "--set", "training.steps=2",
                                    "--set", "algorithms.fl_hsdp.group_nodes=4"])
    assert res.exit_code == 0, res.output
    assert "how sure:" in res.output
    assert "this scenario lies within the validated runs" in res.output
    assert "--robustness: does the winner hold" in res.output
    quiet = CliRunner().invoke(main, ["run", "scenarios/h100-1024.yaml", "-a", "fsdp", "-q",
                                      "--set", "cluster.nodes=8", "--set", "training.steps=2"])
    assert "how sure:" not in quiet.output


def test_a_comparison_with_hybrid_shard_states_the_published_pairs_error():
    """A run comparing a replicating HSDP with another algorithm gets the published HYBRID /
    FULL pairs' ratio error at its band (cases.yaml hybrid_over_full); a run without one, or of
    one algorithm, does not."""
    from simfed.calibration.envelope import hybrid_line
    from simfed.calibration.published import load_hybrid_over_full

    h = load_hybrid_over_full()
    out = {"algorithms": [
        {"label": "FSDP", "plan": {"replicate": 1, "shard": 512}},
        {"label": "HSDP", "plan": {"replicate": 128, "shard": 4}},      # spans 512 GPUs
        {"label": "FL+HSDP", "plan": {"replicate": 8, "shard": 4}}]}    # a copy spans 32
    lines = hybrid_line(out)
    assert [x.split()[0] for x in lines] == ["HSDP", "FL+HSDP"]
    big, small = h["at_scale"], h["below"]
    assert f"on {big['pairs']} published" in lines[0]
    assert f"+{100 * big['over']:.1f}%" in lines[0] and f"-{100 * big['under']:.1f}%" in lines[0]
    assert f"on {small['pairs']} published" in lines[1]
    assert hybrid_line({"algorithms": out["algorithms"][:1]}) == []
    assert hybrid_line({"algorithms": [out["algorithms"][0], {"label": "FL+FSDP", "plan": {
        "replicate": 1, "shard": 4}}]}) == []
    assert hybrid_line(None) == []


def test_a_peak_nearer_capacity_than_the_memory_error_is_not_settled():
    """An algorithm whose predicted peak lies within the check runs' worst peak-memory error of
    its GPU's capacity gets a line saying whether it fits is not settled; one further away,
    none."""
    env = published_envelope()
    worst = env["claims"]["memory_worst_abs_error"]
    cap = 80 * 2**30
    algs = [{"label": "near", "peak_memory_bytes": cap * (1 - worst / 2),
             "memory_capacity_bytes": cap},
            {"label": "over", "peak_memory_bytes": cap * (1 + worst / 2),
             "memory_capacity_bytes": cap},
            {"label": "far", "peak_memory_bytes": cap * (1 - 2 * worst),
             "memory_capacity_bytes": cap}]
    lines = memory_lines({"algorithms": algs}, env)
    assert len(lines) == 2
    assert lines[0].startswith("  near: predicted peak memory") and "it may not fit" in lines[0]
    assert lines[1].startswith("  over:") and lines[1].endswith("it may fit")
    n = env["claims"]["memory_cases"]
    assert f"the {n} check runs whose source gives their peak were within " \
           f"{100 * worst:.1f}%" in lines[0]
    assert memory_lines({"algorithms": algs}, {"claims": {}}) == []
