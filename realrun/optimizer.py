"""The optimizer of one model copy and its learning-rate schedule.

AdamW (or SGD) over this rank's parameter shards, so optimizer state is local to the rank and to
its federation group. Its state dtype is the parameter dtype (bf16 states with bf16 parameters,
as in the paper). LR schedule as in the paper's code: linear warm-up from 0 at step 0 over
`warmup_steps`, then cosine decay towards 0 over the remaining steps (or constant).
"""

from __future__ import annotations

import torch
from torch import nn

from simfed.spec import TrainingSpec
from simfed.spec import lr_factor as schedule_factor


def lr_factor(step: int, t: TrainingSpec) -> float:
    """Multiplier of training.lr at optimizer step `step` (0-based): `simfed.spec.lr_factor`."""
    return schedule_factor(step, steps=t.steps, warmup_steps=t.warmup_steps,
                           schedule=t.lr_schedule)


def adamw_kernels(t: TrainingSpec, device: torch.device) -> dict[str, bool]:
    """torch.optim.AdamW's implementation for `training.optimizer_kernels`: fused (on CUDA; the
    multi-tensor path on CPU), foreach, or per_param (the per-parameter loop)."""
    if t.optimizer_kernels == "fused" and device.type == "cuda":
        return {"fused": True}
    return {"foreach": t.optimizer_kernels != "per_param"}


def clip_gradients(params: list[torch.Tensor], t: TrainingSpec) -> None:
    """`training.grad_clip` > 0: scale the gradients to that total norm at most
    (torch.nn.utils.clip_grad_norm_; FSDP2's DTensor gradients reduce their norm over their
    mesh, so each federation group clips on its own)."""
    if t.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(params, t.grad_clip)


def build_optimizer(model: nn.Module, t: TrainingSpec, device: torch.device
                    ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    params = list(model.parameters())
    if t.optimizer == "adamw":
        opt: torch.optim.Optimizer = torch.optim.AdamW(
            params, lr=t.lr, betas=t.betas, weight_decay=t.weight_decay,
            **adamw_kernels(t, device)
        )
    else:
        opt = torch.optim.SGD(params, lr=t.lr, weight_decay=t.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, t))
    return opt, sched
