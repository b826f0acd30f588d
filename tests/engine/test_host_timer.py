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


def test_the_trainers_metric_sync_is_host_time_that_grows_with_the_ranks():
    """training.metric_sync_states: each state a barrier, a zeros_like per rank and a list-form
    all_gather copied out per rank (torchmetrics' gather_all_tensors): 2 host ops per rank per
    state on top of two collectives' latencies; the step grows by it, the GPU idle."""
    from simfed.engine.run import trainer_sync_s
    from simfed.hardware import Hardware

    synced = {"runtime.host.sync_per_step": True}
    sync = {**synced, "training.host_reductions": 3, "training.metric_sync_states": 4}
    base, with_sync = _fsdp(**synced), _fsdp(**sync)
    scn = load_scenario(TINY, sync)
    hw = Hardware.from_spec(scn.cluster, scn.runtime)
    s = trainer_sync_s(scn, hw, scn.cluster.world)
    assert with_sync["step_time_s"] - base["step_time_s"] == pytest.approx(s)
    assert with_sync["phases_s"]["other"] - base["phases_s"]["other"] == pytest.approx(s)
    # per rank: two ops of runtime.host.eager_op_us per state (latencies grow more slowly)
    op_s = scn.runtime.host.eager_op_us * 1e-6
    small, large = trainer_sync_s(scn, hw, 16), trainer_sync_s(scn, hw, 1024)
    assert large - small >= 4 * 2 * (1024 - 16) * op_s
    assert large - small < 1.5 * 4 * 2 * (1024 - 16) * op_s
    assert trainer_sync_s(scn, hw, 1) == 0.0
    no_ops = load_scenario(TINY, {**sync, "runtime.host.eager_op_us": 0})
    assert trainer_sync_s(no_ops, hw, 1024) < small


def test_a_metric_sync_without_the_loss_read_is_one_line():
    with pytest.raises(SpecError) as exc:
        load_scenario(TINY, {"training.metric_sync_states": 4})
    msg = str(exc.value)
    assert "\n" not in msg and "training.metric_sync_states: 4" in msg
    assert "runtime.host.sync_per_step" in msg
