"""The learning-rate schedule of the paper's code, shared by realrun (the optimizer) and simfed
(the convergence model): linear warm-up from 0 at step 0 over `warmup_steps`, then cosine decay
towards 0 over the remaining steps, or constant."""

from __future__ import annotations

import math


def lr_factor(step: int, *, steps: int, warmup_steps: int, schedule: str) -> float:
    """Multiplier of training.lr at optimizer step `step` (0-based)."""
    if step < warmup_steps:
        return step / warmup_steps
    if schedule == "constant":
        return 1.0
    span = max(1, steps - warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * (step - warmup_steps) / span))
