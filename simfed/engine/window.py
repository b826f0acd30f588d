"""Long runs from a steady-state window, and the checks every result passes before it leaves.

A run of more than `STEP_WINDOW` steps is not simulated step by step (its cost, and the per-step
tables of jitter draws and step bounds, would grow with the steps). The rule, stated in the
output as `extrapolation`:

- simulate a window of n steps: at most `STEP_WINDOW`, and at most `LAYER_STEP_BUDGET` /
  (layers + 1) (a deep model's steps cost more; 4 at least), rounded down to whole FedAvg
  periods of K steps, so FedAvg falls in the window as in the run; the window's last step
  aggregates, as the run's last step does (when K is longer than the window, that is the
  window's one round: its FedAvg waits then reflect the window's drift, not K steps');
- the run's time = (window time - its FedAvg time) / n x steps + the window's mean FedAvg time x
  the run's FedAvg rounds (every K steps and after the last);
- per-step means (phases, compute, exposed communication, bytes per link) are the window's,
  with the aggregation phase re-weighted by the run's rounds; `step_times_s` lists the
  window's steps, and `steps_simulated` says how many that is.

Every result is then checked: each number is finite and the MFU is at most 1, else a SpecError
names the key and the cause (a JSON file never holds NaN or Infinity).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from ..spec.algorithms import algorithm_info
from ..spec.limits import STEP_WINDOW
from ..spec.scenario import AlgorithmSpec, Scenario
from ..spec.schema import SpecError

RULE = ("a long run is simulated over a window of whole FedAvg periods (steps_simulated); time = "
        "window time without FedAvg / window steps x steps + mean FedAvg time x FedAvg rounds")
LAYER_STEP_BUDGET = 3072  # (layers + 1) x steps at most: the shipped scenarios' 2,592 fit
MIN_WINDOW = 4


def window_size(layers: int) -> int:
    """Most steps simulated for a model of `layers` decoder layers."""
    return max(MIN_WINDOW, min(STEP_WINDOW, LAYER_STEP_BUDGET // (layers + 1)))


def needs_window(scn: Scenario) -> bool:
    return scn.training.steps > window_size(scn.model.layers)


def window_steps(steps: int, every: int, layers: int = 0) -> int:
    """Steps to simulate for a run of `steps` with FedAvg every `every` steps (0: none)."""
    w = window_size(layers)
    if steps <= w:
        return steps
    if every < 1 or every > w:
        return w
    return w // every * every


def rounds(steps: int, every: int) -> int:
    """FedAvg rounds of a run: after every `every` steps and after the last."""
    return 0 if every < 1 else steps // every + (1 if steps % every else 0)


def _every(alg: AlgorithmSpec) -> int:
    return alg.aggregate_every if algorithm_info(alg.name).federated else 0


def extrapolate(r: dict[str, Any], scn: Scenario, alg: AlgorithmSpec) -> dict[str, Any]:
    """One algorithm's result over the window, extended to the scenario's steps (the rule
    above)."""
    steps, n = scn.training.steps, r["steps"]
    if n >= steps:
        return r
    agg_w = r["aggregations"]
    agg_event = r["aggregation_per_event_s"]
    n_agg = rounds(steps, _every(alg)) if agg_w else 0
    plain_w = r["total_time_s"] - agg_w * agg_event
    total = plain_w / n * steps + agg_event * n_agg
    step_time = total / steps
    scale = r["step_time_s"] / step_time
    phases = dict(r["phases_s"])
    phases["aggregation"] = agg_event * n_agg / steps
    samples_step = r["samples_per_s"] * r["step_time_s"]
    steps_per_epoch = scn.dataset_sequences / samples_step
    out = dict(r)
    out.update({
        "steps": steps, "steps_simulated": n, "extrapolation": RULE,
        "aggregations": n_agg, "total_time_s": total, "step_time_s": step_time,
        "tokens_per_s": r["tokens_per_s"] * scale,
        "tokens_per_s_per_gpu": r["tokens_per_s_per_gpu"] * scale,
        "samples_per_s": r["samples_per_s"] * scale, "mfu": r["mfu"] * scale,
        "phases_s": phases, "steps_per_epoch": steps_per_epoch,
        "epoch_time_s": step_time * steps_per_epoch,
    })
    return out


def simulate_windowed(simulate: Callable[..., tuple[dict[str, Any], dict]], scn: Scenario,
                      algorithms: list[str] | None, **kw: Any) -> tuple[dict[str, Any], dict]:
    """`simulate` (simfed.engine.run's) over each algorithm's window, extrapolated."""
    chosen = [scn.algorithm(a) for a in algorithms] if algorithms else list(scn.algorithms)
    by_window: dict[int, list[AlgorithmSpec]] = {}
    for alg in chosen:
        n = window_steps(scn.training.steps, _every(alg), scn.model.layers)
        by_window.setdefault(n, []).append(alg)
    results: dict[int, dict[str, Any]] = {}
    spans: dict[str, Any] = {}
    ops = 0
    out: dict[str, Any] = {}
    for n, algs in by_window.items():
        short = dataclasses.replace(scn, training=dataclasses.replace(scn.training, steps=n))
        out, sp = simulate(short, algorithms=[id_of(a) for a in algs], **kw)
        spans.update(sp)
        ops += out["simulated_ops"]
        for alg, r in zip(algs, out["algorithms"], strict=True):
            results[id(alg)] = extrapolate(r, scn, alg)
    runs = [results[id(a)] for a in chosen]
    base = runs[0]
    for r in runs:
        r["speedup"] = base["step_time_s"] / r["step_time_s"]
        r["epoch_speedup"] = base["epoch_time_s"] / r["epoch_time_s"]
    out = dict(out, algorithms=runs, baseline=base["name"], simulated_ops=ops,
               extrapolation=RULE)
    conv = getattr(scn, "convergence", None)  # time to target over the whole run, not the window
    if conv is not None and getattr(conv, "model", "none") != "none":
        from ..convergence import attach

        attach(scn, out)
    return out, spans


def id_of(alg: AlgorithmSpec) -> str:
    """The name `Scenario.algorithm` finds this algorithm by."""
    return alg.label or alg.name


PER_RANK_BUDGET = 60_000  # actor x unit x step visits: 101,640 took 14 s on a busy 2-core host


def check_cost(scn: Scenario, algorithms: list[str] | None) -> None:
    """Refuse up front what cannot be simulated in seconds: the per-rank straggler method
    simulates every distinct rank (512gpu.yaml with per-node jitter, 4 algorithms: 16 nodes x
    64 steps 11 s, 128 nodes x 64 steps 94 s, x 8 steps 14 s on this shared host), so its cost
    is bounded by actors x units x steps."""
    st = scn.stragglers
    if getattr(st, "method", "order_stats") != "per_rank" or not st.any:
        return
    chosen = [scn.algorithm(a) for a in algorithms] if algorithms else list(scn.algorithms)
    world, nodes = scn.cluster.world, scn.cluster.nodes
    slow = 1 + len(st.slow_nodes) + len(st.slow_gpus) + len(st.degraded_nics)
    actors = 0  # at most: a shard group runs in lockstep, one actor (simfed.engine.actors)
    for alg in chosen:
        groups = world // alg.plan(scn.cluster).shard
        if st.jitter.sigma > 0:
            actors += min(groups, nodes) if st.jitter.level == "node" else groups
        else:
            actors += min(groups, slow)
    steps = min(scn.training.steps, window_size(scn.model.layers))
    cost = actors * (scn.model.layers + 1) * steps
    if cost > PER_RANK_BUDGET:
        raise SpecError(
            f"stragglers.method: per_rank simulates every distinct rank: {actors:,} actors over "
            f"{len(chosen)} algorithms x {scn.model.layers + 1} units x {steps} steps = "
            f"{cost:,}; the limit is {PER_RANK_BUDGET:,} (about 10 s): use order_stats (the "
            "default), fewer steps or --algorithm")


def _bad_number(obj: Any, path: str) -> str | None:
    if isinstance(obj, float) and not math.isfinite(obj):
        return path
    if isinstance(obj, dict):
        for k, v in obj.items():
            found = _bad_number(v, f"{path}.{k}" if path else str(k))
            if found:
                return found
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            found = _bad_number(v, f"{path}[{i}]")
            if found:
                return found
    return None


def check_result(out: dict[str, Any]) -> dict[str, Any]:
    """Refuse a result with a number that is not finite, or an MFU above 1, naming the key."""
    for a in out.get("algorithms", []):
        bad = _bad_number(a, "")
        if bad:
            raise SpecError(f"{a.get('label', '?')}: the simulated {bad} is not a finite number "
                            "(the scenario's numbers are too extreme to simulate: an overflow)")
        if a.get("mfu", 0.0) > 1.0 + 1e-9:
            raise SpecError(
                f"{a.get('label', '?')}: the simulated MFU is {a['mfu']:.3g} > 1, faster than "
                "the GPUs' peak: compute factors below 1 (stragglers' factors, jitter) with "
                "efficiencies near 1 make ranks faster than the hardware can be")
    bad = _bad_number({k: v for k, v in out.items() if k != "algorithms"}, "")
    if bad:
        raise SpecError(f"the simulated {bad} is not a finite number")
    return out
