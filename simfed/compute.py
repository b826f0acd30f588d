"""GPU compute time: forward and backward per FSDP unit from FLOPs at a calibrated efficiency,
and the optimizer step from the bytes it reads and writes."""

from __future__ import annotations

from dataclasses import dataclass

from .hardware import Hardware
from .spec.model import ModelSpec, UnitSpec
from .spec.scenario import ComputeRuntime, TrainingSpec
from .spec.units import dtype_nbytes


@dataclass(frozen=True, kw_only=True)
class ComputeModel:
    hw: Hardware
    rt: ComputeRuntime
    tokens_per_gpu: int  # micro_batch x seq_len per step

    def forward_s(self, unit: UnitSpec) -> float:
        flops = unit.fwd_flops_per_token * self.tokens_per_gpu
        return flops / (self.hw.peak_flops * self.rt.efficiency_forward)

    def backward_s(self, unit: UnitSpec) -> float:
        flops = unit.bwd_flops_per_token * self.tokens_per_gpu
        return flops / (self.hw.peak_flops * self.rt.efficiency_backward)

    def recompute_s(self, unit: UnitSpec, forward_s: float, train: TrainingSpec) -> float:
        """Forward time re-run in the backward of `unit` under the checkpointing policy:
        a decoder layer's whole forward when checkpointed; selective checkpoints a share of the
        layers, spread evenly (layer i is checkpointed when floor(i f) > floor((i-1) f))."""
        frac = train.checkpointed_layers_fraction
        i = unit.index
        if i == 0 or frac <= 0:
            return 0.0
        return forward_s if int(i * frac + 1e-9) > int((i - 1) * frac + 1e-9) else 0.0

    def optimizer_s(self, shard_params: float, model: ModelSpec, train: TrainingSpec) -> float:
        """AdamW over the local shard reads param, grad, m, v and writes param, m, v
        (SGD: reads param and grad, writes param)."""
        p = model.dtype_nbytes
        s = dtype_nbytes(train.optimizer_state_dtype)
        per_param = 2 * p + p + 4 * s if train.optimizer == "adamw" else 3 * p
        return shard_params * per_param / (self.hw.hbm_Bps * self.rt.optimizer_hbm_efficiency)
