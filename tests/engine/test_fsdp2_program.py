"""FSDP2's step program (simfed.engine.program, `training.fsdp_version: 2`): all-gathers limited
by CUDA events instead of FSDP1's CPU rate limiter, torchtitan's last decoder layer kept
unsharded after forward, and the split eager RMSNorm / RoPE keys. Toy timelines on
tests/fixtures/tiny2x2.yaml (round numbers, no latencies)."""

from __future__ import annotations

import pytest

from simfed.compute import ComputeModel
from simfed.engine import simulate_algorithm
from simfed.engine.program import BWD, FWD, OpKind, StepTimes, build_program
from simfed.hardware import Hardware
from simfed.spec import SpecError, load_scenario
from simfed.spec.scenario import AlgorithmSpec, HostRuntime

from ..conftest import ROOT

TINY = ROOT / "tests" / "fixtures" / "tiny2x2.yaml"
RAIL = 1.25e9  # bytes/s per rail of the toy cluster


def _times(layers: int = 6) -> StepTimes:
    n = layers + 1
    return StepTimes(forward_s=(1.0,) * n, backward_s=(2.0,) * n, unit_nbytes=(100,) * n,
                     optimizer_s=0.5, shard=4, replicate=1, groups=1, shard_params=50)


def _program(fsdp_version: int, **alg):
    spec = AlgorithmSpec(name="fsdp", **{"forward_prefetch": True, "backward_prefetch": "pre",
                                         **alg})
    return build_program(spec, _times(), HostRuntime(sync_per_phase=False,
                                                     step_overhead_ms=0.0),
                         1e-3, aggregate=False, fsdp_version=fsdp_version)


def _gathers(prog, phase):
    return {o.unit: o for o in prog.ops if o.collective == "all_gather" and o.phase == phase}


def _compute(prog, phase):
    return {o.unit: o for o in prog.ops if o.kind is OpKind.COMPUTE and o.phase == phase
            and o.unit > 0}


def test_fsdp2_all_gathers_wait_on_copy_out_events_not_on_the_host():
    """FSDP1 (limit_all_gathers) makes the host wait; FSDP2 makes the all-gather streams wait:
    layer u's forward all-gather for the op before `forward u-2` (unit u-2's copy-out), its
    backward all-gather for the op before `backward u+1`."""
    v1, v2 = _program(1), _program(2)
    assert any(o.host_waits >= 0 for o in v1.ops)
    assert all(o.host_waits < 0 for o in v2.ops)
    fwd, cf = _gathers(v2, FWD), _compute(v2, FWD)
    for u, ag in fwd.items():
        if u <= 3:  # nothing before forward u1 in this step (unit u-2 is u1 or the root)
            assert ag.deps == ()
        else:
            assert ag.deps == (cf[u - 3].idx,)
    bwd, cb = _gathers(v2, BWD), _compute(v2, BWD)
    for u, ag in bwd.items():
        # the first backward gather (layer 6) waits for the last forward copy-out (layer 6's
        # forward: the op before it is forward u5); the others for layer u+1's copy-out
        want = cf[5] if u == 6 else cb[u + 2] if u + 2 <= 6 else None
        if u == 5:  # the op before backward u6 is the head's backward
            want = next(o for o in v2.ops if o.name == "backward root (head)")
        assert ag.deps == (want.idx,)
    # FSDP1's programs are not touched by the FSDP2 rule
    assert all(not o.deps for o in v1.ops if o.collective == "all_gather")


def test_keeping_the_last_layer_drops_its_backward_all_gather():
    keep = _program(2, reshard_last_layer_after_forward=False)
    plain = _program(2)
    assert 6 in _gathers(plain, BWD) and 6 not in _gathers(keep, BWD)
    assert _compute(keep, FWD)[6].free_unit == -1  # not freed after its forward ...
    assert _compute(keep, BWD)[6].free_unit == 6  # ... but after its backward
    assert _compute(keep, FWD)[5].free_unit == 5
    # layer 5's all-gather, prefetched at layer 6's pre-backward, has no copy-out of layer 6
    # to wait for: it waits for the last forward copy-out (layer 6's forward, after u5's)
    assert _gathers(keep, BWD)[5].deps == (_compute(keep, FWD)[5].idx,)
    assert _gathers(keep, BWD)[4].deps == (_compute(keep, BWD)[6].idx,)


def _run(**over):
    scn = load_scenario(TINY, {"training.fsdp_version": 2, **over})
    return simulate_algorithm(scn, scn.algorithm("fsdp"), trace=True, trace_steps=1)


def test_fsdp2_forward_has_no_host_bubble_where_fsdp1_waits():
    """Compute-bound, forward prefetch on, 0.1 ms to launch a unit: FSDP1's host waits for the
    buffer two all-gathers back to be freed before it issues the next forward, so each layer's
    forward starts a launch after the previous one ends; FSDP2's event waits leave the host
    ahead and the forwards back to back."""
    over = {"model.layers": 6, "cluster.node.nics.bw_Gbps": 4000,
            "runtime.compute.launch_us_per_unit": 100,
            "algorithms.fsdp.forward_prefetch": True,
            "algorithms.fsdp.limit_all_gathers": True}
    v1, v2 = _run(**over, **{"training.fsdp_version": 1}), _run(**over)

    def gaps(run):
        sp = {s.name: s for s in run.spans if s.step == 0 and s.cat != "comm"}
        return [sp[f"forward u{u + 1}"].start_s - sp[f"forward u{u}"].end_s
                for u in range(2, 6)]

    scn = load_scenario(TINY, over)
    hw = Hardware.from_spec(scn.cluster, scn.runtime)
    cm = ComputeModel(hw=hw, rt=scn.runtime.compute, tokens_per_gpu=256)
    assert cm.forward_s(scn.model.units(128)[1]) > 1e-4  # compute outlasts a launch
    assert gaps(v2) == pytest.approx([0.0] * 4, abs=1e-12)
    # FSDP1: before forward u3..u5 the host prefetches u4..u6 and waits; nothing to prefetch
    # before the last layer's forward
    assert gaps(v1) == pytest.approx([1e-4, 1e-4, 1e-4, 0.0], rel=1e-9, abs=1e-12)
    assert v2.result["step_time_s"] < v1.result["step_time_s"]


def test_fsdp2_keeps_three_layers_in_flight_in_forward():
    """Gathers that outrun compute: FSDP2 gathers layer u while layer u-2 computes, so at most
    the root and three layers are unsharded in forward (FSDP1's limiter: two)."""
    fast = {"model.layers": 6, "cluster.node.nics.bw_Gbps": 4000,
            "algorithms.fsdp.limit_all_gathers": True}
    scn = load_scenario(TINY, fast)
    S = [u.nbytes for u in scn.model.units(scn.training.seq_len)]
    v2 = _run(**fast).result["memory_bytes"]["unsharded"]
    v1 = _run(**fast, **{"training.fsdp_version": 1}).result["memory_bytes"]["unsharded"]
    largest = max(S)  # one gradient buffer, counted as the largest unit
    assert v2 == pytest.approx(S[0] + 3 * S[1] + largest)
    assert v1 == pytest.approx(S[0] + 2 * S[1] + largest)


def test_keeping_the_last_layer_saves_one_all_gather_where_collectives_block():
    """On a rank whose collectives block it (gloo on CPU) the kept layer saves its backward
    all-gather's full time; on a GPU it hid behind the head's backward."""
    cpu = {"runtime.comm.overlap_compute": False}
    keep = {"algorithms.fsdp.reshard_last_layer_after_forward": False}
    scn = load_scenario(TINY)
    S = [u.nbytes for u in scn.model.units(scn.training.seq_len)]
    ag = 0.375 * S[2] / RAIL  # 3/8 of a layer's bytes over one rail
    delta = (_run(**cpu).result["step_time_s"]
             - _run(**cpu, **keep).result["step_time_s"])
    assert delta == pytest.approx(ag, rel=1e-9)
    names = [s.name for s in _run(**keep).spans if s.cat == "comm"]
    assert names.count("all_gather u2") == 1 and names.count("all_gather u1") == 2


def _cm(**kw) -> ComputeModel:
    scn = load_scenario(TINY, {"runtime.compute.model": "kernels"})
    hw = Hardware.from_spec(scn.cluster, scn.runtime)
    return ComputeModel(hw=hw, rt=scn.runtime.compute, tokens_per_gpu=256, model=scn.model,
                        seq_len=128, fsdp_version=2, **kw), scn.model.units(128)


def test_the_kept_layer_has_no_backward_copy_out():
    cm, units = _cm(keep_last_layer=True)
    names = [[k.name for k in cm.unit_kernels(u, "backward")] for u in units]
    assert "fsdp2 all-gather copy-out" in names[1]
    assert "fsdp2 all-gather copy-out" not in names[2]  # the last of two layers
    assert "fsdp2 all-gather copy-out" not in names[0]  # the root stays gathered
    plain, _ = _cm()
    assert cm.backward_s(units[2]) < plain.backward_s(units[2])
    assert cm.backward_s(units[1]) == plain.backward_s(units[1])
    assert cm.forward_s(units[2]) == plain.forward_s(units[2])


@pytest.mark.parametrize("norm, rope", [("fused", "composite"), ("composite", "fused")])
def test_eager_norm_and_rope_are_set_apart(norm, rope):
    """torchtitan since April 2025 runs nn.RMSNorm (one fused kernel) with its composite RoPE:
    each key sets its own kernel's bytes; eager_ops still sets both."""
    cm, units = _cm(eager_ops="fused", eager_norm=norm, eager_rope=rope)
    p, t, d, kv = 2, 256, 256, 256
    ks = {k.name: k for k in cm.unit_kernels(units[1], "forward")}
    assert ks["rmsnorm x2"].nbytes == 2 * t * d * (2 * p if norm == "fused" else 28 + 4 * p)
    assert ks["rope q,k"].nbytes == t * (d + kv) * (2 * p if rope == "fused" else 16 + 2 * p)
    both, _ = _cm(eager_ops=norm)
    same = {k.name: k for k in both.unit_kernels(units[1], "forward")}
    assert same["rmsnorm x2"].nbytes == ks["rmsnorm x2"].nbytes


def test_the_new_keys_are_checked():
    with pytest.raises(SpecError, match="eager_rope"):
        load_scenario(TINY, {"training.eager_rope": "triton"})
    with pytest.raises(SpecError, match="reshard_last_layer_after_forward"):
        load_scenario(TINY, {"algorithms.fsdp.reshard_last_layer_after_forward": "maybe"})
    scn = load_scenario(TINY, {"training.eager_ops": "composite", "training.eager_norm": "fused"})
    assert (scn.training.norm_impl, scn.training.rope_impl) == ("fused", "composite")
