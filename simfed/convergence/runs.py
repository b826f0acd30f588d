"""Training runs as the convergence models see them: what was trained (non-embedding parameters,
data), how (tokens per step per model copy, federation groups G and period K, outer optimizer,
the learning-rate schedule with its peak value) and the evaluation losses measured, whatever
the source: a `realrun converge-study` file or a published run (validation/convergence/)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..spec.schedule import lr_factor


@dataclass(frozen=True)
class Shape:
    """What a model needs to predict a run's loss curve (hashable: equal shapes are integrated
    once)."""

    params: float  # non-embedding parameters N (Kaplan et al. 2020, sec. 2.1)
    batch_tokens: float  # tokens per optimizer step per model copy
    steps: int
    lr: float  # peak learning rate
    warmup_steps: int = 0
    schedule: str = "cosine"
    groups: int = 1  # federation groups (model copies averaged); 1: one model
    aggregate_every: int = 0  # K; 0: no averaging
    outer: str = "average"  # average (FedAvg) | nesterov (DiLoCo's outer step)
    outer_lr: float = 1.0
    outer_momentum: float = 0.0
    loss_init: float = 0.0  # the untrained model's loss (nats/token)
    final_lr_fraction: float = 0.0  # cosine: decays to this fraction of the peak
    lr_knots: tuple[tuple[int, float], ...] = ()  # a published schedule: (step, lr), linear
    # which part of the run the model integrates (scaling.py): "whole" from step 0 (both
    # stages), "pre" (stage 1 alone, towards the unigram loss) or "post" (stage 2 alone, from
    # the unigram loss at step start_step; evaluation steps counted from there)
    segment: str = "whole"
    start_step: int = 0

    def lr_values(self) -> np.ndarray:
        if self.lr_knots:
            return _lr_knots(self.steps, self.warmup_steps, self.lr_knots)
        return _lr_values(self.steps, self.warmup_steps, self.schedule, self.lr,
                          self.final_lr_fraction)

    @property
    def length(self) -> int:
        """Steps the model integrates: from start_step to the end of the schedule."""
        return self.steps - self.start_step

    @property
    def federated(self) -> bool:
        return self.groups > 1 and self.aggregate_every > 0


@functools.lru_cache(maxsize=512)
def _lr_values(steps: int, warmup_steps: int, schedule: str, lr: float,
               final_fraction: float = 0.0) -> np.ndarray:
    """The paper's schedule (spec.schedule.lr_factor: warm-up from 0, cosine to 0 or constant);
    a cosine that ends at final_fraction of the peak is the same cosine lifted by it."""
    f = np.array([lr_factor(i, steps=steps, warmup_steps=warmup_steps, schedule=schedule)
                  for i in range(steps)])
    if final_fraction and schedule == "cosine":
        after = np.arange(steps) >= warmup_steps
        f[after] = final_fraction + (1.0 - final_fraction) * f[after]
    f = lr * f
    f.setflags(write=False)
    return f


@functools.lru_cache(maxsize=512)
def _lr_knots(steps: int, warmup_steps: int, knots: tuple[tuple[int, float], ...]
              ) -> np.ndarray:
    """A published schedule: linear between its (step, lr) points; before the first, a linear
    warm-up from 0 at step 0 (to the first point's value at its step)."""
    at = np.array([k[0] for k in knots], float)
    lr = np.array([k[1] for k in knots], float)
    if at[0] > 0:
        at, lr = np.concatenate([[0.0], at]), np.concatenate([[0.0], lr])
    f = np.interp(np.arange(steps, dtype=float), at, lr)
    f.setflags(write=False)
    return f


@dataclass(frozen=True)
class Run:
    """One measured run: its shape and its evaluation points (steps taken, loss)."""

    key: str
    shape: Shape
    eval_steps: tuple[int, ...]
    eval_loss: tuple[float, ...]
    seed: int = 0
    source: str = ""  # the study or published file
    tags: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def final_loss(self) -> float:
        return self.eval_loss[-1]


def runs_of_study(study: dict[str, Any]) -> list[Run]:
    """Every run of a `realrun converge-study` file (read by fit.read_study), with the study's
    model and data attached as tags (the split rules read them)."""
    m = study["model"]
    n = m.get("non_embedding_params") or (m["params"] - m["vocab"] * m["hidden"])
    out = []
    for r in study["runs"]:
        outer = r.get("outer_optimizer") or "average"
        shape = Shape(
            params=float(n), batch_tokens=float(r["batch_per_model"] * r["seq_len"]),
            steps=int(r["steps"]), lr=float(r["lr"]), warmup_steps=int(r["warmup_steps"]),
            schedule=str(r["lr_schedule"]), groups=int(r["groups"]),
            aggregate_every=int(r["aggregate_every"] or 0), outer=outer,
            outer_lr=0.7 if outer == "nesterov" else 1.0,
            outer_momentum=0.9 if outer == "nesterov" else 0.0,
            loss_init=float(r["eval_loss"][0]))
        out.append(Run(key=r["key"], shape=shape, eval_steps=tuple(r["eval_steps"]),
                       eval_loss=tuple(float(v) for v in r["eval_loss"]), seed=int(r["seed"]),
                       source=study.get("experiment", ""),
                       tags={"model": m, "steps": int(r["steps"]), "algorithm": r["algorithm"],
                             "seq_len": int(r["seq_len"]),
                             "ring_dtype": r.get("ring_dtype"), "data": study["data"]["source"],
                             "noise": r.get("noise", [])}))
    return out


def crossing(steps: np.ndarray, loss: np.ndarray, target: float) -> float:
    """Steps (interpolated linearly between points) at which `loss` first reaches `target`;
    inf if it never does."""
    below = np.nonzero(loss <= target)[0]
    if not len(below):
        return math.inf
    j = int(below[0])
    if j == 0:
        return float(steps[0])
    s0, s1, l0, l1 = steps[j - 1], steps[j], loss[j - 1], loss[j]
    return float(s0 + (s1 - s0) * (l0 - target) / (l0 - l1))


PRE_MARGIN = 0.1  # nats: stage 1 is fitted until the loss first comes this close to L_u
POST_MARGIN = 0.1  # nats: stage 2 is fitted from where the loss first falls this far below L_u


def segments(run: Run, unigram: float) -> list[Run]:
    """A measured run as the scaling model's two stages (scaling.py): "pre", from step 0 to the
    first evaluation point within PRE_MARGIN of the unigram loss (all of a run that never comes
    that close); "post", the points after the loss first falls POST_MARGIN below the unigram
    loss, steps counted from that crossing (interpolated between evaluation points, rounded to
    a step), the model started at that loss. The plateau between the two is left out: its
    length is measured (tags["escape_step"]), not modelled. A run that never leaves the plateau
    has no "post" segment."""
    from dataclasses import replace

    steps, loss = np.array(run.eval_steps), np.array(run.eval_loss)
    out = []
    near = np.nonzero(loss <= unigram + PRE_MARGIN)[0]
    end = int(near[0]) if len(near) else len(loss) - 1
    if loss[end] < unigram:  # that point is already past L_u: stage 2 at work, not stage 1
        end -= 1
    if end >= 1:
        out.append(replace(run, key=run.key + "#pre", shape=replace(run.shape, segment="pre"),
                           eval_steps=tuple(int(v) for v in steps[: end + 1]),
                           eval_loss=tuple(float(v) for v in loss[: end + 1]),
                           tags={**run.tags, "segment": "pre"}))
    level = unigram - POST_MARGIN
    cross = crossing(steps, loss, level)
    if math.isfinite(cross):
        start = round(cross)
        after = steps > start
        if after.sum() >= 1:
            out.append(replace(
                run, key=run.key + "#post",
                shape=replace(run.shape, segment="post", start_step=start, loss_init=level),
                eval_steps=(0, *(int(v) - start for v in steps[after])),
                eval_loss=(level, *(float(v) for v in loss[after])),
                tags={**run.tags, "segment": "post", "escape_step": cross}))
    return out
