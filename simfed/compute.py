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
    strided views), the MLP activation, two residual adds per layer; embedding gather, final norm
    and cross-entropy over the logits on the root unit; FSDP1's assembly of each unit's flat
    gradient (autograd's cat of the parameters' gradients), its cast to the reduce dtype and
    its in-place pre-division before the reduce-scatter. Backward moves
    about twice the forward's bytes (reads the saved input and the output gradient, writes the
    input gradient).
  - a fixed `kernel_gap_us` between consecutive kernels (launch and tail effects).
  Recompute under activation checkpointing re-runs a checkpointed layer's forward kernels.
The optimizer step reads and writes its state at HBM bandwidth (both models).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .hardware import Hardware
from .spec.model import ModelSpec, UnitSpec
from .spec.scenario import ComputeRuntime, TrainingSpec
from .spec.units import dtype_nbytes


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
    reduce_nbytes: int = 0  # gradient reduce dtype's bytes (0: the model dtype's)
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
        if not train.layer_checkpointed(unit.index):
            return 0.0
        if not train.checkpoint_early_stop:
            return forward_s
        return max(0.0, forward_s - self.early_stop_skipped_s(unit))

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
        return (ks["mlp down"].time_s + ks["residual add x2"].time_s / 2
                + 2 * self.rt.kernel_gap_us * 1e-6)

    def optimizer_s(self, shard_params: float, model: ModelSpec, train: TrainingSpec) -> float:
        """AdamW over the local shard reads param, grad, m, v and writes param, m, v
        (SGD: reads param and grad, writes param)."""
        p = model.dtype_nbytes
        s = dtype_nbytes(train.optimizer_state_dtype)
        per_param = 2 * p + p + 4 * s if train.optimizer == "adamw" else 3 * p
        return shard_params * per_param / (self.hw.hbm_Bps * self.rt.optimizer_hbm_efficiency)

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

    def unit_kernels(self, unit: UnitSpec, direction: str) -> list[Kernel]:
        key = (unit.index == 0, unit.params, direction)
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

    def _layer_kernels(self, unit: UnitSpec, direction: str) -> list[Kernel]:
        mdl = self.model
        assert mdl is not None
        t, d, kv, f = self.tokens_per_gpu, mdl.hidden, mdl.kv_dim, mdl.ffn_hidden
        p = mdl.dtype_nbytes
        mlp = ([("mlp gate+up", t, 2 * f, d), ("mlp down", t, d, f)] if mdl.mlp == "swiglu"
               else [("mlp up", t, f, d), ("mlp down", t, d, f)])
        ks = self._gemms([("qkv", t, d + 2 * kv, d), ("attn out", t, d, d), *mlp], direction)
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
        fwd_bytes = {"rmsnorm x2": 2 * 2 * t * d * p}
        if mdl.position == "rope":
            fwd_bytes["rope q,k"] = 2 * t * (d + kv) * p
        if self.attention != "triton":
            # q, k, v split from the fused projection into the attention kernel's layout (read
            # + write), and the attention output back. llm-foundry's Triton path passes strided
            # views (split + einops rearrange; the kernel needs only the last dim contiguous):
            # no copies (llmfoundry/models/layers/attention.py, v0.3.0)
            fwd_bytes["qkv layout"] = 2 * t * (d + 2 * kv) * p + 2 * t * d * p
        fwd_bytes |= {"mlp activation": t * act_elems * p, "residual add x2": 2 * 3 * t * d * p}
        for name, b in fwd_bytes.items():
            ks.append(self.memory_bound(name, b * (2.0 if bwd else 1.0)))
        if bwd:
            ks.append(self.fsdp_grad_kernel(unit))
        return ks

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
        ks.append(self.memory_bound("final rmsnorm", 2 * t * d * p * (2.0 if bwd else 1.0)))
        # cross-entropy in fp32 over the logits: forward reads the bf16 logits and writes an
        # fp32 copy, log-softmax reads it and writes fp32 (p + 4 + 4 + 4 bytes per logit);
        # backward writes the fp32 softmax gradient, reads it and writes the bf16 gradient.
        # A fused kernel reads the logits once and writes the gradient in place.
        if self.cross_entropy == "fused":
            ce = t * v * p if not bwd else t * v * 2 * p
        else:
            ce = t * v * (p + 12) if not bwd else t * v * (4 + 4 + 4 + p)
        ks.append(self.memory_bound("cross-entropy", float(ce)))
        if bwd:
            ks.append(self.fsdp_grad_kernel(unit))
        return ks
