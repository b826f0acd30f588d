"""The per-operator compute model against closed forms: GEMM tile/wave quantisation, memory-bound
kernels at HBM bandwidth, attention FLOPs, recompute by checkpointing policy, the fallback."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from simfed.compute import ComputeModel
from simfed.hardware import Hardware
from simfed.spec.loader import scenario_from_dict
from simfed.spec.model import ModelSpec
from simfed.spec.scenario import ComputeRuntime, TrainingSpec


def _hw(sms: int = 108) -> Hardware:
    scn = scenario_from_dict({
        "cluster": {"nodes": 1, "node": {
            "gpus": 8, "gpu": {"peak_tflops": 312, "memory_GiB": 80, "hbm_bw_GBps": 2000,
                               "sms": sms},
            "nvlink": {"bw_GBps": 300}, "nics": {"count": 8, "bw_Gbps": 200}}},
        "model": {"layers": 2, "hidden": 256, "ffn_hidden": 512, "heads": 4, "kv_heads": 4,
                  "vocab": 1000},
        "training": {"seq_len": 128, "micro_batch": 1, "steps": 1},
        "algorithms": [{"name": "fsdp"}]})
    return Hardware.from_spec(scn.cluster, scn.runtime)


RT = ComputeRuntime(model="kernels", gemm_efficiency=0.8, gemm_tiles=((128, 128, 1.0),),
                    attention_efficiency_forward=0.5, attention_efficiency_backward=0.4,
                    hbm_efficiency=0.8, kernel_gap_us=0.0)
MODEL = ModelSpec(layers=4, hidden=4096, ffn_hidden=11008, heads=32, kv_heads=8, vocab=32000)


def _cm(**kw) -> ComputeModel:
    return ComputeModel(hw=_hw(), rt=kw.pop("rt", RT), tokens_per_gpu=kw.pop("tokens", 8192),
                        model=MODEL, seq_len=4096, **kw)


def test_gemm_efficiency_is_tile_times_wave_quantisation():
    cm = _cm()
    # 108 SMs, 128x128 tiles: 1536 x 1536 = 144 tiles -> 2 waves of 108: 144/216 busy
    assert cm.gemm_efficiency(1536, 1536, 4096) == pytest.approx(0.8 * 144 / 216)
    # 100 x 128: one partly filled tile row (100/128), 1 tile in 1 wave of 108
    assert cm.gemm_efficiency(100, 128, 4096) == pytest.approx(0.8 * (100 / 128) * (1 / 108))
    # a GEMM of exactly 108 full tiles wastes nothing
    assert cm.gemm_efficiency(128 * 108, 128, 4096) == pytest.approx(0.8)


def test_gemm_time_is_the_slower_of_flops_and_bytes():
    cm = _cm()
    k = cm.gemm("g", 128 * 108, 1024, 4096)  # 864 tiles = 8 full waves: compute bound
    assert k.time_s == pytest.approx(2 * 128 * 108 * 1024 * 4096 / (312e12 * 0.8))
    assert k.nbytes / (2000e9 * 0.8) < k.time_s
    skinny = cm.gemm("s", 1, 128 * 108, 4096)  # a matrix-vector product: HBM bound
    assert skinny.time_s == pytest.approx(skinny.nbytes / (2000e9 * 0.8))


def test_layer_kernels_add_up_with_gaps_and_backward_doubles_the_gemms():
    cm = _cm()
    unit = MODEL.units(4096)[1]
    fwd = cm.unit_kernels(unit, "forward")
    bwd = cm.unit_kernels(unit, "backward")
    gemm_f = sum(k.flops for k in fwd if k.name in ("qkv", "attn out", "mlp gate+up",
                                                     "mlp down"))
    gemm_b = sum(k.flops for k in bwd if "grad" in k.name)
    assert gemm_f == pytest.approx(2 * 8192 * (2 * 4096 * 4096 + 2 * 4096 * 1024
                                               + 3 * 4096 * 11008))
    assert gemm_b == pytest.approx(2 * gemm_f)
    attn = next(k for k in fwd if k.name == "attention")
    assert attn.flops == pytest.approx(MODEL.attention_core_flops_per_token(4096) * 8192)
    assert attn.time_s == pytest.approx(attn.flops / (312e12 * 0.5))
    gap = _cm(rt=replace(RT, kernel_gap_us=5.0))
    assert gap.forward_s(unit) - cm.forward_s(unit) == pytest.approx(len(fwd) * 5e-6)


def test_memory_bound_kernels_run_at_hbm_bandwidth():
    cm = _cm()
    norm = next(k for k in cm.unit_kernels(MODEL.units(4096)[1], "forward")
                if k.name == "rmsnorm x2")
    assert norm.time_s == pytest.approx(2 * 2 * 8192 * 4096 * 2 / (2000e9 * 0.8))


def test_fused_cross_entropy_moves_fewer_bytes():
    root = MODEL.units(4096)[0]
    plain = next(k for k in _cm().unit_kernels(root, "forward") if k.name == "cross-entropy")
    fused = next(k for k in _cm(cross_entropy="fused").unit_kernels(root, "forward")
                 if k.name == "cross-entropy")
    assert plain.nbytes == 8192 * 32000 * (2 + 12)
    assert fused.nbytes == 8192 * 32000 * 2


def test_train_metrics_are_forward_cross_entropies_over_the_logits_after_each_micro_batch():
    """training.train_metric_passes: each pass PyTorch's fp32 forward cross-entropy over the
    logits (14 bytes per logit), on the root unit's forward only, whatever the loss kernel."""
    root = MODEL.units(4096)[0]
    for ce in ("pytorch", "fused"):
        cm = _cm(cross_entropy=ce, train_metric_passes=2)
        (metrics,) = [k for k in cm.unit_kernels(root, "forward") if k.name == "train metrics"]
        assert metrics.nbytes == 2 * 8192 * 32000 * (2 + 12)
        assert metrics.time_s == pytest.approx(metrics.nbytes / (2000e9 * 0.8))
        assert all(k.name != "train metrics" for k in cm.unit_kernels(root, "backward"))
        base = _cm(cross_entropy=ce)
        assert cm.forward_s(root) - base.forward_s(root) == pytest.approx(metrics.time_s)
    layer = MODEL.units(4096)[1]
    assert _cm(train_metric_passes=2).forward_s(layer) == _cm().forward_s(layer)


def test_eager_attention_is_slower_than_flash():
    unit = MODEL.units(4096)[1]
    assert _cm(attention="eager").forward_s(unit) > _cm().forward_s(unit)


@pytest.mark.parametrize(("policy", "fraction", "expected"), [
    ("none", 1.0, 0), ("full", 1.0, 4), (True, 1.0, 4), ("selective", 0.5, 2),
    ("selective", 0.25, 1)])
def test_recompute_follows_the_checkpointing_policy(policy, fraction, expected):
    cm = _cm()
    train = TrainingSpec(seq_len=4096, micro_batch=2, steps=1, checkpoint_early_stop=False,
                         activation_checkpointing=policy, checkpoint_fraction=fraction)
    units = MODEL.units(4096)
    re = [cm.recompute_s(u, 1.0, train) for u in units]
    assert re[0] == 0.0  # the root (embedding, head) is never re-run
    assert sum(re) == expected


def test_early_stopped_recompute_leaves_out_the_down_projection_and_last_residual_add():
    """PyTorch's non-reentrant checkpoint stops recomputing once every tensor saved for
    backward exists again: the MLP down projection (its input is saved before it runs) and the
    residual add after it are not re-run (tests/realrun/test_checkpoint_early_stop.py checks
    this against the installed torch)."""
    cm = _cm()
    unit = MODEL.units(4096)[1]
    fwd = cm.forward_s(unit)
    ks = {k.name: k for k in cm.unit_kernels(unit, "forward")}
    skipped = (ks["mlp down"].time_s + ks["residual add x2"].time_s / 2
               + 2 * cm.rt.kernel_gap_us * 1e-6)
    early = TrainingSpec(seq_len=4096, micro_batch=2, steps=1, activation_checkpointing="full")
    full = TrainingSpec(seq_len=4096, micro_batch=2, steps=1, activation_checkpointing="full",
                        checkpoint_early_stop=False)
    assert cm.recompute_s(unit, fwd, full) == fwd
    assert cm.recompute_s(unit, fwd, early) == pytest.approx(fwd - skipped)
    # the down projection is about a fifth of a SwiGLU layer's forward
    assert 0.1 < skipped / fwd < 0.3
    # the constant model leaves out the down projection's FLOPs at the forward efficiency
    from dataclasses import replace

    const = _cm(rt=replace(RT, model="constant"))
    cfwd = const.forward_s(unit)
    down = 2.0 * MODEL.hidden * MODEL.ffn_hidden * 8192  # tokens per GPU
    assert const.recompute_s(unit, cfwd, early) == pytest.approx(
        cfwd - down / (const.hw.peak_flops * const.rt.efficiency_forward))


def test_constant_model_is_the_fallback():
    rt = ComputeRuntime(efficiency_forward=0.5, efficiency_backward=0.25)
    cm = ComputeModel(hw=_hw(), rt=rt, tokens_per_gpu=1000, model=MODEL, seq_len=4096)
    u = MODEL.units(4096)[1]
    assert cm.forward_s(u) == pytest.approx(u.fwd_flops_per_token * 1000 / (312e12 * 0.5))
    assert cm.backward_s(u) == pytest.approx(u.bwd_flops_per_token * 1000 / (312e12 * 0.25))


def test_interference_slows_the_overlapped_share():
    assert ComputeModel.interference(1.0, 0.5, 0.2) == pytest.approx(1 / (1 - 0.1))
    assert ComputeModel.interference(1.0, 3.0, 0.2) == pytest.approx(1 / 0.8)
    assert ComputeModel.interference(1.0, 0.0, 0.2) == 1.0
    assert math.isclose(ComputeModel.interference(1.0, 1.0, 0.0), 1.0)


def test_fsdp_gradient_cat_cast_and_predivide_follow_the_reduce_dtype():
    unit = MODEL.units(4096)[1]
    bf16 = _cm().fsdp_grad_kernel(unit)
    fp32 = _cm(reduce_nbytes=4).fsdp_grad_kernel(unit)
    # autograd's cat of the parameters' gradients into the flat gradient: read + write 2 bytes
    assert bf16.nbytes == unit.params * (4 + 4)  # + predivide in place: read + write 2 bytes
    assert fp32.nbytes == unit.params * (4 + 2 + 4 + 8)  # + cast 2 -> 4, predivide in fp32
    assert fp32.time_s == pytest.approx(fp32.nbytes / (2000e9 * 0.8))


def test_triton_attention_is_flash_slowed_by_its_measured_ratios():
    """llm-foundry's Triton FlashAttention: the flash kernel's FLOPs, forward time x 1.4 and
    backward time x 2.0 (FlashAttention-2 paper sec. 4.1); every other kernel unchanged."""
    unit = MODEL.units(4096)[1]
    rt = replace(RT, triton_attention_slowdown_forward=1.4, triton_attention_slowdown_backward=2.0)
    for direction, ratio in (("forward", 1.4), ("backward", 2.0)):
        flash = {k.name: k for k in _cm(rt=rt).unit_kernels(unit, direction)}
        triton = {k.name: k for k in _cm(rt=rt, attention="triton").unit_kernels(unit, direction)}
        # the Triton path reads q, k, v as strided views: no layout copies (in backward, the
        # cat of the split's gradients instead)
        split = {"q/k/v split grads"} if direction == "backward" else set()
        assert flash.keys() - triton.keys() == {"qkv layout"}
        assert triton.keys() - flash.keys() == split
        assert triton["attention"].flops == flash["attention"].flops
        assert triton["attention"].time_s == pytest.approx(ratio * flash["attention"].time_s)
        assert all(triton[n].time_s == flash[n].time_s for n in triton
                   if n != "attention" and n not in split)


def test_learned_positions_and_triton_views_drop_rope_and_layout_copies():
    """MPT (llm-foundry v0.3.0): a learned position table, no RoPE in the layers; the Triton
    attention path reads q, k, v as strided views, so no layout copies."""
    rope = MODEL.units(4096)[1]
    learned = replace(MODEL, position="learned")
    names = {k.name for k in _cm().unit_kernels(rope, "forward")}
    assert {"rope q,k", "qkv layout"} <= names
    cm = ComputeModel(hw=_hw(), rt=RT, tokens_per_gpu=8192, model=learned, seq_len=4096,
                      attention="triton")
    lk = {k.name for k in cm.unit_kernels(learned.units(4096)[1], "forward")}
    assert names - lk == {"rope q,k", "qkv layout"}
    # the learned table is read and added at the root: 3 more t x d passes than the gather
    emb = {k.name: k for k in cm.unit_kernels(learned.units(4096)[0], "forward")}["embedding"]
    assert emb.nbytes == (2 + 3) * 8192 * 4096 * 2


def test_linear_biases_cost_one_reduction_over_each_output_gradient_in_backward():
    """model.bias (MPT): each linear's bias gradient is autograd's sum of its (tokens x out
    features) output gradient, one pass in backward; the forward bias add rides in the GEMM;
    a compiled layer fuses the sums; a model without biases pays nothing."""
    biased = replace(MODEL, bias=True)
    layer = biased.units(4096)[1]
    cm = ComputeModel(hw=_hw(), rt=RT, tokens_per_gpu=8192, model=biased, seq_len=4096)
    (grads,) = [k for k in cm.unit_kernels(layer, "backward") if k.name == "linear bias grads"]
    # q, k, v (4096 + 2 x 1024), attention out 4096, gate+up 2 x 11008, down 4096: bf16
    assert grads.nbytes == 8192 * (4096 + 2 * 1024 + 4096 + 2 * 11008 + 4096) * 2
    assert cm.backward_s(layer) - _cm().backward_s(layer) == pytest.approx(grads.time_s)
    assert cm.forward_s(layer) == _cm().forward_s(layer)
    compiled = ComputeModel(hw=_hw(), rt=RT, tokens_per_gpu=8192, model=biased, seq_len=4096,
                            compile=True)
    assert all(k.name != "linear bias grads"
               for k in compiled.unit_kernels(layer, "backward"))
    assert all(k.name != "linear bias grads"
               for k in _cm().unit_kernels(MODEL.units(4096)[1], "backward"))


def test_triton_views_pay_the_split_gradient_cat_in_backward_only():
    """llm-foundry's Triton attention reads q, k, v as views of the fused projection, and its
    backward returns dq, dk, dv apart: autograd concatenates them into the projection's output
    gradient, one read and one write of (tokens x (d + 2 kv)); forward pays nothing, nor do
    the flash path (its layout copies already cover it) and a compiled layer."""
    layer = MODEL.units(4096)[1]

    def cm(attention: str, compile: bool = False) -> ComputeModel:
        return ComputeModel(hw=_hw(), rt=RT, tokens_per_gpu=8192, model=MODEL, seq_len=4096,
                            attention=attention, compile=compile)

    (cat,) = [k for k in cm("triton").unit_kernels(layer, "backward")
              if k.name == "q/k/v split grads"]
    assert cat.nbytes == 2 * 8192 * (4096 + 2 * 1024) * 2
    assert all(k.name != "q/k/v split grads" for k in cm("triton").unit_kernels(layer, "forward"))
    for other in (cm("flash"), cm("triton", compile=True)):
        assert all(k.name != "q/k/v split grads" for k in other.unit_kernels(layer, "backward"))


def _train(**kw) -> TrainingSpec:
    return TrainingSpec(seq_len=4096, micro_batch=1, steps=1, **kw)


@pytest.mark.parametrize(("kernels", "state", "nbytes", "launches"), [
    # fused: read p, g, m, v, write p, m, v
    ("fused", "fp32", 28, 1), ("fused", "bf16", 14, 1),
    # torch's _multi_tensor_adamw: 8 passes, 4p + 3g + 13s; Composer's loop: 9, 4p + 3g + 14s
    ("foreach", "fp32", 80, 8), ("per_param", "fp32", 84, 9), ("foreach", "bf16", 40, 8),
])
def test_optimizer_bytes_follow_the_kernels_each_implementation_launches(
        kernels, state, nbytes, launches):
    from simfed.compute import optimizer_bytes_per_param

    t = _train(optimizer_kernels=kernels, optimizer_state_dtype=state)
    assert optimizer_bytes_per_param(MODEL, t) == (nbytes, launches)
    # clipping adds the norm's read and the scaling's read and write of the gradient
    clipped = replace(t, grad_clip=1.0)
    s = 4 if state == "fp32" else 2
    assert optimizer_bytes_per_param(MODEL, clipped) == (nbytes + 3 * s, launches + 2)
    # SGD has no moments: param and grad read, param written, whatever the kernels
    assert optimizer_bytes_per_param(MODEL, replace(t, optimizer="sgd"))[0] == 3 * 2


def test_optimizer_time_is_bytes_at_hbm_plus_a_gap_per_launch():
    rt = replace(RT, optimizer_hbm_efficiency=0.5, kernel_gap_us=3.0)
    cm = _cm(rt=rt)
    shard = 1e9
    fused = cm.optimizer_s(shard, MODEL, _train(optimizer_state_dtype="fp32"), tensors=100)
    assert fused == pytest.approx(shard * 28 / (2000e9 * 0.5) + 3e-6)
    loop = cm.optimizer_s(shard, MODEL, _train(optimizer_state_dtype="fp32",
                                               optimizer_kernels="per_param"), tensors=100)
    # the per-parameter loop launches its nine kernels for every tensor of the shard
    assert loop == pytest.approx(shard * 84 / (2000e9 * 0.5) + 900 * 3e-6)
    assert loop / fused > 84 / 28 * 0.99
