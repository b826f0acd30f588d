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


def build_optimizer(model: nn.Module, t: TrainingSpec, device: torch.device
                    ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    params = list(model.parameters())
    if t.optimizer == "adamw":
        fast = {"fused": True} if device.type == "cuda" else {"foreach": True}
        opt: torch.optim.Optimizer = torch.optim.AdamW(
            params, lr=t.lr, betas=t.betas, weight_decay=t.weight_decay, **fast
        )
    else:
        opt = torch.optim.SGD(params, lr=t.lr, weight_decay=t.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, t))
    return opt, sched
