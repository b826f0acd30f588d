"""Peak memory per GPU: sharded state, unsharded parameter and gradient buffers, activations.

Static: the local shard of parameters and gradients and AdamW's two moments, in the optimizer's
state dtype where it is wider than the model dtype (FSDP's fp32 master shards under mixed
precision: the sharded gradient is cast back to the parameter's dtype after its reduction).
Dynamic: unsharded units alive at once (measured on the simulated timeline: FSDP's all-gathers
run ahead of compute when the host runs ahead), one unsharded gradient buffer, and the
activations at the end of the forward pass: every layer's saved tensors (by attention kernel),
a checkpointed layer's input only, and the logits at the loss (by cross-entropy kernel); with
checkpointing, the backward re-creates one layer's tensors at a time on top of that. The caching
allocator's fragmentation scales the dynamic part. Plus a fixed runtime overhead (CUDA context,
NCCL buffers).
"""

from __future__ import annotations

from dataclasses import dataclass

from .spec.model import ModelSpec
from .spec.scenario import MemoryRuntime, TrainingSpec
from .spec.units import GiB_to_bytes, dtype_nbytes


@dataclass(frozen=True, kw_only=True)
class MemoryBreakdown:
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    unsharded_bytes: float
    activations_bytes: float
    overhead_bytes: float
    fragmentation_bytes: float = 0.0

    @property
    def peak_bytes(self) -> float:
        return (self.params_bytes + self.grads_bytes + self.optimizer_bytes
                + self.unsharded_bytes + self.activations_bytes + self.overhead_bytes
                + self.fragmentation_bytes)

    def as_dict(self) -> dict[str, float]:
        return {
            "params": self.params_bytes, "grads": self.grads_bytes,
            "optimizer": self.optimizer_bytes, "unsharded": self.unsharded_bytes,
            "activations": self.activations_bytes, "overhead": self.overhead_bytes,
            "fragmentation": self.fragmentation_bytes,
        }


def activation_bytes(model: ModelSpec, train: TrainingSpec) -> float:
    """Activations alive at the peak (end of forward; with checkpointing, plus the one layer
    whose forward the backward is re-running)."""
    p = model.dtype_nbytes
    tokens = train.micro_batch * train.seq_len
    act_layer = model.layer_activation_bytes_per_token(train.seq_len, train.attention)
    if train.ac_policy == "op":  # every layer keeps its input and the saved ops' outputs
        return float(tokens * (model.layers * model.layer_op_sac_bytes_per_token()
                               + act_layer + model.logits_bytes_per_token(train.cross_entropy)))
    ckpt = round(model.layers * train.checkpointed_layers_fraction)  # keep only their inputs
    recompute = act_layer if ckpt else 0
    per_token = ((model.layers - ckpt) * act_layer + ckpt * model.hidden * p + recompute
                 + model.logits_bytes_per_token(train.cross_entropy))
    return float(tokens * per_token)


def memory_breakdown(
    model: ModelSpec, train: TrainingSpec, mem: MemoryRuntime, *, shard: int,
    peak_unsharded_units_bytes: float,
) -> MemoryBreakdown:
    p = model.dtype_nbytes
    shard_params = -(-model.total_params // shard)
    states = 2 if train.optimizer == "adamw" else 0
    s = dtype_nbytes(train.optimizer_state_dtype)
    master = max(p, s)  # the sharded params and grads
    activations = activation_bytes(model, train)
    largest_unit = max(u.nbytes for u in model.units(train.seq_len))
    unsharded = (peak_unsharded_units_bytes + largest_unit) if shard > 1 else 0.0
    return MemoryBreakdown(
        params_bytes=shard_params * master,
        grads_bytes=shard_params * master,
        optimizer_bytes=shard_params * states * s,
        unsharded_bytes=unsharded,
        activations_bytes=activations,
        overhead_bytes=GiB_to_bytes(mem.overhead_GiB),
        fragmentation_bytes=mem.fragmentation * (activations + unsharded),
    )
