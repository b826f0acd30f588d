"""FedAvg rounds of the FL variants: time-budgeted rounds, partial participation, outer optimizer.

The engine simulates a fixed number of steps per rank. Two variants change how many local steps
a federation group takes in a round, or whether they count, so they are composed here at the
round level from the engine's own step times:

- the engine simulates one federation group's step at a grid of compute factors (and the same
  with FedAvg after every step): `StepCurve`, the local step time and the aggregation's extra
  time as (piecewise-linear) functions of the factor;
- every group's factor at each step comes from the same factor table the engine's stragglers
  use (`actors.group_factors`): its slowest rank per step;
- a round then lasts, per variant:
  - synchronous FedAvg (K steps): the slowest group's K steps, then the aggregation;
  - time-budgeted (budget B, FedNova-style weights): each group takes steps while they fit in B
    (n_g steps); the round ends when the last group is done, then the aggregation; every step
    taken counts (the average is weighted by n_g);
  - partial participation (deadline D, K steps): a group done by D is in the average; the
    round closes when the last group is done or at D, whichever is first, and groups still
    running are left out (their round's steps are lost) and receive the average.

The outer optimizer (DiLoCo: Nesterov momentum on the averaged delta) costs an elementwise pass
over the local shard after the average: an op of the step program (`outer_step_s`).
Throughput counts the local steps that reach the average: step_time_s is the run's wall time
per mean useful local step of a group.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..spec.scenario import AlgorithmSpec, StragglerSpec
from ..spec.schema import SpecError
from .actors import factor_table, group_factors

GRID_POINTS = 9  # factors at which the engine simulates a group's step (interpolated between)


def outer_step_s(shard_params: int, param_nbytes: int, state_nbytes: int,
                 hbm_Bps: float) -> float:
    """DiLoCo's outer step on a rank's shard, memory-bound: delta = prev - avg (reads param and
    prev, writes delta); m = mu m + delta (reads m, delta; writes m); param = prev - lr (delta +
    mu m) (reads prev, delta, m; writes param); prev = param (reads param, writes prev). The
    parameters in the model dtype, prev/delta/m in the optimizer-state dtype: 3 p + 9 s bytes
    per parameter."""
    return shard_params * (3 * param_nbytes + 9 * state_nbytes) / hbm_Bps


def variant_of(alg: AlgorithmSpec) -> str:
    if alg.round_budget_s > 0:
        return "budget"
    if alg.round_deadline_s > 0:
        return "deadline"
    return "sync"


@dataclass(frozen=True)
class StepCurve:
    """A federation group's local step time and FedAvg's extra time against its factor."""

    factors: np.ndarray
    local_s: np.ndarray
    aggregate_s: np.ndarray

    def local(self, f: np.ndarray) -> np.ndarray:
        return np.interp(f, self.factors, self.local_s)

    def aggregate(self, f: float) -> float:
        return float(np.interp(f, self.factors, self.aggregate_s))


def step_curve(lo: float, hi: float,
               step_times: Callable[[np.ndarray, set[int]], list[float]]) -> StepCurve:
    """Simulate one group at GRID_POINTS factors from lo to hi, each twice in a row (the second
    is read: the first carries the previous factor's optimizer into its start), without and with
    FedAvg after the step."""
    grid = np.unique(np.linspace(lo, hi, GRID_POINTS)) if hi > lo else np.array([lo])
    seq = np.repeat(grid, 2)
    plain = step_times(seq, set())
    agg = step_times(seq, set(range(len(seq))))
    local = np.array(plain[1::2])
    return StepCurve(grid, local, np.maximum(np.array(agg[1::2]) - local, 0.0))


def round_bounds(steps: int, agg_steps: set[int]) -> list[tuple[int, int]]:
    """(first, last) step of each FedAvg round."""
    out, start = [], 0
    for end in sorted(agg_steps):
        out.append((start, end))
        start = end + 1
    if start < steps:
        out.append((start, steps - 1))
    return out


def sync_rounds(local_s: np.ndarray, bounds: list[tuple[int, int]], agg_s: float
                ) -> tuple[list[float], list[np.ndarray]]:
    """Per round: its time and each group's steps that count. local_s: (groups, steps)."""
    times, counted = [], []
    for a, b in bounds:
        times.append(float(local_s[:, a:b + 1].sum(axis=1).max()) + agg_s)
        counted.append(np.full(local_s.shape[0], b - a + 1))
    return times, counted


def deadline_rounds(local_s: np.ndarray, bounds: list[tuple[int, int]], agg_s: float,
                    deadline_s: float) -> tuple[list[float], list[np.ndarray]]:
    times, counted = [], []
    for a, b in bounds:
        done = local_s[:, a:b + 1].sum(axis=1)
        inside = done <= deadline_s
        times.append(float(min(done.max(), deadline_s)) + agg_s)
        counted.append(np.where(inside, b - a + 1, 0))
    return times, counted


def budget_rounds(local_s: np.ndarray, agg_s: float, budget_s: float
                  ) -> tuple[list[float], list[np.ndarray]]:
    """local_s: (groups, rounds, slots): each group's step times in each round, in order."""
    ends = np.cumsum(local_s, axis=2)
    n = (ends <= budget_s).sum(axis=2)  # steps that fit (the cumulative sum only grows)
    times, counted = [], []
    for r in range(local_s.shape[1]):
        last = [ends[g, r, n[g, r] - 1] if n[g, r] else 0.0 for g in range(local_s.shape[0])]
        times.append(float(max(last)) + agg_s)
        counted.append(n[:, r])
    return times, counted


MAX_BUDGET_SLOTS = 4_000_000  # time-budgeted rounds: step slots simulated at most (32 MB)


def round_model(*, alg: AlgorithmSpec, plan: Any, strag: StragglerSpec, steps: int, seed: int,
                agg_steps: set[int],
                step_times: Callable[[np.ndarray, set[int]], list[float]]) -> dict[str, Any]:
    """The variant's rounds: wall time, the local steps that count, and the numbers behind."""
    where = f"algorithms.{alg.name}"
    table = group_factors(plan, factor_table(plan, strag, steps, seed))  # (groups, steps)
    bounds = round_bounds(steps, agg_steps)
    variant = variant_of(alg)
    lo, hi = float(table.min()), float(table.max())
    slots = 0
    if variant == "budget":
        probe = step_curve(lo, lo, step_times)  # the fastest step seen: how many can fit
        slots = int(alg.round_budget_s / (0.5 * float(probe.local_s[0]))) + 2
        if plan.groups * len(bounds) * slots > MAX_BUDGET_SLOTS:  # memory: one float each
            raise SpecError(f"{where}.round_budget_s: {alg.round_budget_s:g} s holds up to "
                            f"{slots - 2:,} local steps of {float(probe.local_s[0]):.3g} s a "
                            f"round; at most {MAX_BUDGET_SLOTS:,} step slots are simulated "
                            f"(groups x rounds x slots: {plan.groups} x {len(bounds)} x "
                            f"{slots:,})")
        # fresh draws for the budget's step slots, one table per round (same seed: same run)
        table = group_factors(plan, factor_table(plan, strag, len(bounds) * slots, seed))
        lo, hi = float(table.min()), float(table.max())
    curve = step_curve(lo, hi, step_times)
    agg_s = curve.aggregate(float(np.median(table)))
    if variant == "budget":
        local = curve.local(table).reshape(plan.groups, len(bounds), slots)
        fastest = float(local[:, :, 0].min())
        if alg.round_budget_s < fastest:
            raise SpecError(f"{where}.round_budget_s: {alg.round_budget_s:g} s is shorter than "
                            f"one local step (the fastest takes {fastest:.4g} s)")
        times, counted = budget_rounds(local, agg_s, alg.round_budget_s)
    else:
        local = curve.local(table)
        if variant == "deadline":
            fastest = min(float(local[:, a:b + 1].sum(axis=1).min()) for a, b in bounds)
            if alg.round_deadline_s < fastest:
                k = alg.aggregate_every
                raise SpecError(
                    f"{where}.round_deadline_s: {alg.round_deadline_s:g} s is shorter than any "
                    f"group's {k} local steps (the fastest round takes {fastest:.4g} s): no "
                    f"group can meet it")
            times, counted = deadline_rounds(local, bounds, agg_s, alg.round_deadline_s)
        else:
            times, counted = sync_rounds(local, bounds, agg_s)
    total = float(sum(times))
    steps_counted = float(sum(c.sum() for c in counted))
    group_steps = steps_counted / plan.groups  # the mean group's useful local steps
    per_round = [float(c.mean()) for c in counted]
    out: dict[str, Any] = {
        "variant": variant,
        "rounds": len(times),
        "total_time_s": total,
        "round_time_s": total / len(times),
        "local_steps_per_round": sum(per_round) / len(per_round),
        "useful_local_steps": group_steps,
        "step_time_s": total / group_steps if group_steps > 0 else float("inf"),
        "aggregation_s": agg_s,
        "local_step_s_at_factor_1": float(curve.local(np.array(1.0))),
    }
    if variant == "budget":
        out["budget_s"] = alg.round_budget_s
        out["min_local_steps"] = int(min(c.min() for c in counted))
        out["max_local_steps"] = int(max(c.max() for c in counted))
    if variant == "deadline":
        out["deadline_s"] = alg.round_deadline_s
        out["participation"] = float(np.mean([(c > 0).mean() for c in counted]))
    return out


def apply_rounds(result: dict[str, Any], rounds: dict[str, Any]) -> None:
    """Put the variant's step time (wall time per useful local step) in the result and scale
    every throughput number with it (step_times_s and phases_s stay the engine's synchronous
    local steps)."""
    old = result["step_time_s"]
    new = rounds["step_time_s"]
    if not np.isfinite(new) or new <= 0:
        raise SpecError(f"algorithms.{result['name']}: no local step reached an average "
                        f"(round_deadline_s too short for every round)")
    ratio = old / new
    for key in ("tokens_per_s", "tokens_per_s_per_gpu", "samples_per_s", "mfu"):
        result[key] *= ratio
    result["step_time_s"] = new
    # the time to the run's `steps` useful local steps (rounds repeat alike: what a long run
    # extrapolated from a window keeps); the rounds' own wall time is in fl_rounds
    result["total_time_s"] = new * result["steps"]
    result["epoch_time_s"] = new * result["steps_per_epoch"]
    result["fl_rounds"] = rounds

