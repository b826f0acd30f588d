"""A Llama-family decoder from its dimensions: parameters, bytes, FLOPs and activations per unit.

FSDP units follow the paper's wrapping: one unit per decoder layer plus a root unit holding the
token embedding, the final RMSNorm and the output head (tied to the embedding or not).

FLOP conventions (Kaplan et al. 2020; Chowdhery et al. 2022, PaLM appendix B; nanoGPT
`estimate_mfu`): a matmul of an (m x k) by (k x n) costs 2mkn FLOPs; backward costs twice the
forward for matmuls. Attention scores (QK^T) and the weighted sum (AV) cost 4 * seq * d_attn
FLOPs per token per layer in the forward pass; `causal_skip` halves that, as FlashAttention-style
SDPA kernels skip the masked half of a causal score matrix.
"""

from __future__ import annotations

from dataclasses import dataclass

from .schema import SpecError, param
from .units import dtype_nbytes


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    name: str = param("llama", doc="free-form label")
    layers: int = param(ge=1, doc="decoder layers")
    hidden: int = param(ge=1, doc="model width d")
    ffn_hidden: int = param(ge=1, doc="SwiGLU inner width")
    heads: int = param(ge=1, doc="query heads")
    kv_heads: int = param(ge=1, doc="key/value heads (GQA)")
    vocab: int = param(ge=1, doc="vocabulary size")
    tied_embeddings: bool = param(False, doc="output head shares the embedding matrix")
    dtype: str = param("bf16", choices=("bf16", "fp16", "fp32"), doc="parameter dtype")
    rope_theta: float = param(500000.0, gt=0, doc="RoPE base (realrun only)")
    norm_eps: float = param(1e-5, gt=0, doc="RMSNorm epsilon (realrun only)")
    position: str = param(
        "rope", choices=("rope", "learned"),
        doc="rope: rotary embedding on q and k in every layer (Llama); learned: a position "
        "table added to the token embedding (GPT/MPT; simulator only: realrun builds RoPE)")
    mlp: str = param(
        "swiglu", choices=("swiglu", "gelu"),
        doc="swiglu: gate, up (d x f) and down (f x d), Llama; gelu: up (d x f) and down "
        "(f x d), GPT/MPT (simulator only: realrun builds SwiGLU)")
    bias: bool = param(
        False, doc="the decoder layers' linear layers carry biases (GPT-2 and MPT's default; "
        "Llama has none). The kernel model charges their gradients in backward (simulator "
        "only; the bias parameters themselves, under 0.1% of a layer's, are not counted)")

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise SpecError(
                f"model.hidden: {self.hidden} is not divisible by model.heads {self.heads}"
            )
        if self.heads % self.kv_heads:
            raise SpecError(
                f"model.kv_heads: {self.heads} query heads are not divisible by "
                f"{self.kv_heads} kv heads"
            )

    # ---- shapes -------------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def dtype_nbytes(self) -> int:
        return dtype_nbytes(self.dtype)

    # ---- parameters ---------------------------------------------------------------------
    @property
    def attention_params(self) -> int:
        """q and o projections (d x d), k and v projections (d x kv_dim); no biases."""
        return 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_dim

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of the MLP: SwiGLU gate, up, down; GELU up, down."""
        return 3 if self.mlp == "swiglu" else 2

    @property
    def mlp_params(self) -> int:
        """SwiGLU: gate and up (d x f), down (f x d); GELU: up and down."""
        return self.mlp_matrices * self.hidden * self.ffn_hidden

    @property
    def layer_params(self) -> int:
        """One decoder layer: attention + MLP + two RMSNorm weight vectors."""
        return self.attention_params + self.mlp_params + 2 * self.hidden

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def root_params(self) -> int:
        """Root FSDP unit: embedding, final norm and (if untied) the output head."""
        head = 0 if self.tied_embeddings else self.embedding_params
        return self.embedding_params + self.hidden + head

    @property
    def total_params(self) -> int:
        return self.layers * self.layer_params + self.root_params

    # ---- FSDP units ---------------------------------------------------------------------
    def units(self, seq_len: int, causal_skip: bool = True) -> tuple[UnitSpec, ...]:
        """FSDP units in forward execution order: root first (its all-gather opens the forward
        pass; its compute is the embedding lookup at the start and the head at the end), then the
        decoder layers."""
        tokens_fwd_layer = self.layer_forward_flops_per_token(seq_len, causal_skip)
        attn = self.attention_core_flops_per_token(seq_len, causal_skip)
        root_fwd = 2 * self.hidden * self.vocab  # output head matmul per token
        root = UnitSpec(
            index=0,
            name="root",
            params=self.root_params,
            nbytes=self.root_params * self.dtype_nbytes,
            fwd_flops_per_token=float(root_fwd),
            bwd_flops_per_token=float(2 * root_fwd),
        )
        layers = tuple(
            UnitSpec(
                index=i + 1,
                name=f"layer{i}",
                params=self.layer_params,
                nbytes=self.layer_params * self.dtype_nbytes,
                fwd_flops_per_token=tokens_fwd_layer,
                # matmul backward = 2x forward; FlashAttention backward ~2.5x its forward
                bwd_flops_per_token=2 * (tokens_fwd_layer - attn) + 2.5 * attn,
            )
            for i in range(self.layers)
        )
        return (root, *layers)

    def attention_core_flops_per_token(self, seq_len: int, causal_skip: bool = True) -> float:
        """QK^T and AV per token per layer, forward: 4 * seq * (heads * head_dim)."""
        flops = 4.0 * seq_len * self.heads * self.head_dim
        return flops / 2 if causal_skip else flops

    def layer_forward_flops_per_token(self, seq_len: int, causal_skip: bool = True) -> float:
        matmul = 2.0 * (self.attention_params + self.mlp_params)
        return matmul + self.attention_core_flops_per_token(seq_len, causal_skip)

    def train_flops_per_token(self, seq_len: int, causal_skip: bool = True) -> float:
        """Forward + backward FLOPs per token of the whole model (about 6N + attention)."""
        return sum(
            u.fwd_flops_per_token + u.bwd_flops_per_token for u in self.units(seq_len, causal_skip)
        )

    # ---- activations --------------------------------------------------------------------
    def layer_activation_bytes_per_token(self, seq_len: int = 0, attention: str = "flash"
                                         ) -> int:
        """Tensors one decoder layer saves for backward, per token, without activation
        checkpointing: the first norm's input and output (2d), q (d), k and v (2 kv_dim), the
        attention output (d, also the output projection's input), the second norm's input and
        output (2d), and the MLP's: SwiGLU gate, up, silu(gate) and their product (4f); GELU
        the up projection's output and the GELU's (2f). A fused (flash) attention kernel keeps
        no score matrix; an eager one keeps the softmax output (heads x seq per token).
        Cf. Korthikanti et al. 2022, sec. 4 (34 sbh with dropout masks and eager attention;
        32 sbh here for a GELU MLP, flash attention, no dropout), adapted to GQA and SwiGLU."""
        elems = 6 * self.hidden + 2 * self.kv_dim + (4 if self.mlp == "swiglu" else 2) \
            * self.ffn_hidden
        if attention == "eager":
            elems += self.heads * seq_len
        return elems * self.dtype_nbytes

    def layer_op_sac_bytes_per_token(self) -> int:
        """What a layer keeps under torchtitan's selective op checkpointing (`op`): its input
        (d), the saved matmuls' outputs wq (d), wv (kv_dim), w1 (f, a GELU MLP's up) and w2
        (d), and the attention output (d); the attention kernel's log-sum-exp is small."""
        return (4 * self.hidden + self.kv_dim + self.ffn_hidden) * self.dtype_nbytes

    def logits_bytes_per_token(self, cross_entropy: str = "pytorch") -> int:
        """Logits alive at the loss: the model-dtype logits, plus (PyTorch's cross-entropy) an
        fp32 copy and its fp32 log-softmax; a fused cross-entropy writes the gradient in place
        of the logits."""
        extra = 4 + 4 if cross_entropy == "pytorch" else 0
        return self.vocab * (self.dtype_nbytes + extra)


@dataclass(frozen=True, kw_only=True)
class UnitSpec:
    """One FSDP unit: what is all-gathered and reduce-scattered, and the compute it wraps."""

    index: int
    name: str
    params: int
    nbytes: int
    fwd_flops_per_token: float
    bwd_flops_per_token: float
