"""Peak memory per GPU: sharded state, unsharded parameter and gradient buffers, activations.

Static: the local shard of parameters and gradients (model dtype) and AdamW's two moments.
Dynamic: unsharded units alive at once (measured on the simulated timeline: FSDP's all-gathers
run ahead of compute when the host runs ahead), one unsharded gradient buffer, and the
activations of every layer (no activation checkpointing) plus the logits, all alive at the end of
the forward pass. Plus a fixed runtime overhead (CUDA context, NCCL buffers, allocator slack).
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

    @property
    def peak_bytes(self) -> float:
        return (self.params_bytes + self.grads_bytes + self.optimizer_bytes
                + self.unsharded_bytes + self.activations_bytes + self.overhead_bytes)

    def as_dict(self) -> dict[str, float]:
        return {
            "params": self.params_bytes, "grads": self.grads_bytes,
            "optimizer": self.optimizer_bytes, "unsharded": self.unsharded_bytes,
            "activations": self.activations_bytes, "overhead": self.overhead_bytes,
        }


def memory_breakdown(
    model: ModelSpec, train: TrainingSpec, mem: MemoryRuntime, *, shard: int,
    peak_unsharded_units_bytes: float,
) -> MemoryBreakdown:
    p = model.dtype_nbytes
    shard_params = -(-model.total_params // shard)
    states = 2 if train.optimizer == "adamw" else 0
    tokens = train.micro_batch * train.seq_len
    act_layer = model.layer_activation_bytes_per_token()
    ckpt = round(model.layers * train.checkpointed_layers_fraction)  # keep only their inputs
    activations = tokens * ((model.layers - ckpt) * act_layer + ckpt * model.hidden * p
                            + model.logits_bytes_per_token())
    largest_unit = max(u.nbytes for u in model.units(train.seq_len))
    return MemoryBreakdown(
        params_bytes=shard_params * p,
        grads_bytes=shard_params * p,
        optimizer_bytes=shard_params * states * dtype_nbytes(train.optimizer_state_dtype),
        unsharded_bytes=(peak_unsharded_units_bytes + largest_unit) if shard > 1 else 0.0,
        activations_bytes=float(activations),
        overhead_bytes=GiB_to_bytes(mem.overhead_GiB),
    )
