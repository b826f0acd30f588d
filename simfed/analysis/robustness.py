"""Does the answer survive the model's known errors? (`simfed run --robustness`)

The scenario is simulated again under each perturbation of an input the validation found
uncertain, by as much as it found: compute by the bound 9 in 10 of the held-out published runs'
errors lie within (validation/published/cases.yaml claims, from the check set), collectives
inside a node by how much faster than published nccl-tests tables NCCL's model is from 1 to 64
MiB, the inter-node network by the published multi-node tables' median error
(validation/published/collectives.yaml, as `simfed validate --published` compares them), the
latency per network step under a training job's load at the least and the most any machine's
published scale studies were fitted with (where the scenario's fabric has none), a quiet fabric
(where the scenario's has other jobs' traffic or a loaded step: the same Leonardo nodes on an
unshared InfiniBand service level, De Sensi et al. SC24, and Modalities' 2025 runs there lie
closer to it), GPU-to-GPU
variation (Sinha et al., SC22) on where the scenario has none and off where it has some, and at
the source's upper bound (3.7%: its largest spread) where the scenario's is smaller,
HYBRID_SHARD algorithms' steps by how far the published HYBRID / FULL pairs' predicted ratio
ran from the published one (the one error of one algorithm's own mechanism with published runs
to size it; applied to the results, not simulated again), each algorithm that leans on its
collectives alone by the bound of the check runs as communication-bound as it (cases.yaml
claims.by_comm_share; where that is wider than the scenario's bound, the check set's or, from
64 GPUs, its GPU count's in claims.by_gpus; not simulated again),
and the host's debug-check costs and the trainer's metric-sync host ops halved and doubled where
they are on (their constants are estimates). Every other perturbation moves every algorithm of
the scenario at once; the report
gives each one's step time and speedup and which algorithm wins (first to the target loss where
the scenario has one, else the highest tokens/s), so a user sees whether the ranking and the
margin hold, not just one number.

The magnitudes are read from the published validation when this runs, so they follow the model.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..calibration.published import DEFAULT_DIR
from ..spec.scenario import Scenario
from ..spec.schema import SpecError
from .report import unsettled

MID_SIZE = (1 << 20, 64 << 20)  # the sizes where NCCL's model runs ahead of nccl-tests
GPU_VARIATION = 0.027  # sd of GPU speed: Sinha et al. SC22's bounds, fitted (the profiles)
GPU_VARIATION_MAX = 0.037  # the same source's upper bound: its largest spread, 22%, over ~6 sd
BANDS = ("below", "at_scale")  # hybrid_over_full's GPU-count bands


@dataclass(frozen=True)
class Perturbation:
    name: str
    why: str
    overrides: dict[str, Any] = field(default_factory=dict)
    # not simulated again: HYBRID_SHARD algorithms' step times times the factor of the band
    # their sharded-and-replicated span lies in ({"min_gpus", "below", "at_scale"})
    hybrid_step: dict[str, float] | None = None
    # not simulated again: these algorithms' step times times their factor ({name: factor})
    step_scale: dict[str, float] | None = None
    # not simulated again: every algorithm's predicted peak memory times the factor, and
    # whether it fits its GPUs again
    memory_scale: float | None = None


def published_error_sizes(folder: Path = DEFAULT_DIR) -> dict[str, Any]:
    """The validation's error magnitudes: `compute` the bound 9 in 10 of the held-out published
    runs' |tokens/s/GPU error| lie within (cases.yaml claims.p90_abs_error, from the check
    set); `nvlink` predicted / published busbw (median) of the
    one-node rows from 1 to 64 MiB; `network` the median |error| of the multi-node rows;
    `claims` the claims themselves (their bands by GPU count and communication share)."""
    from ..calibration.published import load_claims
    from ..calibration.published_collectives import compare

    claims = load_claims(folder)
    if "p90_abs_error" not in claims:
        raise SpecError(f"{folder / 'cases.yaml'}: claims.p90_abs_error: missing")
    out = {"compute": float(claims["p90_abs_error"])}
    out["claims"] = claims
    path = folder / "collectives.yaml"
    if path.is_file():
        rows = compare(path)
        mid = [r["predicted_GBps"] / r["published_GBps"] for r in rows
               if r["nodes"] == 1 and MID_SIZE[0] <= r["size_bytes"] <= MID_SIZE[1]]
        multi = [abs(r["error"]) for r in rows if r["nodes"] > 1]
        if mid:
            out["nvlink"] = statistics.median(mid)
        if multi:
            out["network"] = statistics.median(multi)
    from ..calibration.published import load_hybrid_over_full

    pairs = load_hybrid_over_full(folder)
    if pairs:
        out["hybrid_over_full"] = pairs
    if claims.get("memory_worst_abs_error"):
        out["memory"] = float(claims["memory_worst_abs_error"])
    loaded = fitted_loaded_steps(folder)
    if loaded:
        out["loaded_step_min"], out["loaded_step_max"] = min(loaded.values()), max(loaded.values())
    return out


def fitted_loaded_steps(folder: Path = DEFAULT_DIR) -> dict[str, float]:
    """The loaded-step latency (cluster.fabric.loaded_step_us) fitted for each machine of the
    published scale studies: {scenario file: value} for every study scenario that sets one."""
    from ..calibration.published import load_cases
    from ..spec import load_scenario

    files = sorted({c["scenario"] for c in load_cases(folder) if c.get("study")})
    found = {f: load_scenario(folder / f, {}).cluster.fabric.loaded_step_us for f in files}
    return {f: v for f, v in found.items() if v > 0}


def _hybrid_perturbations(scn: Scenario, sizes: dict[str, Any]) -> list[Perturbation]:
    """HYBRID_SHARD's own error: where the scenario runs a HYBRID_SHARD algorithm (HSDP, FL+HSDP)
    that replicates across nodes beside another algorithm, its step times slower by how far the
    predicted HYBRID-over-FULL ratio of the published pairs ran above the published one (9 in 10
    pairs within: HYBRID's lead overstated), and faster by how far it ran below, at the band
    (below or at `min_gpus`) of the GPUs its shards and replicas span
    (validation/published/cases.yaml hybrid_over_full)."""
    from ..calibration.published import HYBRID_AT_SCALE_GPUS, hybrid_band
    from ..spec.algorithms import algorithm_info

    h = sizes.get("hybrid_over_full") or {}
    if len(scn.algorithms) < 2 or not h:
        return []
    m = int(h.get("min_gpus", HYBRID_AT_SCALE_GPUS))
    bands = set()
    for a in scn.algorithms:
        if algorithm_info(a.name).hybrid:
            plan = a.plan(scn.cluster)
            bands.add(hybrid_band(plan.replicate, plan.shard, m))
    out = []
    n = sum(h[b]["pairs"] for b in BANDS if b in h)
    for key, sign, word in (("over", 1, "slower"), ("under", -1, "faster")):
        f = {b: float(h[b][key]) if b in h else 0.0 for b in BANDS}
        used = sorted({100 * f[b] for b in bands if b and f[b] > 0})
        if not used:
            continue
        lead = "overstated" if sign > 0 else "understated"
        out.append(Perturbation(
            f"HSDP {'-'.join(f'{v:.0f}' for v in used)}% {word}",
            f"the {n} published HYBRID_SHARD / FULL_SHARD pairs: 9 in 10 of their "
            f"predicted-over-published ratios {lead} HYBRID's lead by at most "
            f"{100 * f['below']:.0f}% below {m:,} GPUs a model copy spans, "
            f"{100 * f['at_scale']:.0f}% from {m:,}; on every HYBRID_SHARD algorithm's step "
            "(FL+HSDP's too), not simulated again",
            hybrid_step={"min_gpus": m, **{b: 1.0 + sign * v for b, v in f.items()}}))
    return out


def _comm_perturbations(scn: Scenario, sizes: dict[str, Any], out: dict[str, Any]
                        ) -> list[Perturbation]:
    """The algorithms that lean on their collectives: each whose communication share
    (`claim_bands.comm_share`) reaches a band of the check runs (cases.yaml claims.by_comm_share)
    with a wider 9-in-10 bound than the whole check set's (and than the check runs' at the
    scenario's GPU count, claims.by_gpus), its step alone slower and faster by
    that band's bound, the others as given (not simulated again). None where no algorithm, or
    every one alike, has such a band: the compute perturbation moves them together."""
    from ..calibration.claim_bands import collective_bound

    algs = out.get("algorithms") or []
    found = {a["name"]: (a["label"], float(band["p90_abs_error"]))
             for a, _, band in collective_bound(scn, algs, sizes.get("claims") or {})}
    if len(algs) < 2 or not found or (
            len(found) == len(algs) and len({b for _, b in found.values()}) == 1):
        return []
    who = ", ".join(label for label, _ in found.values())
    pcts = sorted({round(100 * b) for _, b in found.values()})
    why = ("the check runs as communication-bound as each (cases.yaml claims.by_comm_share): "
           + "; ".join(f"{label} within {100 * b:.1f}% for 9 in 10" for label, b in
                       found.values())
           + "; those algorithms alone, not simulated again")
    return [Perturbation(f"{who} {'-'.join(map(str, pcts))}% {word}", why,
                         step_scale={n: 1.0 + sign * b for n, (_, b) in found.items()})
            for sign, word in ((1, "slower"), (-1, "faster"))]


def _memory_perturbations(sizes: dict[str, Any], out: dict[str, Any]) -> list[Perturbation]:
    """Where an algorithm's predicted peak memory lies within the check runs' worst
    peak-memory error of its GPU's capacity (cases.yaml claims.memory_worst_abs_error, w):
    every peak as far above and below as that error allows (published = predicted / (1 + e),
    |e| <= w), and which algorithms fit again (not simulated again). None elsewhere: no fit
    verdict could change."""
    from ..calibration.claim_bands import fit_unsettled

    w = sizes.get("memory")
    near = [a for a in out.get("algorithms") or [] if w and fit_unsettled(a, w)]
    if not near:
        return []
    why = (f"the check runs whose source gives their peak memory: predicted within {100 * w:.1f}% "
           f"of it (cases.yaml claims.memory_worst_abs_error; {', '.join(a['label'] for a in near)}"
           " that near capacity); every algorithm's peak, not simulated again")
    return [Perturbation(f"peak memory {100 * abs(f - 1):.1f}% {word}", why, memory_scale=f)
            for f, word in ((1.0 / (1.0 - w), "higher"), (1.0 / (1.0 + w), "lower"))]


def _apply_memory(out: dict[str, Any], factor: float) -> dict[str, Any]:
    """`out` with every algorithm's peak memory times `factor` and whether it fits again."""
    res = {**out, "algorithms": [dict(a) for a in out["algorithms"]]}
    for a in res["algorithms"]:
        a["peak_memory_bytes"] = a["peak_memory_bytes"] * factor
        if a.get("memory_capacity_bytes"):
            a["fits"] = a["peak_memory_bytes"] <= a["memory_capacity_bytes"]
    return _with_first_to_target(res)


def _with_first_to_target(res: dict[str, Any]) -> dict[str, Any]:
    """`res` with the first to the target loss again among the algorithms that fit."""
    from ..convergence.predict import first_to_target

    conv = res.get("convergence") or {}
    if conv.get("target_loss") is not None:
        res["convergence"] = {**conv, "first_to_target": first_to_target(res["algorithms"])}
    return res


def _apply_hybrid(out: dict[str, Any], factors: dict[str, float]) -> dict[str, Any]:
    """`out` with each HYBRID_SHARD algorithm's (plan.replicate > 1) step time, tokens/s and time
    to target scaled by its band's factor; speedups and the first to the target again."""
    from ..calibration.published import hybrid_band

    def factor(a: dict[str, Any]) -> float | None:
        plan = a.get("plan") or {}
        band = hybrid_band(plan.get("replicate", 1), plan.get("shard", 1),
                           int(factors["min_gpus"]))
        return None if band is None else factors[band]

    return _apply_steps(out, factor)


def _by_name(scale: dict[str, float]) -> Callable[[dict[str, Any]], float | None]:
    return lambda a: scale.get(a["name"])


def _apply_steps(out: dict[str, Any], factor_of: Callable[[dict[str, Any]], float | None]
                 ) -> dict[str, Any]:
    """`out` with each algorithm's step time, tokens/s and time to target scaled by its factor
    (None: as given); speedups and the first to the target again."""
    res = {**out, "algorithms": [dict(a) for a in out["algorithms"]]}
    for a in res["algorithms"]:
        f = factor_of(a)
        if f is None:
            continue
        a["step_time_s"] = a["step_time_s"] * f
        a["tokens_per_s"] = a["tokens_per_s"] / f
        if a.get("time_to_target_s") is not None:
            a["time_to_target_s"] = a["time_to_target_s"] * f
        if a.get("time_to_target_interval_s"):
            a["time_to_target_interval_s"] = [None if x is None else x * f
                                              for x in a["time_to_target_interval_s"]]
    base = next((a for a in res["algorithms"] if a["name"] == out.get("baseline")),
                res["algorithms"][0])
    for a in res["algorithms"]:
        a["speedup"] = base["step_time_s"] / a["step_time_s"]
    return _with_first_to_target(res)


def _scaled(value: float, factor: float) -> float:
    return min(1.0, value * factor)


def perturbations(scn: Scenario, sizes: dict[str, Any]) -> list[Perturbation]:
    """The perturbations that apply to `scn` (kernel compute model), each with its overrides
    (dotted keys)."""
    rt = scn.runtime
    c, comm, host = rt.compute, rt.comm, rt.host
    out: list[Perturbation] = []
    w = sizes["compute"]
    src = "the bound 9 in 10 held-out published runs' errors lie within"
    for sign, word in ((1, "slower"), (-1, "faster")):  # the kernel model's efficiencies
        f = 1.0 / (1.0 + sign * w)
        keys = {"runtime.compute.gemm_efficiency": _scaled(c.gemm_efficiency, f),
                "runtime.compute.attention_efficiency_forward":
                    _scaled(c.attention_efficiency_forward, f),
                "runtime.compute.attention_efficiency_backward":
                    _scaled(c.attention_efficiency_backward, f),
                "runtime.compute.hbm_efficiency": _scaled(c.hbm_efficiency, f)}
        out.append(Perturbation(f"compute {100 * w:.0f}% {word}", src, keys))
    if "nvlink" in sizes and sizes["nvlink"] > 1 and scn.cluster.node.gpus > 1:
        r = sizes["nvlink"]
        out.append(Perturbation(
            f"NVLink collectives {100 * (1 - 1 / r):.0f}% slower",
            f"NCCL's model runs {100 * (r - 1):.0f}% ahead of published nccl-tests inside a node "
            "from 1 to 64 MiB (median); applied at every size",
            {"runtime.comm.nvlink_efficiency": comm.nvlink_efficiency / r}))
    if "network" in sizes and scn.cluster.nodes > 1:
        e = sizes["network"]
        src = "the published multi-node nccl-tests rows' median |error|"
        for sign, word in ((-1, "slower"), (1, "faster")):
            eff = _scaled(comm.nic_efficiency, 1.0 + sign * e)
            change = abs(eff / comm.nic_efficiency - 1.0)
            if change > 0:
                out.append(Perturbation(
                    f"inter-node network {100 * change:.0f}% {word}",
                    src + (f" ({100 * e:.0f}%), capped at the line rate" if eff == 1.0 else ""),
                    {"runtime.comm.nic_efficiency": eff}))
    fabric = scn.cluster.fabric
    if ("loaded_step_max" in sizes and scn.cluster.nodes > 1 and comm.model == "nccl"
            and fabric.loaded_step_us == 0):
        for key, word in (("loaded_step_min", "least"), ("loaded_step_max", "most")):
            us = sizes[key]
            out.append(Perturbation(
                f"network steps +{us:g} us under load",
                f"the {word} any machine's published scale studies were fitted with "
                "(cluster.fabric.loaded_step_us, docs/accuracy.md)",
                {"cluster.fabric.loaded_step_us": us}))
    if scn.cluster.nodes > 1 and (fabric.shared_bandwidth or fabric.loaded_step_us > 0):
        out.append(Perturbation(
            "a quiet fabric",
            "no other jobs' traffic and no loaded network steps: the same nodes on a service "
            "level no other job shared ran at the quiet bandwidth "
            "(De Sensi et al. SC24, Leonardo); Modalities' 2025 FSDP2 runs there lie closer to it "
            "(docs/accuracy.md)",
            {"cluster.fabric.shared_bandwidth": [], "cluster.fabric.loaded_step_us": 0.0}))
    if scn.cluster.world > 1:  # the slowest GPU of each synchronous group: on or off
        if c.gpu_variation == 0:
            out.append(Perturbation(f"GPU-to-GPU variation {100 * GPU_VARIATION:.1f}%",
                                    "Sinha et al. SC22 (the shipped profiles' value)",
                                    {"runtime.compute.gpu_variation": GPU_VARIATION}))
        else:
            out.append(Perturbation("no GPU-to-GPU variation",
                                    "every GPU at the same speed (the scenario's "
                                    f"{100 * c.gpu_variation:.1f}% spread off)",
                                    {"runtime.compute.gpu_variation": 0.0}))
        if c.gpu_variation < GPU_VARIATION_MAX:
            out.append(Perturbation(
                f"GPU-to-GPU variation {100 * GPU_VARIATION_MAX:.1f}%",
                "the largest spread Sinha et al. SC22 measured in a cluster (22%, read as 6 sd); "
                "a synchronous group of n waits for its slowest of n",
                {"runtime.compute.gpu_variation": GPU_VARIATION_MAX}))
    out.extend(_hybrid_perturbations(scn, sizes))
    if str(host.debug_checks) != "off":
        for f, word in ((0.5, "halved"), (2.0, "doubled")):
            out.append(Perturbation(f"debug-check costs {word}",
                                    "their per-message constants are estimates",
                                    {"runtime.host.gloo_hop_us": host.gloo_hop_us * f,
                                     "runtime.host.gloo_rank0_msg_us":
                                         host.gloo_rank0_msg_us * f}))
    if scn.training.metric_sync_states and host.eager_op_us > 0:
        for f, word in ((0.5, "halved"), (2.0, "doubled")):
            out.append(Perturbation(f"trainer metric-sync host ops {word}",
                                    "runtime.host.eager_op_us is an estimate (the profiles' "
                                    "launch cost)",
                                    {"runtime.host.eager_op_us": host.eager_op_us * f}))
    return out


def _winner(out: dict[str, Any]) -> tuple[str | None, str]:
    """The first to the target loss where the scenario has one, else the highest tokens/s; an
    algorithm that does not fit its GPUs' memory does not win."""
    conv = out.get("convergence") or {}
    fitting = [a for a in out["algorithms"] if a.get("fits", True)]
    if conv.get("target_loss") is not None:  # first_to_target: a label, or None: none gets there
        first = conv["first_to_target"]
        name = next((a["name"] for a in fitting if first in (a["name"], a["label"])), None)
        return name, "first to the target loss"
    if not fitting:
        return None, "highest tokens/s"
    best = max(fitting, key=lambda a: a["tokens_per_s"])
    return best["name"], "highest tokens/s"


def _row(name: str, why: str, out: dict[str, Any]) -> dict[str, Any]:
    winner, by = _winner(out)
    return {"perturbation": name, "why": why, "winner": winner, "winner_by": by,
            "algorithms": {a["name"]: {"label": a["label"], "step_time_s": a["step_time_s"],
                                       "speedup": a["speedup"], "fits": a.get("fits", True),
                                       "time_to_target_s": a.get("time_to_target_s"),
                                       "time_to_target_interval_s":
                                           a.get("time_to_target_interval_s")}
                           for a in out["algorithms"]}}


def robustness(scenario: str | Path, overrides: dict[str, Any] | None, out: dict[str, Any], *,
               profile: str | None = None, algorithms: list[str] | None = None,
               folder: Path = DEFAULT_DIR, loaded: Scenario | None = None,
               reload: Callable[[dict[str, Any]], Scenario] | None = None) -> dict[str, Any]:
    """`out` (the scenario as given, already simulated; `loaded`: it as loaded, if at hand) and
    every perturbation simulated. `reload(overrides)`: the scenario loaded again with more
    overrides (default: `scenario`'s file with `overrides` and `profile`)."""
    from ..engine import simulate
    from ..spec import load_scenario

    base = loaded or load_scenario(scenario, overrides, profile=profile)
    if base.runtime.compute.model != "kernels":
        return {"skipped": "the published validation's error sizes are the kernel model's on "
                           "GPU clusters; this scenario uses runtime.compute.model "
                           f"{base.runtime.compute.model}"}
    if not (folder / "cases.yaml").is_file():
        return {"skipped": f"the error sizes come from the published validation, and "
                           f"{folder / 'cases.yaml'} is not there"}
    rows = [_row("as given", "", out)]
    sizes = published_error_sizes(folder)
    for p in (perturbations(base, sizes) + _comm_perturbations(base, sizes, out)
              + _memory_perturbations(sizes, out)):
        if p.memory_scale is not None:
            rows.append(_row(p.name, p.why, _apply_memory(out, p.memory_scale)))
            continue
        if p.hybrid_step is not None:
            rows.append(_row(p.name, p.why, _apply_hybrid(out, p.hybrid_step)))
            continue
        if p.step_scale is not None:
            rows.append(_row(p.name, p.why, _apply_steps(out, _by_name(p.step_scale))))
            continue
        try:
            scn = (reload(p.overrides) if reload is not None else
                   load_scenario(scenario, {**(overrides or {}), **p.overrides}, profile=profile))
        except SpecError as exc:  # a perturbation the scenario's own limits refuse
            raise SpecError(f"--robustness: {p.name}: {exc}") from None
        res, _ = simulate(scn, algorithms=algorithms)
        rows.append(_row(p.name, p.why, res))
    winners = [r["winner"] for r in rows]
    spans = {}
    for name in rows[0]["algorithms"]:
        s = [r["algorithms"][name]["speedup"] for r in rows]
        spans[name] = [min(s), max(s)]
    ttt: dict[str, list[float | None]] = {}
    if "first to the target loss" in rows[0]["winner_by"]:
        for name in rows[0]["algorithms"]:
            v = [r["algorithms"][name]["time_to_target_s"] for r in rows]
            reached = [x for x in v if x is not None]
            ttt[name] = [min(reached) if reached else None,
                         max(reached) if len(reached) == len(v) else None]
    return {"rows": rows, "winner_as_given": winners[0], "time_to_target_range": ttt,
            "same_winner": sum(w == winners[0] for w in winners), "cases": len(rows),
            "speedup_range": spans, "baseline": out.get("baseline")}


def lines(res: dict[str, Any]) -> list[str]:
    """The verdict in words, after the table."""
    if "skipped" in res:
        return [f"robustness: not run: {res['skipped']}"]
    first = res["rows"][0]
    labels = {n: a["label"] for n, a in first["algorithms"].items()}
    if len(labels) == 1:  # nothing to rank: how far the one algorithm moves
        (name, label), = labels.items()
        steps = [r["algorithms"][name]["step_time_s"] for r in res["rows"]]
        return [f"robustness: {label} alone; its step time spans {min(steps):.4g} .. "
                f"{max(steps):.4g} s over {res['cases']} cases"]
    w = res["winner_as_given"]
    head = (f"robustness: {labels.get(w, 'no algorithm')} wins ({first['winner_by']}) in "
            f"{res['same_winner']} of {res['cases']} cases")
    others = [f"{labels.get(r['winner'], 'none')} under {r['perturbation']}"
              for r in res["rows"] if r["winner"] != w]
    out = [head + (f"; otherwise {'; '.join(others)}" if others else "")]
    base = res.get("baseline")
    for name, (lo, hi) in res["speedup_range"].items():
        if name != base:
            out.append(f"  {labels[name]} vs {labels.get(base, base)}: {lo:.2f}x .. {hi:.2f}x "
                       "throughput")
    for name, span in res.get("time_to_target_range", {}).items():
        text = (f"{span[0]:.3g} .. {span[1]:.3g} s" if span[1] is not None else
                "never" if span[0] is None else f"{span[0]:.3g} s .. never")
        out.append(f"  {labels[name]} to the target loss: {text}")
    # the convergence profile's own [p10, p90] (as given): does another algorithm's band reach
    # under the winner's? Then the convergence model, not the throughput, decides
    if res.get("time_to_target_range") and w in labels:
        close = unsettled(list(first["algorithms"].values()), labels[w])
        if close:
            out.append(f"  the convergence band of {', '.join(close)} overlaps "
                       f"{labels[w]}'s ([p10, p90] as given): which is first rests on the "
                       "convergence profile, not on these errors")
    return out


def print_robustness(res: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    from .report import fmt_s

    if "skipped" in res:
        for line in lines(res):
            console.print(line, highlight=False, markup=False)
        return
    names = list(res["rows"][0]["algorithms"])
    labels = [res["rows"][0]["algorithms"][n]["label"] for n in names]
    t = Table(title="robustness: the scenario under the model's known errors "
                    "(step time, speedup vs the baseline, time to the target loss)",
              header_style="bold", show_lines=True)
    t.add_column("perturbation", no_wrap=True)
    for label in labels:
        t.add_column(label, justify="right")
    t.add_column("winner")
    target = "first to the target loss" in res["rows"][0]["winner_by"]
    for r in res["rows"]:
        cells = []
        for n in names:
            a = r["algorithms"][n]
            cell = f"{fmt_s(a['step_time_s'])}\n{a['speedup']:.2f}x" + (
                "" if a.get("fits", True) else "\ndoes not fit")
            if target:
                ttt = a.get("time_to_target_s")
                cell += "\nto target " + (fmt_s(ttt) if ttt is not None else "never")
            cells.append(cell)
        win = r["winner"]
        t.add_row(r["perturbation"], *cells,
                  r["algorithms"][win]["label"] if win in r["algorithms"] else "none")
    console.print(t)
    for r in res["rows"][1:]:
        console.print(f"  {r['perturbation']}: {r['why']}", highlight=False, markup=False)
    for line in lines(res):
        console.print(line, highlight=False, markup=False)
