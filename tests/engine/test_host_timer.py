"""A trainer's host syncs and its throughput timer (runtime.host.sync_per_step,
sync_before_optimizer; training.throughput_timer): toy timelines on tests/fixtures/tiny2x2.yaml
(round numbers, no latencies)."""

from __future__ import annotations

import pytest

from simfed.engine import simulate
from simfed.spec import SpecError, load_scenario

from ..conftest import ROOT

TINY = ROOT / "tests" / "fixtures" / "tiny2x2.yaml"
HOST_MS = 5.0


def _fsdp(**sets):
    scn = load_scenario(TINY, {"runtime.host.step_overhead_ms": HOST_MS, **sets})
    out, _ = simulate(scn, algorithms=["fsdp"])
    return out["algorithms"][0]


def test_a_sync_per_step_exposes_the_next_steps_host_work():
    """Running ahead, the host does a step's work (data, logging) while the GPU finishes the
    last one; waiting for the GPU at each step's end, it does it while the GPU idles."""
    ahead, synced = _fsdp(), _fsdp(**{"runtime.host.sync_per_step": True})
    assert ahead["phases_s"]["other"] < HOST_MS * 1e-3
    assert synced["phases_s"]["other"] == pytest.approx(HOST_MS * 1e-3)
    assert synced["step_time_s"] - ahead["step_time_s"] == pytest.approx(
        synced["phases_s"]["other"] - ahead["phases_s"]["other"])


def test_a_host_call_timer_leaves_out_the_gpu_work_queued_at_the_calls_return():
    """The host reads the gradient norm before the optimizer step, then issues it and returns:
    the timed interval is each step but its optimizer; the throughput is over that interval."""
    r = _fsdp(**{"runtime.host.sync_per_step": True, "runtime.host.sync_before_optimizer": True,
                 "training.throughput_timer": "host_call"})
    assert r["timed_step_s"] == pytest.approx(r["step_time_s"] - r["phases_s"]["optimizer"])
    assert r["timed_tokens_per_s_per_gpu"] == pytest.approx(
        r["tokens_per_s_per_gpu"] * r["step_time_s"] / r["timed_step_s"])
    assert "timed_step_s" not in _fsdp(**{"runtime.host.sync_per_step": True})


def test_the_default_is_the_step_and_the_same_timeline():
    base = _fsdp()
    timed = _fsdp(**{"training.throughput_timer": "host_call"})
    assert timed["step_time_s"] == base["step_time_s"]
    assert timed["timed_step_s"] > 0


def test_a_host_call_with_nothing_to_time_is_one_line():
    scn = load_scenario(TINY, {"training.throughput_timer": "host_call"})
    with pytest.raises(SpecError) as exc:
        simulate(scn, algorithms=["fsdp"])
    assert "\n" not in str(exc.value) and "training.throughput_timer" in str(exc.value)
