"""training.float8 (torchao Float8Linear), training.compile and training.eager_ops in the
per-kernel compute model, FSDP's float8 all-gather, and the errors for what cannot run."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from simfed.cli import main
from simfed.compute import ComputeModel, gathered_nbytes
from simfed.hardware import Hardware
from simfed.spec import SpecError
from simfed.spec.loader import scenario_from_dict
from simfed.spec.model import ModelSpec
from simfed.spec.scenario import ComputeRuntime, TrainingSpec

MODEL = ModelSpec(layers=2, hidden=4096, ffn_hidden=14336, heads=32, kv_heads=8, vocab=128256)
RT = ComputeRuntime(model="kernels", gemm_efficiency=0.8, gemm_tiles=((128, 128, 1.0),),
                    gemm_efficiency_fp8_relative=0.88, hbm_efficiency=0.8, kernel_gap_us=0.0)
H100 = {"gpus": 8, "gpu": {"peak_tflops": 989, "peak_tflops_fp8": 1979, "memory_GiB": 80,
                           "hbm_bw_GBps": 3350, "sms": 132},
        "nvlink": {"bw_GBps": 450}, "nics": {"count": 8, "bw_Gbps": 400}}


def _scenario(**training):
    return scenario_from_dict({
        "cluster": {"nodes": 1, "node": H100},
        "model": {"layers": 2, "hidden": 4096, "ffn_hidden": 14336, "heads": 32,
                  "kv_heads": 8, "vocab": 128256},
        "training": {"seq_len": 8192, "micro_batch": 1, "steps": 2, "fsdp_version": 2,
                     **training},
        "runtime": {"compute": {"model": "kernels"}},
        "algorithms": [{"name": "fsdp"}]})


def _cm(**kw) -> ComputeModel:
    scn = _scenario()
    hw = Hardware.from_spec(scn.cluster, scn.runtime)
    return ComputeModel(hw=hw, rt=RT, tokens_per_gpu=8192, model=MODEL, seq_len=8192, **kw)


def _layer(cm: ComputeModel, direction: str) -> dict:
    return {k.name: k for k in cm.unit_kernels(MODEL.units(8192)[1], direction)}


def test_float8_gemm_runs_at_the_fp8_peak_times_the_relative_efficiency():
    bf16, fp8 = _cm(), _cm(float8="tensorwise")
    m, n, k = 132 * 128, 1024, 4096  # 1056 tiles = 8 full waves: compute bound
    g16, g8 = bf16.gemm("g", m, n, k), fp8.gemm_fp8("g", m, n, k)
    assert g16.time_s == pytest.approx(2 * m * n * k / (989e12 * 0.8))
    assert g8.time_s == pytest.approx(2 * m * n * k / (1979e12 * 0.8 * 0.88))
    assert g8.nbytes == m * k + k * n + 2 * m * n  # float8 operands, bf16 output
    # every decoder-layer linear is float8 forward and backward; the LM head is not
    fwd, bwd = _layer(fp8, "forward"), _layer(fp8, "backward")
    assert fwd["mlp down"].time_s < _layer(bf16, "forward")["mlp down"].time_s / 1.5
    assert {"qkv dgrad", "qkv wgrad"} <= set(bwd)
    root = MODEL.units(8192)[0]
    assert ([k.time_s for k in fp8.unit_kernels(root, "forward")]
            == [k.time_s for k in bf16.unit_kernels(root, "forward")])


def test_tensorwise_casts_follow_torchao():
    """Compiled, with FSDP's float8 all-gather: forward one cast of the input writing both
    layouts (read 2, write 2 bytes an element; its amax fused upstream); backward the same for
    dY plus the weight's transposed float8 copy (read 1, write 1)."""
    t, d, f = 8192, 4096, 14336
    fwd = _layer(_cm(float8="tensorwise", compile=True), "forward")
    bwd = _layer(_cm(float8="tensorwise", compile=True), "backward")
    assert fwd["mlp down fp8 input cast+transpose"].nbytes == 4 * t * f
    assert not any(n.startswith("mlp down fp8 weight") for n in fwd)
    assert bwd["mlp down fp8 dY cast+transpose"].nbytes == 4 * t * d
    assert bwd["mlp down fp8 weight transpose"].nbytes == 2 * d * f
    # eager: a separate amax pass, the input re-cast in backward
    eager_f = _layer(_cm(float8="tensorwise"), "forward")
    eager_b = _layer(_cm(float8="tensorwise"), "backward")
    assert eager_f["mlp down fp8 input amax"].nbytes == 2 * t * f
    assert eager_f["mlp down fp8 input cast"].nbytes == 3 * t * f
    assert eager_b["mlp down fp8 input transpose"].nbytes == 2 * t * f
    # without the float8 all-gather the weight is cast in the linear
    no_ag = _layer(_cm(float8="tensorwise", compile=True, float8_all_gather=False), "forward")
    assert no_ag["mlp down fp8 weight cast+transpose"].nbytes == 4 * d * f
    # rowwise casts every operand twice, along both axes
    row = _layer(_cm(float8="rowwise", compile=True), "forward")
    assert row["mlp down fp8 weight cast dim0+transpose"].nbytes == 5 * d * f
    assert row["mlp down fp8 weight cast dim1"].nbytes == 3 * d * f


def test_compile_fuses_the_memory_bound_kernels_between_gemms():
    eager, comp = _layer(_cm(), "forward"), _layer(_cm(compile=True), "forward")
    mem = lambda ks: sum(k.nbytes for k in ks.values() if k.flops == 0)  # noqa: E731
    t, d, kv, p = 8192, 4096, 1024, 2
    # RoPE's own pass (read + write q and k) and one residual read are gone
    assert mem(eager) - mem(comp) == pytest.approx(2 * t * (d + kv) * p + t * d * p)
    assert comp["residual add+rmsnorm"].nbytes == 4 * t * d * p
    # composite eager RMSNorm moves (28 + 4p) bytes an element instead of 2p, RoPE 16 + 2p;
    # compiled layers fuse them, the uncompiled root's final norm stays composite
    comp_eager = _layer(_cm(eager_ops="composite"), "forward")
    assert comp_eager["rmsnorm x2"].nbytes == 2 * (28 + 4 * p) * t * d
    assert comp_eager["rope q,k"].nbytes == (16 + 2 * p) * t * (d + kv)
    assert _layer(_cm(eager_ops="composite", compile=True), "forward") == comp
    root = MODEL.units(8192)[0]
    norm = {k.name: k for k in _cm(eager_ops="composite", compile=True)
            .unit_kernels(root, "forward")}["final rmsnorm"]
    assert norm.nbytes == (28 + 4 * p) * t * d


def test_checkpoint_early_stop_works_compiled():
    cm = _cm(compile=True, float8="tensorwise")
    layer = MODEL.units(8192)[1]
    fwd = cm.forward_s(layer)
    skipped = cm.early_stop_skipped_s(layer)
    assert 0 < skipped < fwd
    train = TrainingSpec(seq_len=8192, micro_batch=1, steps=1, activation_checkpointing="full")
    assert cm.recompute_s(layer, fwd, train) == pytest.approx(fwd - skipped)


def test_float8_all_gather_moves_linear_weights_in_one_byte():
    units = MODEL.units(8192)
    tw = TrainingSpec(seq_len=8192, micro_batch=1, steps=1, float8="tensorwise")
    rw = replace(tw, float8="rowwise")
    linear = MODEL.attention_params + MODEL.mlp_params
    def gathered(unit, tr):
        return gathered_nbytes(MODEL, unit, tr.float8, tr.float8_all_gather)

    assert gathered(units[1], tw) == linear + 2 * MODEL.hidden * 2
    assert gathered(units[1], rw) == units[1].nbytes  # rowwise gathers bf16
    assert gathered(units[0], tw) == units[0].nbytes  # embedding, LM head


def test_float8_and_compile_speed_up_a_run_and_gather_float8_weights():
    from simfed.engine.run import simulate_algorithm

    def run(**tr):
        scn = _scenario(**tr)
        return simulate_algorithm(scn, scn.algorithms[0], trace=True)

    base, comp, f8 = run(), run(compile=True), run(compile=True, float8="tensorwise")
    t = [r.result["step_time_s"] for r in (base, comp, f8)]
    assert t[0] > t[1] > t[2]
    # the simulated all-gathers carry the float8 bytes; reduce-scatters stay as they were
    layer = MODEL.units(8192)[1]
    f8_layer = MODEL.attention_params + MODEL.mlp_params + 2 * MODEL.hidden * 2

    def sizes(r, kind):
        return {s.nbytes for s in r.spans if s.name == f"{kind} u1"}
    assert sizes(comp, "all_gather") == {layer.nbytes}
    assert sizes(f8, "all_gather") == {f8_layer}
    assert sizes(f8, "reduce_scatter") == sizes(comp, "reduce_scatter")
    assert f8.result["bytes_by_link"]["nvlink"] < comp.result["bytes_by_link"]["nvlink"]


@pytest.mark.parametrize("cluster_gpu, runtime, message", [
    ({"peak_tflops_fp8": 0}, {"model": "kernels"},
     r"training\.float8: tensorwise needs FP8 tensor cores; "
     r"cluster\.node\.gpu\.peak_tflops_fp8 is 0"),
    ({}, {"model": "constant"}, r"training\.float8: tensorwise needs runtime\.compute\.model: "
     r"kernels \(it is 'constant'"),
])
def test_float8_without_fp8_or_kernels_is_one_clear_error(cluster_gpu, runtime, message):
    node = json.loads(json.dumps(H100))
    node["gpu"].update(cluster_gpu)
    with pytest.raises(SpecError, match=message):
        scenario_from_dict({
            "cluster": {"nodes": 1, "node": node},
            "model": {"layers": 2, "hidden": 256, "ffn_hidden": 512, "heads": 4, "kv_heads": 4,
                      "vocab": 1000},
            "training": {"seq_len": 128, "micro_batch": 1, "steps": 1, "float8": "tensorwise",
                         "fsdp_version": 2},
            "runtime": {"compute": runtime},
            "algorithms": [{"name": "fsdp"}]})


def test_cli_float8_scenario_and_realrun_refuses_what_it_does_not_run(tmp_path):
    res = CliRunner().invoke(main, ["run", "scenarios/h100-8b-float8.yaml", "-q",
                                    "--set", "training.float8=tensorwise",
                                    "--json", str(tmp_path / "r.json")])
    assert res.exit_code == 0, res.output
    from realrun.config import check_runnable
    from realrun.errors import RealrunError
    from simfed.spec import load_scenario

    path = "scenarios/h100-8b-float8.yaml"
    check_runnable(load_scenario(path))  # op checkpointing and compile run (realrun.model)
    sc = load_scenario(path, {"training.compile": False, "training.float8": "rowwise",
                              "training.activation_checkpointing": "none"})
    with pytest.raises(RealrunError, match=r"training\.float8: rowwise is simulated"):
        check_runnable(sc)


def test_op_checkpointing_recomputes_wk_wo_w3_and_the_memory_bound_kernels():
    cm = _cm()
    layer = MODEL.units(8192)[1]
    by = _layer(cm, "forward")
    d, kv = 4096, 1024
    expect = (by["qkv"].time_s * kv / (d + 2 * kv) + by["attn out"].time_s
              + by["mlp gate+up"].time_s / 2
              + sum(k.time_s for k in by.values() if k.flops == 0))
    train = TrainingSpec(seq_len=8192, micro_batch=1, steps=1, activation_checkpointing="op")
    assert cm.recompute_s(layer, cm.forward_s(layer), train) == pytest.approx(expect)
    assert cm.recompute_s(MODEL.units(8192)[0], 1.0, train) == 0.0  # the root: not wrapped
    assert not train.layer_checkpointed(1)  # no whole-layer recompute besides


def test_op_checkpointing_keeps_the_saved_ops_outputs():
    from simfed.memory import activation_bytes

    tr = TrainingSpec(seq_len=8192, micro_batch=1, steps=1, activation_checkpointing="op")
    none = replace(tr, activation_checkpointing="none")
    full = replace(tr, activation_checkpointing="full")
    d, kv, f, p, t = 4096, 1024, 14336, 2, 8192
    assert MODEL.layer_op_sac_bytes_per_token() == (4 * d + kv + f) * p
    assert activation_bytes(MODEL, full) < activation_bytes(MODEL, tr) < activation_bytes(
        MODEL, none)
    layer_all = MODEL.layer_activation_bytes_per_token(8192, "flash")
    logits = MODEL.logits_bytes_per_token("pytorch")
    assert activation_bytes(MODEL, tr) == t * (MODEL.layers * (4 * d + kv + f) * p
                                               + layer_all + logits)


def test_float8_all_gather_off_gathers_the_model_dtype_and_casts_weights_in_the_linear():
    tw = TrainingSpec(seq_len=8192, micro_batch=1, steps=1, float8="tensorwise",
                      float8_all_gather=False)
    layer = MODEL.units(8192)[1]
    assert gathered_nbytes(MODEL, layer, tw.float8, tw.float8_all_gather) == layer.nbytes
    scn = _scenario(float8="tensorwise", float8_all_gather=False, compile=True)
    from simfed.engine.run import simulate_algorithm
    on = _scenario(float8="tensorwise", compile=True)
    t_off = simulate_algorithm(scn, scn.algorithms[0]).result["step_time_s"]
    t_on = simulate_algorithm(on, on.algorithms[0]).result["step_time_s"]
    assert t_off > t_on  # the weight casts run in every linear


def test_fsdp2_charges_its_copy_out_and_copy_in_instead_of_fsdp1s_gradient_work():
    layer, root = MODEL.units(8192)[1], MODEL.units(8192)[0]
    p, r = 2, 4
    v2 = _cm(fsdp_version=2, reduce_nbytes=r)
    fwd, bwd = _layer(v2, "forward"), _layer(v2, "backward")
    assert fwd["fsdp2 all-gather copy-out"].nbytes == 2 * layer.nbytes
    assert bwd["fsdp2 all-gather copy-out"].nbytes == 2 * layer.nbytes
    assert bwd["fsdp2 reduce-scatter copy-in"].nbytes == layer.params * (p + r)
    assert "fsdp grad cat+cast+predivide" not in bwd
    assert "fsdp grad cat+cast+predivide" in _layer(_cm(reduce_nbytes=r), "backward")
    # the root stays gathered for backward; SHARD_GRAD_OP keeps every unit gathered; an
    # unsharded plan gathers nothing
    root_b = {k.name for k in v2.unit_kernels(root, "backward")}
    assert "fsdp2 all-gather copy-out" not in root_b
    keep = _layer(_cm(fsdp_version=2, regather_backward=False), "backward")
    assert "fsdp2 all-gather copy-out" not in keep
    alone = _layer(_cm(fsdp_version=2, sharded=False), "forward")
    assert "fsdp2 all-gather copy-out" not in alone
    # float8's all-gather: the copy-out moves the float8 bytes
    f8 = _layer(_cm(fsdp_version=2, float8="tensorwise"), "forward")
    linear = MODEL.attention_params + MODEL.mlp_params
    assert f8["fsdp2 all-gather copy-out"].nbytes == 2 * (linear + 2 * MODEL.hidden * p)


def test_float8_all_gather_needs_fsdp2():
    with pytest.raises(SpecError, match=r"training\.float8_all_gather: FSDP's float8 "
                       r"all-gather is FSDP2's"):
        _scenario(float8="tensorwise", fsdp_version=1)
    assert _scenario(float8="tensorwise", fsdp_version=1, float8_all_gather=False)


def test_recompute_leaves_out_fsdp2s_copy_out():
    """A checkpointed layer re-runs its own kernels, not FSDP's copy of the gathered
    parameters (that belongs to the all-gather, once per gather)."""
    layer = MODEL.units(8192)[1]
    full = TrainingSpec(seq_len=8192, micro_batch=1, steps=1, activation_checkpointing="full",
                        checkpoint_early_stop=False)
    v1, v2 = _cm(), _cm(fsdp_version=2)
    copy = v2.fsdp_forward_s(layer)
    assert copy > 0 and v1.fsdp_forward_s(layer) == 0
    assert v2.forward_s(layer) == pytest.approx(v1.forward_s(layer) + copy)
    assert v2.recompute_s(layer, v2.forward_s(layer), full) == pytest.approx(
        v1.recompute_s(layer, v1.forward_s(layer), full))
    op = replace(full, activation_checkpointing="op")
    assert v2.recompute_s(layer, 0.0, op) == pytest.approx(v1.recompute_s(layer, 0.0, op))
