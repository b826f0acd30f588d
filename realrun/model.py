"""A Llama-style decoder built from a `ModelSpec`: RMSNorm, RoPE, grouped-query attention, SwiGLU.

The same code builds the tiny CPU flavour and a real Llama 3.1 8B. Shapes use
B = batch, T = sequence length, D = hidden, H = query heads, K = kv heads, Dh = head dim,
F = ffn hidden, V = vocab. The FSDP units (see `realrun.sharding`) are the decoder blocks in
`model.layers` plus the root (token embedding, final norm, output head), as in `ModelSpec.units`.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
    set_checkpoint_early_stop,
)

from simfed.spec import ModelSpec, TrainingSpec

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
INIT_STD = 0.02


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * w  (Zhang & Sennrich 2019), computed in fp32."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., D) -> (..., D)
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.to(x.dtype) * self.weight


def rope_tables(seq_len: int, head_dim: int, theta: float,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of the rotary angles t * theta^(-2i/Dh), each (T, Dh/2), fp32 (Su et al. 2021)."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=device)
                         / head_dim)  # (Dh/2,)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64, device=device), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs (x[2i], x[2i+1]) of x (B, heads, T, Dh) by the angles (T, Dh/2)."""
    x32 = x.float().unflatten(-1, (-1, 2))  # (B, h, T, Dh/2, 2)
    x0, x1 = x32[..., 0], x32[..., 1]
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return out.flatten(-2).to(x.dtype)  # (B, h, T, Dh)


class Attention(nn.Module):
    """Causal grouped-query self-attention through SDPA; K kv heads serve H/K query heads each."""

    def __init__(self, spec: ModelSpec, dtype: torch.dtype, device: torch.device):
        super().__init__()
        d, kv = spec.hidden, spec.kv_dim
        self.heads, self.kv_heads, self.head_dim = spec.heads, spec.kv_heads, spec.head_dim
        self.q_proj = nn.Linear(d, d, bias=False, dtype=dtype, device=device)
        self.k_proj = nn.Linear(d, kv, bias=False, dtype=dtype, device=device)
        self.v_proj = nn.Linear(d, kv, bias=False, dtype=dtype, device=device)
        self.o_proj = nn.Linear(d, d, bias=False, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape  # (B, T, D)
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)  # (B,K,T,Dh)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)  # (B,K,T,Dh)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # (B,H,T,Dh)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))  # (B, T, D)


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)) (Shazeer 2020)."""

    def __init__(self, spec: ModelSpec, dtype: torch.dtype, device: torch.device):
        super().__init__()
        d, f = spec.hidden, spec.ffn_hidden
        self.gate_proj = nn.Linear(d, f, bias=False, dtype=dtype, device=device)
        self.up_proj = nn.Linear(d, f, bias=False, dtype=dtype, device=device)
        self.down_proj = nn.Linear(f, d, bias=False, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, T, D) via (B, T, F)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def _op_save_list() -> set:
    """Ops whose outputs torchtitan's selective op policy keeps (pytorch/torchtitan v0.2.0,
    models/llama3/infra/parallelize.py `_op_sac_save_list`): matmuls and the attention kernels
    (SDPA's CPU kernel added: realrun runs on CPU too)."""
    aten = torch.ops.aten
    names = ("_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_cudnn_attention")
    return {aten.mm.default, aten.max.default,
            *(getattr(aten, n).default for n in names if hasattr(aten, n))}


def op_policy_context():
    """torchtitan's selective op checkpointing (torchtitan/distributed/activation_checkpoint.py
    `_custom_policy` at v0.2.0): keep every saved-list op's output except every second aten.mm
    of the block (wq, wk, wv, wo, w1, w3, w2 in call order: wk, wo, w3 are re-run), recompute the
    rest; the forward and the recompute count their matmuls apart."""
    save, meta = _op_save_list(), defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        key = "recompute" if ctx.is_recompute else "forward"
        if func == torch.ops.aten.mm.default:
            meta[key] += 1
        keep = func in save and not (func == torch.ops.aten.mm.default and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


class DecoderBlock(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then + mlp(norm(x)). One FSDP unit."""

    def __init__(self, spec: ModelSpec, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.attn_norm = RMSNorm(spec.hidden, spec.norm_eps, dtype, device)
        self.attn = Attention(spec, dtype, device)
        self.mlp_norm = RMSNorm(spec.hidden, spec.norm_eps, dtype, device)
        self.mlp = SwiGLU(spec, dtype, device)

        # activation checkpointing (Llama.set_checkpointing): PyTorch's non-reentrant checkpoint
        # inside the block's forward, so FSDP2's hooks (on the block's call) stay outside it,
        # as torchtitan wraps blocks before fully_shard; early_stop as
        # torch.utils.checkpoint.set_checkpoint_early_stop
        self.checkpointed = False
        self.early_stop = True
        self.op_policy = False  # training.activation_checkpointing: op

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.checkpointed and torch.is_grad_enabled():
            kw = {"context_fn": op_policy_context} if self.op_policy else {}
            with set_checkpoint_early_stop(self.early_stop):
                return checkpoint(self._block, x, cos, sin, use_reentrant=False, **kw)
        return self._block(x, cos, sin)

    def _block(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)  # (B, T, D)
        return x + self.mlp(self.mlp_norm(x))  # (B, T, D)


class Llama(nn.Module):
    """Token ids (B, T) -> logits (B, T, V)."""

    def __init__(self, spec: ModelSpec, seq_len: int, device: torch.device):
        super().__init__()
        dtype = TORCH_DTYPES[spec.dtype]
        self.spec = spec
        self.embed = nn.Embedding(spec.vocab, spec.hidden, dtype=dtype, device=device)
        self.layers = nn.ModuleList(
            DecoderBlock(spec, dtype, device) for _ in range(spec.layers)
        )
        self.norm = RMSNorm(spec.hidden, spec.norm_eps, dtype, device)
        self.head = nn.Linear(spec.hidden, spec.vocab, bias=False, dtype=dtype, device=device)
        if spec.tied_embeddings:
            self.head.weight = self.embed.weight  # (V, D), one parameter, in the root unit
        cos, sin = rope_tables(seq_len, spec.head_dim, spec.rope_theta, device)
        self.register_buffer("rope_cos", cos, persistent=False)  # (T, Dh/2)
        self.register_buffer("rope_sin", sin, persistent=False)  # (T, Dh/2)
        self._init_weights()

    @torch.no_grad()
    def _init_weights(self) -> None:
        """N(0, 0.02) everywhere; residual output projections scaled by 1/sqrt(2 * layers)
        (GPT-2, Radford et al. 2019); norms start at 1."""
        out_std = INIT_STD / math.sqrt(2 * self.spec.layers)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                continue
            std = out_std if name.endswith(("o_proj.weight", "down_proj.weight")) else INIT_STD
            p.normal_(0.0, std)

    def set_checkpointing(self, training: TrainingSpec) -> list[int]:
        """Checkpoint the decoder blocks simfed's recompute model charges
        (`TrainingSpec.layer_checkpointed`: FSDP unit = block index + 1), with
        `training.checkpoint_early_stop`, every block under torchtitan's selective op policy
        for `op`; returns the checkpointed block indices."""
        op = training.ac_policy == "op"
        for i, layer in enumerate(self.layers):
            layer.checkpointed = op or training.layer_checkpointed(i + 1)
            layer.op_policy = op
            layer.early_stop = training.checkpoint_early_stop
        return [i for i, layer in enumerate(self.layers) if layer.checkpointed]

    def set_compile(self, training: TrainingSpec) -> bool:
        """`training.compile`: torch.compile each decoder block's forward (torchtitan's
        per-block compile, after activation checkpointing and before FSDP: the block's FSDP2
        hooks, registered on the module call, stay outside the compiled code)."""
        if training.compile:
            for layer in self.layers:
                layer.forward = torch.compile(layer.forward)
        return training.compile

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]  # (T, Dh/2)
        x = self.embed(tokens)  # (B, T, D)
        for layer in self.layers:
            x = layer(x, cos, sin)  # (B, T, D)
        return self.head(self.norm(x))  # (B, T, V)


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor,
                    reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy in nats of logits (B, T, V) against targets (B, T), computed in fp32."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction=reduction)
