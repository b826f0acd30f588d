"""How sure a GPU-cluster prediction is: what the published validation's held-out runs say, and
how much wider the claim gets where a scenario leaves the validated runs.

`simfed validate --published` measures the kernel model on published runs
(validation/published/cases.yaml) split into a fit set (what the model's constants and
mechanisms were chosen on) and a check set (held out). The claim `simfed run` prints comes from
the CHECK set's errors only (`published.derive_claims`, stored as cases.yaml `claims` and held
to a fresh validation by tests/test_published.py): the median |error| and the bound that 9 in
10 check runs lie within. A scenario run with the same model (`runtime.compute.model: kernels`)
and no calibrated profile gets that bound where it resembles the validated runs, and a wider one
for each factor the validated runs do not cover, by as much as the check set says that factor
costs:
- GPUs beyond the validated counts: the check scale studies' scale-loss error per doubling,
  times the doublings out;
- a framework (PyTorch FSDP1 / FSDP2, JAX, DeepSpeed) no validated run ran: the check set's
  largest distance between one framework's median signed error and all runs';
- a GPU family (A100, H100, ...) no validated run had: the same distance over the GPU types the
  check runs had;
- less memory headroom than any validated run that fits (1 - predicted peak / capacity), or
  a configuration the memory model says does not fit: the check set's median |error| again.
Other quantities and settings outside the runs (nodes, parameters, sequence length, float8,
debug checks, the fabric) are named without widening: the check set has no measure of what
they cost.

Inside the validated runs, the error grows with the GPUs a run spans and with how near its step
comes to waiting on its collectives (`claim_bands.comm_share`): a scenario at a GPU count whose
band of the claims' `by_gpus` has a wider bound than the whole check set's gets that bound, and
each algorithm whose share reaches a band of `by_comm_share` wider still gets that band's, plus
the widenings above.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import yaml

from ..spec.scenario import Scenario
from ..spec.schema import SpecError
from .claim_bands import band_of, collective_bound, fit_unsettled, scale_bound
from .published import (
    DEFAULT_DIR,
    framework,
    hybrid_band,
    load_cases,
    load_claims,
    load_hybrid_over_full,
)

QUANTITIES = {
    "gpus": "GPUs",
    "nodes": "nodes",
    "params": "parameters",
    "seq_len": "sequence length",
}


def _quantities(scn: Scenario) -> dict[str, float]:
    return {"gpus": float(scn.cluster.world), "nodes": float(scn.cluster.nodes),
            "params": float(scn.model.total_params), "seq_len": float(scn.training.seq_len)}


def _settings(scn: Scenario) -> dict[str, str]:
    """Runtime settings a published run either had or not, as words."""
    tr = scn.training
    return {"training.float8": tr.float8, "training.compile": str(tr.compile).lower(),
            "training.activation_checkpointing": tr.ac_policy,
            "runtime.host.debug_checks": str(scn.runtime.host.debug_checks),
            "cluster.fabric.topology": scn.cluster.fabric.topology}


# the keys a scale study's cases set (they change no setting the envelope looks at)
_SIZE_KEYS = {"cluster.nodes", "training.micro_batch", "algorithms.0"}
# settings that validation/published/speedups.yaml checks as ratios to a baseline
SPEEDUP_CHECKED = {"training.float8", "training.compile", "training.activation_checkpointing"}


def _gpu_family(name: str) -> str:
    up = name.upper()
    return next((f for f in ("A100", "H100", "H200", "B200", "MI300") if f in up), up)


@functools.lru_cache(maxsize=2)
def published_envelope(folder: Path = DEFAULT_DIR) -> dict[str, Any] | None:
    """Ranges of the published cases' quantities, their GPU families, frameworks and settings,
    and the claims; None when the folder is not there (an installed package without the
    repository)."""
    from ..spec import load_scenario

    if not (folder / "cases.yaml").is_file():
        return None
    ranges: dict[str, list[float]] = {}
    families: set[str] = set()
    frameworks: set[str] = set()
    seen: dict[str, set[str]] = {}
    cases = load_cases(folder)
    base: dict[str, Scenario] = {}
    for c in cases:
        ov = c.get("overrides") or {}
        if set(ov) <= _SIZE_KEYS:  # a scale study's point: its scenario at another size
            scn = base.get(c["scenario"])
            if scn is None:
                scn = base[c["scenario"]] = load_scenario(folder / c["scenario"])
            q = _quantities(scn)
            nodes = float(ov.get("cluster.nodes", scn.cluster.nodes))
            q.update(nodes=nodes, gpus=nodes * scn.cluster.node.gpus)
        else:
            scn = load_scenario(folder / c["scenario"], ov)
            q = _quantities(scn)
        families.add(_gpu_family(scn.cluster.node.gpu.name))
        frameworks.add(framework(c, scn))
        for k, v in _settings(scn).items():
            seen.setdefault(k, set()).add(v)
        for k, v in q.items():
            lo, hi = ranges.get(k, [v, v])
            ranges[k] = [min(lo, v), max(hi, v)]
    return {"ranges": ranges, "gpus_families": sorted(families), "cases": len(cases),
            "frameworks": sorted(frameworks),
            "settings": {k: sorted(v) for k, v in seen.items()},
            "claims": load_claims(folder), "hybrid_over_full": load_hybrid_over_full(folder)}


def scenario_framework(scn: Scenario) -> str:
    """The framework a simulated scenario stands for: simfed's FSDP programs are PyTorch's."""
    return f"pytorch-fsdp{scn.training.fsdp_version}"


def memory_headroom(out: dict[str, Any] | None) -> float | None:
    """The least headroom (1 - predicted peak / capacity) over a run's algorithms; None
    without results."""
    algs = (out or {}).get("algorithms") or []
    vals = [1.0 - a["peak_memory_bytes"] / a["memory_capacity_bytes"] for a in algs
            if a.get("memory_capacity_bytes")]
    return min(vals) if vals else None


def widened(scn: Scenario, env: dict[str, Any], out: dict[str, Any] | None = None
            ) -> tuple[float, list[tuple[str, float]]]:
    """The 9-in-10 bound for this scenario: the check set's, plus one increment per factor no
    validated run covers, each with its phrase."""
    c = env["claims"]
    w = c.get("widen") or {}
    factors: list[tuple[str, float]] = []
    gpus = float(scn.cluster.world)
    at_scale = gpu_band_increment(scn, env)
    if at_scale is not None:
        factors.append(at_scale)
    lo, hi = env["ranges"]["gpus"]
    if gpus > hi * 1.01 or gpus < lo * 0.99:
        d = abs(math.log2(gpus / (hi if gpus > hi else lo)))
        factors.append((f"GPUs {gpus:,.0f} (validated: {lo:,.0f}..{hi:,.0f}, {d:.1f} "
                        f"doublings out)", d * float(w.get("per_gpu_doubling", 0.0))))
    fw = scenario_framework(scn)
    if fw not in env["frameworks"]:
        factors.append((f"framework / FSDP version {fw} (validated: "
                        f"{', '.join(env['frameworks'])})", float(w.get("framework", 0.0))))
    if _gpu_family(scn.cluster.node.gpu.name) not in env["gpus_families"]:
        factors.append((f"GPU {scn.cluster.node.gpu.name} (validated: "
                        f"{', '.join(env['gpus_families'])})", float(w.get("gpu_type", 0.0))))
    room = memory_headroom(out)
    floor = c.get("memory_headroom_min")
    if room is not None and floor is not None and room < floor:
        what = "does not fit" if room < 0 else f"{100 * room:.0f}% left"
        factors.append((f"memory headroom: {what} (validated runs: at least "
                        f"{100 * floor:.0f}%)", float(w.get("memory_headroom", 0.0))))
    return float(c.get("p90_abs_error", float("nan"))) + sum(x for _, x in factors), factors


def gpu_band_increment(scn: Scenario, env: dict[str, Any]) -> tuple[str, float] | None:
    """Where the check runs at the scenario's GPU count or more (claims `by_gpus`) lie within a
    wider bound than the whole check set: that band, as a phrase and what it adds."""
    c = env["claims"]
    extra = scale_bound(float(scn.cluster.world), c) - float(c.get("p90_abs_error", 0.0))
    band = band_of(float(scn.cluster.world), c.get("by_gpus") or [])
    if band is None or not extra > 0:
        return None
    return (f"GPUs {scn.cluster.world:,}: the {band['cases']} check runs at {band['from']:,} GPUs "
            f"or more err {100 * band['median_abs_error']:.1f}% median, 9 in 10 within "
            f"{100 * band['p90_abs_error']:.1f}%", extra)


def outside(scn: Scenario, env: dict[str, Any]) -> list[str]:
    """What else of the scenario the validated runs do not cover, one phrase each (named, not
    widened: the check set does not measure what these cost)."""
    out = []
    q = _quantities(scn)
    for key, (lo, hi) in env["ranges"].items():
        if key == "gpus":
            continue
        v = q[key]
        if v <= 0 or lo <= 0 or lo * 0.99 <= v <= hi * 1.01:
            continue
        bound = hi if v > hi else lo
        out.append(f"{QUANTITIES[key]} {v:,.4g} (runs: {lo:,.4g}..{hi:,.4g}, "
                   f"{abs(math.log2(v / bound)):.1f} doublings out)")
    for key, value in _settings(scn).items():
        runs = env["settings"].get(key, [])
        if value in runs:
            continue
        note = ("; checked as a speedup: validation/published/speedups.yaml"
                if key in SPEEDUP_CHECKED else "")
        out.append(f"{key} {value} (runs: {', '.join(runs)}{note})")
    return out


def for_run(scn: Scenario, folder: Path = DEFAULT_DIR, out: dict[str, Any] | None = None
            ) -> list[str]:
    """`simfed run` without a calibrated profile, kernel model: the check set's claim, widened
    for each factor the validated runs do not cover (`out`: the run's results, for its memory
    headroom), and what else lies outside them; nothing for other compute models."""
    if scn.runtime.compute.model != "kernels":
        return []
    try:
        env = published_envelope(folder)
    except (SpecError, OSError, yaml.YAMLError):  # a broken validation folder: say nothing
        return []
    if env is None:
        return []
    c = env["claims"]
    bound, factors = widened(scn, env, out)
    head = (f"how sure: on {c.get('check_cases', '?')} held-out published runs (the check set) "
            f"the kernel model's tokens/s/GPU error is "
            f"{100 * c.get('median_abs_error', float('nan')):.1f}% median, within "
            f"{100 * c.get('p90_abs_error', float('nan')):.1f}% for 9 in 10 (worst "
            f"{100 * c.get('worst_abs_error', float('nan')):.0f}%; simfed validate --published, "
            "docs/accuracy.md)")
    rest = outside(scn, env)
    hybrid = hybrid_line(out, env)
    comm = comm_lines(scn, out, env, bound - scale_bound(float(scn.cluster.world), c))
    comm += memory_lines(out, env)
    if not factors and not rest:
        return [head + "; this scenario lies within the validated runs", *comm, *hybrid]
    lines = [head]
    if factors:
        lines[0] += f"; here within {100 * bound:.1f}% for 9 in 10, widened for:"
        lines += [f"  {text}: +{100 * x:.1f} pp" for text, x in factors]
    lines += comm
    if rest:
        lines.append("  also outside the validated runs (not widened, no check data): "
                     + "; ".join(rest))
    return lines + hybrid


def comm_lines(scn: Scenario, out: dict[str, Any] | None, env: dict[str, Any],
               widen: float = 0.0) -> list[str]:
    """One line per algorithm whose communication share falls in a band wider than the
    scenario's bound (`claim_bands.collective_bound`): its share, the band's check runs, median
    and bound (plus `widen`, what the scenario's factors beyond the validated runs add)."""
    return [f"  {a.get('label', a.get('name'))}: its collectives at line rate take "
            f"{math.floor(100 * share) / 100:.2f}x its compute time, where the check runs err "
            f"more: the {band['cases']} at {band['from']:.1f}x or more "
            f"{100 * band['median_abs_error']:.1f}% median, here within "
            f"{100 * (band['p90_abs_error'] + widen):.1f}% for 9 in 10"
            for a, share, band in collective_bound(scn, (out or {}).get("algorithms") or [],
                                                   env["claims"])]


def hybrid_line(out: dict[str, Any] | None, env: dict[str, Any] | None = None) -> list[str]:
    """Where a run compares a HYBRID_SHARD algorithm that replicates across nodes with another:
    how far the published HYBRID / FULL pairs' predicted ratio ran from the published one, at
    the band of the GPUs its model copies span (cases.yaml hybrid_over_full; `env`: the
    published envelope, default the shipped one's)."""
    algs = (out or {}).get("algorithms") or []
    if len(algs) < 2:
        return []
    if env is None:
        try:
            env = published_envelope()
        except (SpecError, OSError, yaml.YAMLError):
            return []
    h = (env or {}).get("hybrid_over_full") or {}
    m = h.get("min_gpus")
    if not m:
        return []
    out_lines = []
    for a in algs:
        plan = a.get("plan") or {}
        which = hybrid_band(plan.get("replicate", 1), plan.get("shard", 1), m)
        band = h.get(which) if which else None
        if not band:
            continue
        where = f"{'from' if which == 'at_scale' else 'below'} {m:,} GPUs"
        out_lines.append(
            f"  {a['label']} against the others: on {band['pairs']} published HYBRID / FULL "
            f"pairs {where} the predicted ratio is within -{100 * band['under']:.1f}% .. "
            f"+{100 * band['over']:.1f}% of the published for 9 in 10 (median "
            f"{100 * band['median_error']:+.1f}%; + overstates HYBRID)")
    return out_lines


def memory_lines(out: dict[str, Any] | None, env: dict[str, Any]) -> list[str]:
    """One line per algorithm whose predicted peak memory lies nearer its GPU's capacity than
    the check runs' predicted peaks lay from their published ones (claims
    memory_worst_abs_error): whether it fits is not settled."""
    c = env["claims"]
    worst, n = float(c.get("memory_worst_abs_error") or 0.0), int(c.get("memory_cases") or 0)
    if not n or not worst:
        return []
    median = float(c.get("memory_median_abs_error") or 0.0)
    lines = []
    for a in (out or {}).get("algorithms") or []:
        if not fit_unsettled(a, worst):
            continue
        peak, cap = a["peak_memory_bytes"], a["memory_capacity_bytes"]
        verdict = "it may not fit" if peak <= cap else "it may fit"
        lines.append(
            f"  {a.get('label', a.get('name'))}: predicted peak memory {peak / 2**30:.1f} of "
            f"{cap / 2**30:.1f} GiB; the {n} check runs whose source gives their peak were "
            f"within {100 * worst:.1f}% of it ({100 * median:.1f}% median): {verdict}")
    return lines
