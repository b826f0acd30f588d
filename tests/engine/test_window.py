"""Long runs from a window (simfed.engine.window): the rule against the exact simulation, and
results that are never NaN, Infinity or faster than the hardware."""

import math

import pytest

import simfed.engine.window as window
from simfed.engine import simulate
from simfed.spec import SpecError, load_scenario

from ..conftest import SCENARIOS


def _scn(steps, k=3):
    return load_scenario(SCENARIOS / "cpu4.yaml", {
        "training.steps": steps,
        "algorithms": [{"name": "fsdp"}, {"name": "fl_fsdp", "group_nodes": 1,
                                          "aggregate_every": k}]})


def test_window_sizes_follow_the_rule():
    w = window.STEP_WINDOW
    assert window.window_steps(w, 8) == w
    assert window.window_steps(w + 1, 0) == w
    assert window.window_steps(10**9, 7) == w // 7 * 7  # whole FedAvg periods
    assert window.window_steps(10**9, w + 5) == w  # K longer: the window's last step
    assert window.window_steps(10**9, 8, layers=255) == 8  # deep: 3072 // 256 = 12 -> K
    assert window.window_steps(10**9, 8, layers=1023) == 4  # K longer than the window
    assert window.rounds(10, 3) == 4 and window.rounds(9, 3) == 3 and window.rounds(9, 0) == 0


def test_windowed_run_matches_the_exact_one(monkeypatch):
    """40 steps with K = 3, exactly and from a 12-step window (4 periods): the same step times
    to within 1% and the same FedAvg rounds (the window's extra last-step round re-weighted)."""
    exact, _ = simulate(_scn(40))
    monkeypatch.setattr(window, "STEP_WINDOW", 12)
    monkeypatch.setattr(window, "MIN_WINDOW", 4)
    est, _ = simulate(_scn(40))
    for e, x in zip(exact["algorithms"], est["algorithms"], strict=True):
        assert x["steps_simulated"] == 12 and x["steps"] == 40
        assert x["aggregations"] == e["aggregations"]
        assert x["step_time_s"] == pytest.approx(e["step_time_s"], rel=0.01)
        assert x["total_time_s"] == pytest.approx(e["total_time_s"], rel=0.01)
    assert "window" in est["extrapolation"]


def test_a_trillion_steps_cost_a_window():
    out, _ = simulate(_scn(10**12, k=8))
    fl = out["algorithms"][1]
    assert fl["steps"] == 10**12 and fl["steps_simulated"] == window.STEP_WINDOW
    assert fl["aggregations"] == 10**12 // 8
    assert all(math.isfinite(a["step_time_s"]) for a in out["algorithms"])


def test_results_that_are_not_finite_or_beat_the_peak_are_refused():
    good = {"algorithms": [{"label": "FSDP", "mfu": 0.4, "step_time_s": 1.0}]}
    assert window.check_result(good) is good
    with pytest.raises(SpecError, match=r"FSDP: the simulated step_time_s is not a finite"):
        window.check_result({"algorithms": [{"label": "FSDP", "step_time_s": math.inf}]})
    with pytest.raises(SpecError, match=r"MFU is 1.7 > 1"):
        window.check_result({"algorithms": [{"label": "FSDP", "mfu": 1.7}]})


def test_per_rank_stragglers_are_refused_past_their_cost():
    """The per-rank reference simulates every distinct rank: bounded up front, with the sum."""
    big = load_scenario(SCENARIOS / "512gpu.yaml", {
        "stragglers": {"method": "per_rank", "jitter": {"sigma": 0.05}}})
    # fsdp 1 actor (one shard group), hsdp / fl_fsdp / fl_hsdp 128 (one per node)
    with pytest.raises(SpecError, match=r"385 actors over 4 algorithms x 33 units x 64 steps"):
        simulate(big)
    window.check_cost(big, ["fsdp"])  # one shard group: one actor
    fast = load_scenario(SCENARIOS / "512gpu.yaml", {
        "cluster.nodes": 64, "stragglers": {"method": "order_stats", "jitter": {"sigma": 0.05}}})
    window.check_cost(fast, None)  # the default method: one timeline, no bound needed
