"""GPU compute time: forward and backward per FSDP unit, and the optimizer step.

Two models, chosen by `runtime.compute.model`:
- `constant` (the fallback): a unit's FLOPs at one calibrated efficiency per direction.
- `kernels`: a unit as the kernels it launches (Calculon, vTrain and Megatron's own performance
  model do the same):
  - GEMMs of the attention projections (fused QKV, output), the MLP (SwiGLU gate/up/down or GELU
    up/down) and the LM head, by shape (M tokens x N out x K in). Backward runs two GEMMs per
    forward GEMM (input gradient: M x K x N; weight gradient: K x N x M). A GEMM's efficiency
    is `gemm_efficiency` (a large well-shaped GEMM's measured fraction of peak) times its tile
    quantisation (output padded to whole tiles) times its wave quantisation (tiles over the
    GPU's SMs, the last wave partly idle), for the best of the tile shapes a GEMM library picks
    from; a GEMM never beats its HBM traffic (reads A and B, writes C) at `hbm_efficiency`.
  - fused (flash) attention: its FLOPs (causal half) at `attention_efficiency_forward/backward`;
    llm-foundry's Triton FlashAttention (`training.attention: triton`) slower by
    `triton_attention_slowdown_forward/backward` (FlashAttention-2 paper, sec. 4.1).
  - memory-bound kernels at HBM bandwidth x `hbm_efficiency`: two RMSNorms, RoPE on q and k
    (`model.position: rope`), q/k/v layout copies (not for the Triton kernel, which reads
    strided views; its backward concatenates dq, dk and dv into the projection's gradient), the
    MLP activation, two residual adds per layer; embedding gather, final norm
    and cross-entropy over the logits on the root unit (`training.train_metric_passes` more
    forward cross-entropies: a trainer's metrics after each micro-batch); FSDP1's assembly of
    each unit's flat gradient (autograd's cat of the parameters' gradients), its cast to the
    reduce dtype and its in-place pre-division before the reduce-scatter. Backward moves
    about twice the forward's bytes (reads the saved input and the output gradient, writes the
    input gradient).
  - a fixed `kernel_gap_us` between consecutive kernels (launch and tail effects).
  Recompute under activation checkpointing re-runs a checkpointed layer's forward kernels.
  - `training.float8` (torchao.float8's Float8Linear on the decoder layers' linears; the LM head
    stays in the model dtype): the three GEMMs of each linear (output, input gradient, weight
    gradient) at the FP8 peak x `gemm_efficiency` x `gemm_efficiency_fp8_relative`, float8
    operands (1 byte) and bf16 outputs, plus the casts torchao runs (`_float8_casts`).
  - `training.compile` (torch.compile of each decoder layer): the memory-bound kernels between
    two GEMM / attention kernels become one kernel that reads its inputs and writes its outputs
    once (`_compiled_regions`), and float8's scale reductions fuse into the kernel producing
    the tensor. Eager norms are already one kernel each here (fused norm kernels), so what
    compile saves is RoPE's own pass, one residual-add read and kernel launches.
The optimizer step reads and writes its state at HBM bandwidth (both models).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .hardware import Hardware
from .spec.model import ModelSpec, UnitSpec
from .spec.scenario import ComputeRuntime, TrainingSpec
from .spec.units import dtype_nbytes

# Bytes per element of the local shard that each kernel of an optimizer step moves, AdamW with
# decoupled weight decay, the sharded parameter (p), its gradient (g) and both moments (s) in
# training.optimizer_state_dtype (FSDP hands the optimizer its fp32 master shards and their
# gradients under mixed precision; pure bf16 keeps all of them in bf16):
# - fused: one kernel reads p, g, m, v and writes p, m, v (torch AdamW fused=True, DeepSpeed
#   FusedAdam, XLA's fusion).
# - foreach: torch.optim.AdamW's default on GPUs (torch/optim/adamw.py `_multi_tensor_adamw`,
#   torch 2.1-2.5; adam.py `_multi_tensor_adam` with decoupled weight decay since 2.6):
#   _foreach_mul_(params) 2p, _foreach_lerp_(m, g) 2s+g, _foreach_mul_(v) 2s,
#   _foreach_addcmul_(v, g, g) 2s+2g, _foreach_sqrt(v) into a temporary 2s, _foreach_div_ 2s,
#   _foreach_add_(eps) 2s, _foreach_addcdiv_(p, m, temporary) 2p+2s.
# - per_param: Composer's DecoupledAdamW.adamw (composer/optim/decoupled_weight_decay.py,
#   v0.13-v0.17), a loop over the parameters: param.mul_ 2p, exp_avg.mul_ 2s, .add_(grad) 2s+g,
#   exp_avg_sq.mul_ 2s, .addcmul_(grad, grad) 2s+2g, sqrt 2s, / 2s, .add_(eps) 2s,
#   param.addcdiv_ 2p+2s.
# Gradient clipping (training.grad_clip > 0; torch clip_grad_norm_, FSDP's clip_grad_norm_): the
# norm reads g, the scaling reads and writes g: 3g in two kernels.
# SGD: reads param and grad, writes param (3 x the model dtype).
# (bytes per element in units of the state dtype's size, kernels): fused 2p + g + 4s, foreach
# 4p + 3g + 13s, per_param 4p + 3g + 14s, with p, g and s all of the state dtype.
_ADAMW_BYTES = {"fused": (7, 1), "foreach": (20, 8), "per_param": (21, 9)}


def optimizer_bytes_per_param(model: ModelSpec, train: TrainingSpec) -> tuple[float, int]:
    """(bytes per element of the local shard, kernels) of one optimizer step, gradient clipping
    included: the kernel sequences above."""
    if train.optimizer != "adamw":
        return 3.0 * model.dtype_nbytes, 1
    s = dtype_nbytes(train.optimizer_state_dtype)
    units, kernels = _ADAMW_BYTES[train.optimizer_kernels]
    nbytes = float(units * s)
    if train.grad_clip > 0:
        nbytes, kernels = nbytes + 3 * s, kernels + 2
    return nbytes, kernels


def gathered_nbytes(model: ModelSpec | None, unit: UnitSpec, float8: str = "none",
                    float8_all_gather: bool = True) -> int:
    """Bytes FSDP all-gathers for a unit: its parameters in the model dtype, but with float8
    tensorwise and FSDP2's float8 all-gather (torchao float8/fsdp_utils.py: the weight shard
    cast to float8 before the all-gather, 1 byte an element) a decoder layer's linear weights
    in float8; norms, the embedding and the LM head stay as they are."""
    if model is None or float8 != "tensorwise" or not float8_all_gather or unit.index == 0:
        return unit.nbytes
    linear = model.attention_params + model.mlp_params
    return int(unit.nbytes - linear * (model.dtype_nbytes - 1))


@dataclass(frozen=True, slots=True)
class Kernel:
    """One kernel of a unit: what it computes and how long it takes."""

    name: str
    flops: float
    nbytes: float
    time_s: float


@dataclass(frozen=True, kw_only=True)
class ComputeModel:
    hw: Hardware
    rt: ComputeRuntime
    tokens_per_gpu: int  # micro_batch x seq_len per step
    model: ModelSpec | None = None
    seq_len: int = 0
    attention: str = "flash"  # flash | eager
    cross_entropy: str = "pytorch"  # pytorch | fused
    train_metric_passes: int = 0  # training.train_metric_passes
    reduce_nbytes: int = 0  # gradient reduce dtype's bytes (0: the model dtype's)
    float8: str = "none"  # none | tensorwise | rowwise (training.float8)
    float8_all_gather: bool = True  # tensorwise: FSDP all-gathers the weights in float8
    compile: bool = False  # training.compile
    eager_ops: str = "fused"  # fused | composite (training.eager_ops)
    eager_norm: str = ""  # fused | composite | "" (as eager_ops): training.eager_norm
    eager_rope: str = ""  # fused | composite | "" (as eager_ops): training.eager_rope
    fsdp_version: int = 1  # training.fsdp_version
    sharded: bool = True  # the plan shards parameters (FSDP all-gathers them)
    regather_backward: bool = True  # FULL_SHARD: gathered again for backward (not SHARD_GRAD_OP)
    # the last decoder layer kept unsharded from forward to backward (its backward gathers
    # nothing: algorithms[].reshard_last_layer_after_forward false)
    keep_last_layer: bool = False
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def kernels_mode(self) -> bool:
        return self.rt.model == "kernels" and self.model is not None

    def forward_s(self, unit: UnitSpec) -> float:
        if self.kernels_mode:
            return self._sum(self.unit_kernels(unit, "forward"))
        flops = unit.fwd_flops_per_token * self.tokens_per_gpu
        return flops / (self.hw.peak_flops * self.rt.efficiency_forward)

    def backward_s(self, unit: UnitSpec) -> float:
        if self.kernels_mode:
            return self._sum(self.unit_kernels(unit, "backward"))
        flops = unit.bwd_flops_per_token * self.tokens_per_gpu
        return flops / (self.hw.peak_flops * self.rt.efficiency_backward)

    def recompute_s(self, unit: UnitSpec, forward_s: float, train: TrainingSpec) -> float:
        """Forward time re-run in the backward of `unit` under the checkpointing policy:
        a decoder layer's forward when checkpointed (`TrainingSpec.layer_checkpointed`).
        With `training.checkpoint_early_stop` (PyTorch's non-reentrant checkpoint, whose
        recomputation stops once every tensor saved for backward exists again:
        torch/utils/checkpoint.py, set_checkpoint_early_stop, on by default since
        pytorch/pytorch#96866, PyTorch 2.1) the layer's last kernels, which save nothing for
        backward, are not re-run: the MLP's down projection (its input, the activation's output,
        is saved before it runs) and the residual add after it (`early_stop_skipped_s`)."""
        if train.ac_policy == "op":
            return self.op_recompute_s(unit)
        if not train.layer_checkpointed(unit.index):
            return 0.0
        forward_s -= self.fsdp_forward_s(unit)  # FSDP's own copies are not re-run
        if not train.checkpoint_early_stop:
            return max(0.0, forward_s)
        return max(0.0, forward_s - self.early_stop_skipped_s(unit))

    def fsdp_forward_s(self, unit: UnitSpec) -> float:
        """FSDP's own kernels in a unit's forward (FSDP2's all-gather copy-out), with their
        gaps: part of the forward, not of a checkpointed layer's recompute."""
        if not self.kernels_mode:
            return 0.0
        ks = self.fsdp_kernels(unit, "forward")
        return sum(k.time_s for k in ks) + len(ks) * self.rt.kernel_gap_us * 1e-6

    def op_recompute_s(self, unit: UnitSpec) -> float:
        """torchtitan's selective op checkpointing (pytorch/torchtitan v0.2.0,
        torchtitan/distributed/activation_checkpoint.py `_custom_policy` with
        models/llama3/infra/parallelize.py `_op_sac_save_list`): a layer saves the outputs of
        aten.mm and of the attention kernel except every second mm; in call order (wq, wk, wv,
        wo, w1, w3, w2) wk, wo and w3 are re-run in backward, with every memory-bound kernel
        (their outputs are not saved). Here: wk's share of the fused q/k/v GEMM, the output
        projection, half the fused gate/up GEMM (a GELU MLP: the up projection), the
        forward's memory-bound kernels, one kernel gap each."""
        if unit.index == 0 or self.model is None:
            return 0.0
        mdl = self.model
        if not self.kernels_mode:  # the three matmuls' FLOPs at the forward efficiency
            f_up = mdl.ffn_hidden
            flops = 2.0 * mdl.hidden * (mdl.kv_dim + mdl.hidden + f_up) * self.tokens_per_gpu
            return flops / (self.hw.peak_flops * self.rt.efficiency_forward)
        ks = self.unit_kernels(unit, "forward")
        by = {k.name: k for k in ks}
        d, kv = mdl.hidden, mdl.kv_dim
        up = by["mlp gate+up"].time_s / 2 if "mlp gate+up" in by else by["mlp up"].time_s
        gemms = by["qkv"].time_s * kv / (d + 2 * kv) + by["attn out"].time_s + up
        fsdp = self.fsdp_kernels(unit, "forward")  # FSDP's copies are not re-run
        mem = [k for k in ks if k.flops == 0 and k not in fsdp]
        return (gemms + sum(k.time_s for k in mem)
                + (3 + len(mem)) * self.rt.kernel_gap_us * 1e-6)

    def early_stop_skipped_s(self, unit: UnitSpec) -> float:
        """Time of a decoder layer's forward that early-stopped recomputation leaves out: the
        MLP down-projection GEMM and the final residual add (one of the layer's two), with
        their kernel gaps; in the constant model the down projection's FLOPs at the forward
        efficiency."""
        mdl = self.model
        if mdl is None or unit.index == 0:
            return 0.0
        if not self.kernels_mode:
            flops = 2.0 * mdl.hidden * mdl.ffn_hidden * self.tokens_per_gpu
            return flops / (self.hw.peak_flops * self.rt.efficiency_forward)
        ks = {k.name: k for k in self.unit_kernels(unit, "forward")}
        residual = (ks["residual add x2"].time_s / 2 if "residual add x2" in ks
                    else ks["residual add"].time_s)  # compiled: the last region alone
        return ks["mlp down"].time_s + residual + 2 * self.rt.kernel_gap_us * 1e-6

    def optimizer_s(self, shard_params: float, model: ModelSpec, train: TrainingSpec,
                    tensors: int = 1) -> float:
        """The optimizer step over the local shard (and gradient clipping before it): the bytes
        its kernels move (`optimizer_bytes_per_param`) at `optimizer_hbm_efficiency`, plus a
        `kernel_gap_us` per kernel (`tensors`: parameter tensors in the shard, for the
        per-parameter loop)."""
        nbytes, kernels = optimizer_bytes_per_param(model, train)
        launches = kernels * (tensors if train.optimizer_kernels == "per_param" else 1)
        return (shard_params * nbytes / (self.hw.hbm_Bps * self.rt.optimizer_hbm_efficiency)
                + launches * self.rt.kernel_gap_us * 1e-6)

    @staticmethod
    def interference(compute_s: float, overlapped_comm_s: float, sm_share: float) -> float:
        """Compute time when collectives run beside it for `overlapped_comm_s` (at most all of
        it): while an NCCL kernel runs, its channels hold `sm_share` of the GPU, so the compute
        kernels beside it progress at (1 - sm_share) of their speed."""
        if compute_s <= 0 or sm_share <= 0 or overlapped_comm_s <= 0:
            return compute_s
        share = min(1.0, overlapped_comm_s / compute_s)
        return compute_s / (1.0 - sm_share * share)

    # ---- the kernel model ---------------------------------------------------------------
    def _sum(self, kernels: list[Kernel]) -> float:
        return sum(k.time_s for k in kernels) + len(kernels) * self.rt.kernel_gap_us * 1e-6

    def gemm_efficiency(self, m: int, n: int, k: int) -> float:
        """Achieved / peak FLOP/s of an (m x k) @ (k x n) GEMM: the best tile shape's
        tile quantisation x wave quantisation x its relative efficiency, times the large-GEMM
        efficiency."""
        best = 0.0
        sms = self.hw.sms
        for tm, tn, rel in self.rt.gemm_tiles:
            tiles_m, tiles_n = math.ceil(m / tm), math.ceil(n / tn)
            tile_q = (m * n) / (tiles_m * tm * tiles_n * tn)
            tiles = tiles_m * tiles_n
            wave_q = tiles / (math.ceil(tiles / sms) * sms) if sms else 1.0
            best = max(best, tile_q * wave_q * rel)
        return self.rt.gemm_efficiency * best

    def gemm(self, name: str, m: int, n: int, k: int) -> Kernel:
        p = self.model.dtype_nbytes if self.model else 2
        flops = 2.0 * m * n * k
        nbytes = float(p * (m * k + k * n + m * n))
        t = max(flops / (self.hw.peak_flops * self.gemm_efficiency(m, n, k)),
                nbytes / (self.hw.hbm_Bps * self.rt.hbm_efficiency))
        return Kernel(name, flops, nbytes, t)

    def gemm_fp8(self, name: str, m: int, n: int, k: int) -> Kernel:
        """A float8 GEMM (torch._scaled_mm): float8 operands, bf16 output, at the FP8 peak."""
        flops = 2.0 * m * n * k
        nbytes = float(m * k + k * n + 2 * m * n)
        eff = self.gemm_efficiency(m, n, k) * self.rt.gemm_efficiency_fp8_relative
        t = max(flops / (self.hw.peak_flops_fp8 * eff),
                nbytes / (self.hw.hbm_Bps * self.rt.hbm_efficiency))
        return Kernel(name, flops, nbytes, t)

    def memory_bound(self, name: str, nbytes: float) -> Kernel:
        return Kernel(name, 0.0, nbytes, nbytes / (self.hw.hbm_Bps * self.rt.hbm_efficiency))

    def attention_kernel(self, name: str, flops: float, backward: bool) -> Kernel:
        """A fused attention kernel's FLOPs at the flash efficiency; llm-foundry's Triton
        FlashAttention (`attention: triton`) takes `triton_attention_slowdown_*` times longer."""
        rt = self.rt
        eff = rt.attention_efficiency_backward if backward else rt.attention_efficiency_forward
        if self.attention == "triton":
            eff /= (rt.triton_attention_slowdown_backward if backward
                    else rt.triton_attention_slowdown_forward)
        return Kernel(name, flops, 0.0, flops / (self.hw.peak_flops * eff))

    def regathered(self, unit: UnitSpec) -> bool:
        """Whether FSDP all-gathers `unit` again for its backward: FULL_SHARD's decoder
        layers, except the last one when it is kept unsharded after forward; the root stays
        gathered."""
        if not (self.sharded and self.regather_backward) or unit.index == 0:
            return False
        last = self.model.layers if self.model is not None else -1
        return not (self.keep_last_layer and unit.index == last)

    def unit_kernels(self, unit: UnitSpec, direction: str) -> list[Kernel]:
        key = (unit.index == 0, unit.params, direction,
               direction == "backward" and self.regathered(unit))
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = (self._root_kernels(unit, direction) if unit.index == 0
                                      else self._layer_kernels(unit, direction))
        return hit

    def _gemms(self, fwd: list[tuple[str, int, int, int]], direction: str) -> list[Kernel]:
        out = []
        for name, m, n, k in fwd:
            if direction == "forward":
                out.append(self.gemm(name, m, n, k))
            else:  # input gradient (m x n) @ (n x k), weight gradient (k x m) @ (m x n)
                out.append(self.gemm(f"{name} dgrad", m, k, n))
                out.append(self.gemm(f"{name} wgrad", k, n, m))
        return out

    def _gemms_fp8(self, fwd: list[tuple[str, int, int, int]], direction: str
                   ) -> list[Kernel]:
        """Float8Linear: each linear's GEMMs in float8 and the casts feeding them."""
        out = []
        for name, m, n, k in fwd:
            if n % 16 or k % 16:  # torchtitan's module_filter_fn: float8 needs dims % 16 == 0
                out.extend(self._gemms([(name, m, n, k)], direction))
                continue
            if direction == "forward":
                out.append(self.gemm_fp8(name, m, n, k))
            else:
                out.append(self.gemm_fp8(f"{name} dgrad", m, k, n))
                out.append(self.gemm_fp8(f"{name} wgrad", k, n, m))
            out.extend(self.memory_bound(f"{name} fp8 {what}", nbytes)
                       for what, nbytes in self._float8_casts(m, n, k, direction))
        return out

    def _float8_casts(self, m: int, n: int, k: int, direction: str
                      ) -> list[tuple[str, float]]:
        """The casts (one kernel each, bytes moved) torchao.float8 runs for a linear with input
        X (m x k), weight W (n x k) and output gradient dY (m x n), from its code
        (pytorch/ao @36027d8: float8/float8_linear.py matmul_with_hp_or_float8_args,
        float8_utils.py, float8_ops.py preprocess_addmm) and its roofline model
        (torchao/testing/training/roofline_utils.py, get_tensor_memory_traffic_ovhd_s):
        - tensorwise: a scale is fp8_max / amax over the whole tensor, a reduction pass (read 2
          bytes an element) before the cast (read 2, write 1); torch._scaled_mm needs its
          second operand column-major (cuBLASLt's FP8 "TN" rule), so the input and dY (for the
          weight gradient) and W (for the input gradient) also need transposed float8 copies.
          Eager: the bf16 input is saved and re-cast in backward. Compiled: the amax fuses into
          the kernel producing the tensor, and one cast kernel writes both layouts (read 2,
          write 2), the transposed input kept for backward. FSDP's float8 all-gather casts the
          weight shard before gathering (its amax precomputed once a step for all weights:
          1/shard of the work, not charged); its transposed copy is still made for dX.
        - rowwise: per-row scales along each GEMM's reduction dimension, so each of X, W, dY is
          cast twice along different axes (compiled, the roofline's two kernels: read 2, write
          1 + 2 bf16 transposed; then read 2, write 1); the backward GEMMs run cuBLAS's
          tensorwise kernel with unit scales and an elementwise post-scale (pytorch/ao#1325),
          fused into its consumer when compiled; weights all-gathered in bf16."""
        x, w, dy = float(m * k), float(n * k), float(m * n)
        fwd, comp = direction == "forward", self.compile
        casts: list[tuple[str, float]] = []

        def add(who: str, elements: float, steps: list[tuple[str, float]]) -> None:
            """One kernel per (step, bytes an element) of casting `who`."""
            casts.extend((f"{who} {step}" if who else step, b * elements) for step, b in steps)

        if self.float8 == "tensorwise":
            plain = [("amax", 2.0), ("cast", 3.0)]
            with_t = [*plain, ("transpose", 2.0)]
            both_layouts = [("cast+transpose", 4.0)]
            ag8 = self.float8_all_gather
            if fwd:
                add("input", x, both_layouts if comp else plain)
                if not ag8:
                    add("weight", w, [("amax", 2.0), *both_layouts] if comp else plain)
            else:
                add("dY", dy, both_layouts if comp else with_t)
                if not comp:
                    add("input", x, with_t)
                if ag8:
                    add("", w, [("weight transpose", 2.0)])
                elif not comp:
                    add("weight", w, with_t)
        else:  # rowwise
            two_axes = [("cast dim0+transpose", 5.0), ("cast dim1", 3.0)]
            eager_dim0 = [("amax", 2.0), ("cast", 3.0)]
            eager_dim1 = [("transpose", 4.0), ("amax dim1", 2.0), ("cast dim1", 3.0)]
            if fwd:
                add("input", x, two_axes if comp else eager_dim0)
                add("weight", w, two_axes if comp else eager_dim0)
            else:
                add("dY", dy, two_axes if comp else eager_dim0 + eager_dim1)
                if not comp:
                    add("input", x, eager_dim1)
                    add("weight", w, eager_dim1)
                    add("", x, [("dgrad post-scale", 4.0)])
                    add("", w, [("wgrad post-scale", 4.0)])
        return casts

    def _layer_kernels(self, unit: UnitSpec, direction: str) -> list[Kernel]:
        mdl = self.model
        assert mdl is not None
        t, d, kv, f = self.tokens_per_gpu, mdl.hidden, mdl.kv_dim, mdl.ffn_hidden
        p = mdl.dtype_nbytes
        mlp = ([("mlp gate+up", t, 2 * f, d), ("mlp down", t, d, f)] if mdl.mlp == "swiglu"
               else [("mlp up", t, f, d), ("mlp down", t, d, f)])
        linears = [("qkv", t, d + 2 * kv, d), ("attn out", t, d, d), *mlp]
        ks = (self._gemms_fp8(linears, direction) if self.float8 != "none"
              else self._gemms(linears, direction))
        bwd = direction == "backward"
        if self.attention in ("flash", "triton"):
            attn_fwd = mdl.attention_core_flops_per_token(self.seq_len, self.rt.causal_skip) * t
            ks.append(self.attention_kernel("attention", attn_fwd * (2.5 if bwd else 1.0), bwd))
        else:  # eager: two batched GEMMs over the whole score matrix, softmax through HBM
            s_, hd, h = self.seq_len, mdl.head_dim, mdl.heads
            seqs = max(1, t // max(1, s_))
            for name in ("scores q.k", "attention x v"):
                g = self.gemm(name, s_, s_ if name.startswith("scores") else hd,
                              hd if name.startswith("scores") else s_)
                mult = (2 if bwd else 1) * seqs * h
                ks.append(Kernel(name, g.flops * mult, g.nbytes * mult, g.time_s * mult))
            # scale+mask+softmax: write scores, read them, write probabilities (x2 backward)
            ks.append(self.memory_bound("softmax", 3.0 * 2 * h * s_ * t * (2 if bwd else 1)))
        act_elems = 3 * f if mdl.mlp == "swiglu" else 2 * f  # read gate, up; write product
        fwd_bytes = (self._compiled_regions(t, d, kv, act_elems, p) if self.compile
                     else self._eager_memory_bound(t, d, kv, act_elems, p))
        for name, b in fwd_bytes.items():
            ks.append(self.memory_bound(name, b * (2.0 if bwd else 1.0)))
        if bwd and mdl.bias and not self.compile:
            ks.append(self.memory_bound("linear bias grads", self.bias_grad_bytes(linears, p)))
        if bwd and self.attention == "triton" and not self.compile:
            ks.append(self.memory_bound("q/k/v split grads", self.split_grad_bytes(t, d, kv, p)))
        ks.extend(self.fsdp_kernels(unit, direction))
        return ks

    @staticmethod
    def bias_grad_bytes(linears: list[tuple[str, int, int, int]], p: int) -> float:
        """Bytes an eager layer's linear biases cost in backward (model.bias): nn.Linear runs
        a contiguous 2-D or 3-D input with a bias as one `addmm` (aten/src/ATen/native/
        Linear.cpp, `linear`), the bias added in the GEMM (cuBLASLt's bias epilogue: nothing
        apart in forward); addmm's derivative passes the output gradient to its broadcast
        bias (tools/autograd/derivatives.yaml: `self: maybe_multiply(grad, beta.conj())`),
        and autograd sums it back to the bias's shape over the tokens (`sum_to`): one
        reduction kernel a linear, reading its (tokens x out features) gradient once. A
        compiled layer fuses the sum into the kernel that produces the gradient: not
        charged."""
        return float(sum(m * n for _, m, n, _ in linears) * p)

    @staticmethod
    def split_grad_bytes(t: int, d: int, kv: int, p: int) -> float:
        """Bytes the backward of the fused projection's split into q, k and v costs when they
        reach the attention kernel as views (`training.attention: triton`): llm-foundry's
        attention splits `Wqkv`'s output (`qkv.split` / `qkv.chunk`, llmfoundry/models/layers/
        attention.py at b2a43a1; mosaicml/examples' MosaicGPT at 9fa3ceb) and the Triton
        FlashAttention returns dq, dk and dv as three tensors (flash_attn_triton.py
        `FlashAttnFunc.backward`), so autograd assembles the projection's output gradient by
        concatenating them (split's derivative is a `cat`): one read and one write of a
        (tokens x (d + 2 kv)) tensor. The kernel's own passes (its delta preprocessing and the
        fp32 dq copy) belong to the attention kernel, whose slowdown is measured whole."""
        return float(2 * t * (d + 2 * kv) * p)

    def _eager_memory_bound(self, t: int, d: int, kv: int, act_elems: int, p: int
                            ) -> dict[str, float]:
        """A layer's memory-bound kernels run eagerly: name -> forward bytes."""
        mdl = self.model
        fwd_bytes = {"rmsnorm x2": 2 * self._norm_bytes_per_element(p) * t * d}
        if mdl.position == "rope":
            fwd_bytes["rope q,k"] = self._rope_bytes_per_element(p) * t * (d + kv)
        if self.attention != "triton":
            # q, k, v split from the fused projection into the attention kernel's layout (read
            # + write), and the attention output back. llm-foundry's Triton path passes strided
            # views (split + einops rearrange; the kernel needs only the last dim contiguous):
            # no copies (llmfoundry/models/layers/attention.py, v0.3.0)
            fwd_bytes["qkv layout"] = 2 * t * (d + 2 * kv) * p + 2 * t * d * p
        fwd_bytes |= {"mlp activation": t * act_elems * p, "residual add x2": 2 * 3 * t * d * p}
        return fwd_bytes

    def _norm_bytes_per_element(self, p: int) -> float:
        """Bytes an eager RMSNorm moves per element: fused, read x and write y (2p); composite
        (torchtitan's RMSNorm at eef8bb2, torchtitan/models/norms.py: `self._norm(x.float())
        .type_as(x) * self.weight`, `_norm` = `x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)
        + eps)`): cast (p + 4), pow (4 + 4), mean (4), rsqrt per row, multiply (4 + 4), cast
        back (4 + p), weight multiply (2p): 28 + 4p."""
        return 2.0 * p if (self.eager_norm or self.eager_ops) == "fused" else 28.0 + 4.0 * p

    def _rope_bytes_per_element(self, p: int) -> float:
        """Bytes eager RoPE moves per element of q and k: fused 2p; composite (torchtitan's
        `apply_rotary_emb`: view_as_complex(x.float()) * freqs_cis, view_as_real, type_as):
        cast (p + 4), complex multiply (4 + 4), cast back (4 + p): 16 + 2p."""
        return 2.0 * p if (self.eager_rope or self.eager_ops) == "fused" else 16.0 + 2.0 * p

    def _compiled_regions(self, t: int, d: int, kv: int, act_elems: int, p: int
                          ) -> dict[str, float]:
        """A compiled layer's memory-bound kernels: Inductor leaves GEMMs and attention as
        library kernels and fuses each run of pointwise / reduction ops between them into one
        Triton kernel (torchtitan compiles each TransformerBlock, fullgraph: pytorch/torchtitan
        v0.2.0 models/llama3/infra/parallelize.py apply_compile; residual add + RMSNorm as one
        persistent reduction: meta-pytorch/tritonbench#994; silu x mul one pointwise kernel):
        the first norm (read x, write its output); RoPE on q and k with the q/k/v layout copy
        for the attention kernel (read and write q, k, v once); the attention output's layout
        copy; residual add + second norm (read x and the attention output, write both sums);
        the MLP activation; the last residual add. Name -> forward bytes."""
        mdl = self.model
        rope = mdl.position == "rope"
        copies = self.attention != "triton"
        regions = {"rmsnorm": 2 * t * d * p}
        if copies:
            regions["rope+qkv layout" if rope else "qkv layout"] = 2 * t * (d + 2 * kv) * p
            regions["attn out layout"] = 2 * t * d * p
        elif rope:
            regions["rope q,k"] = 2 * t * (d + kv) * p
        regions |= {"residual add+rmsnorm": 4 * t * d * p,
                    "mlp activation": t * act_elems * p,
                    "residual add": 3 * t * d * p}
        return regions

    def gathered_nbytes(self, unit: UnitSpec) -> int:
        """Bytes FSDP all-gathers for `unit` under this run's float8 settings."""
        return gathered_nbytes(self.model, unit, self.float8, self.float8_all_gather)

    def fsdp_kernels(self, unit: UnitSpec, direction: str) -> list[Kernel]:
        """FSDP's own memory-bound work around a unit's compute: FSDP1's on the unsharded
        gradient (`fsdp_grad_kernel`, backward); FSDP2's copies between its collectives'
        flat buffers and the per-parameter tensors (torch/distributed/fsdp/_fully_shard/
        _fsdp_collectives.py): `foreach_all_gather_copy_out` splits the gathered buffer into
        the unsharded parameters on the compute stream after each all-gather (read and write
        the gathered bytes: forward, and backward when FULL_SHARD gathers again; the root
        stays gathered), and `foreach_reduce` `torch._chunk_cat`s the gradients into the
        reduce-scatter input in the reduce dtype (read p, write r bytes a parameter; the
        average is NCCL's ReduceOp.AVG, no separate division)."""
        bwd = direction == "backward"
        if self.fsdp_version == 1:
            return [self.fsdp_grad_kernel(unit)] if bwd else []
        p = self.model.dtype_nbytes if self.model else 2
        r = self.reduce_nbytes or p
        out = []
        if self.sharded and (not bwd or self.regathered(unit)):
            out.append(self.memory_bound("fsdp2 all-gather copy-out",
                                         2.0 * self.gathered_nbytes(unit)))
        if bwd:
            out.append(self.memory_bound("fsdp2 reduce-scatter copy-in",
                                         float(unit.params * (p + r))))
        return out

    def fsdp_grad_kernel(self, unit: UnitSpec) -> Kernel:
        """FSDP1's work on a unit's unsharded gradient before the reduce-scatter:
        - the flat gradient assembled from the parameters' gradients: the module's parameters
          are `torch.split` views of the flat parameter (torch/distributed/fsdp flat_param.py,
          `_get_unflat_views_unaligned`), and autograd's backward of split is a `cat`
          (tools/autograd/derivatives.yaml `split_with_sizes_backward`): read and write p bytes
          per parameter;
        - the post-backward hook (torch/distributed/fsdp/_runtime_utils.py): a cast to the
          reduce dtype when it differs from the parameters' (`flat_param.grad.to(
          handle._reduce_dtype)`: read p, write r bytes per parameter), then
          `_div_if_needed(padded_unsharded_grad, predivide)` in place (read and write r)."""
        p = self.model.dtype_nbytes if self.model else 2
        r = self.reduce_nbytes or p
        per_param = 2 * p + (p + r if r != p else 0) + 2 * r
        return self.memory_bound("fsdp grad cat+cast+predivide", float(unit.params * per_param))

    def _root_kernels(self, unit: UnitSpec, direction: str) -> list[Kernel]:
        mdl = self.model
        assert mdl is not None
        t, d, v, p = self.tokens_per_gpu, mdl.hidden, mdl.vocab, mdl.dtype_nbytes
        bwd = direction == "backward"
        ks = self._gemms([("lm head", t, v, d)], direction)
        # embedding gather (read rows, write activations; a learned position table: read it
        # and the activations, write the sum) and final norm
        emb = (2 + (3 if mdl.position == "learned" else 0)) * t * d * p
        ks.append(self.memory_bound("embedding", emb * (2.0 if bwd else 1.0)))
        ks.append(self.memory_bound("final rmsnorm", self._norm_bytes_per_element(p) * t * d
                                    * (2.0 if bwd else 1.0)))
        # cross-entropy in fp32 over the logits: forward reads the bf16 logits and writes an
        # fp32 copy, log-softmax reads it and writes fp32 (p + 4 + 4 + 4 bytes per logit);
        # backward writes the fp32 softmax gradient, reads it and writes the bf16 gradient.
        # A fused kernel reads the logits once and writes the gradient in place.
        fp32_forward = t * v * (p + 12)  # PyTorch's forward cross-entropy in fp32
        if self.cross_entropy == "fused":
            ce = t * v * p if not bwd else t * v * 2 * p
        else:
            ce = fp32_forward if not bwd else t * v * (4 + 4 + 4 + p)
        ks.append(self.memory_bound("cross-entropy", float(ce)))
        if self.train_metric_passes and not bwd:  # the trainer's metrics, each one such pass
            ks.append(self.memory_bound("train metrics",
                                        float(self.train_metric_passes * fp32_forward)))
        ks.extend(self.fsdp_kernels(unit, direction))
        return ks
