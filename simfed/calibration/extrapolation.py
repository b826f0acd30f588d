"""Where a prediction leaves its calibration's samples.

A calibrated profile is measured at some link rates, message sizes, group sizes and model
sizes; `sample_ranges` records them in the calibration report. `extrapolation` says, per
quantity, where a scenario lies outside those ranges and by how far (in doublings), and
`widening` turns that into extra relative uncertainty of the step time: beyond its samples a
fit is known only as well as its residual scatter, so each doubling out of range adds the fit's
rms relative error, times the share of the step the quantity drives (collectives for link
rate, message and group size; compute for unit FLOPs; the optimizer for its shard size).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..spec import algorithm_info
from ..spec.scenario import Scenario
from .samples import Samples

# quantity -> (what it is, the fit whose scatter widens it, the part of the step it drives)
QUANTITIES = {
    "link_Gbps": ("inter-node link rate (Gb/s)", "collectives", "comm"),
    "message_bytes": ("largest collective message (bytes)", "collectives", "comm"),
    "group_ranks": ("largest process group (ranks)", "collectives", "comm"),
    "nodes": ("nodes", "collectives", "comm"),
    "unit_flops": ("largest unit's forward FLOPs per micro-batch", "compute", "compute"),
    "optimizer_params": ("parameters one rank's optimizer updates", "optimizer", "optimizer"),
}


def sample_ranges(scn: Scenario, samples: Samples) -> dict[str, list[float]]:
    """[min, max] of each quantity over the samples (those the samples have)."""
    out: dict[str, list[float]] = {}

    def put(key: str, values: list[float]) -> None:
        if values:
            out[key] = [float(min(values)), float(max(values))]

    rate = scn.cluster.node.nics.bw_Gbps
    inter = [c for c in samples.comm if c.world > c.gpus_per_node]
    put("link_Gbps", [c.link_Gbps or rate for c in inter])
    put("message_bytes", [float(c.nbytes) for c in samples.comm])
    put("group_ranks", [float(max(len(i) for i in c.instances)) for c in samples.comm])
    put("nodes", [float(-(-c.world // c.gpus_per_node)) for c in samples.comm])
    put("unit_flops", [u.flops for u in samples.units if u.phase == "forward"])
    put("optimizer_params", [o.params for o in samples.optimizer])
    return out


def scenario_quantities(scn: Scenario, algorithms: list[str] | None = None
                        ) -> dict[str, float]:
    """The same quantities for a scenario's training (the algorithms named, else all)."""
    m, c = scn.model, scn.cluster
    units = m.units(scn.training.seq_len)
    tokens = scn.training.seq_len * scn.training.micro_batch
    msg = max(u.nbytes for u in units)
    ranks, opt = 1, 0.0
    for a in scn.algorithms:
        if algorithms and (a.label or a.name) not in algorithms and a.name not in algorithms:
            continue
        plan = a.plan(c)
        ranks = max(ranks, plan.shard * plan.replicate)
        opt = max(opt, m.total_params / plan.shard)
        if algorithm_info(a.name).federated and plan.groups > 1:
            ranks = max(ranks, plan.groups)
            msg = max(msg, -(-m.total_params // plan.shard) * (2 if a.fedavg_dtype == "bf16"
                                                                else 4))
    q = {"message_bytes": float(msg), "group_ranks": float(ranks), "nodes": float(c.nodes),
         "unit_flops": max(u.fwd_flops_per_token for u in units) * tokens,
         "optimizer_params": opt}
    if c.nodes > 1:
        q["link_Gbps"] = c.node.nics.bw_Gbps
    return q


def extrapolation(ranges: dict[str, list[float]], quantities: dict[str, float]
                  ) -> list[dict[str, Any]]:
    """Each quantity outside its samples' range: {quantity, what, value, range, doublings}."""
    out = []
    for key, value in quantities.items():
        if key not in ranges or value <= 0:
            continue
        lo, hi = ranges[key]
        # a range over one value (one link rate) still covers that value, within 1%
        if lo * 0.99 <= value <= hi * 1.01:
            continue
        bound = hi if value > hi else lo
        out.append({"quantity": key, "what": QUANTITIES[key][0], "value": value,
                    "range": [lo, hi], "doublings": abs(math.log2(value / bound))})
    return out


def widening(flags: list[dict[str, Any]], rms: dict[str, float], shares: dict[str, float]
             ) -> float:
    """Extra relative standard deviation of the step time from extrapolating: per quantity out
    of range, its doublings x its fit's rms relative error x the share of the step it drives;
    summed (the errors of one fit out of range are not independent)."""
    extra = 0.0
    for f in flags:
        _what, fit, part = QUANTITIES[f["quantity"]]
        r = rms.get(fit)
        if r is None or not math.isfinite(r):
            continue
        extra += f["doublings"] * r * shares.get(part, 0.0)
    return extra


def describe(flags: list[dict[str, Any]]) -> list[str]:
    """One line per quantity out of range."""
    return [f"extrapolating {f['what']}: {f['value']:.4g} outside the calibration's samples "
            f"{f['range'][0]:.4g}..{f['range'][1]:.4g} ({f['doublings']:.2f} doublings)"
            for f in flags]


def report_for_profile(profile: str | Path) -> dict[str, Any] | None:
    """The calibration report written beside a profile (`simfed calibrate`: PROFILE.json;
    `simfed validate`: calibration[-SHAPE].json beside profile[-SHAPE].yaml), if any."""
    p = Path(profile)
    for cand in (p.with_suffix(".json"),
                 p.with_name(p.name.replace("profile", "calibration", 1)).with_suffix(".json")):
        if cand != p and cand.is_file():
            try:
                data = json.loads(cand.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return None
            return data if isinstance(data, dict) and "ranges" in data else None
    return None


Z80 = 1.2816  # a normal's p90, in standard deviations


def step_shares(result: dict[str, Any]) -> dict[str, float]:
    """The share of an algorithm's predicted step in collectives, the optimizer and the rest
    (compute, host work): what each quantity out of range drives."""
    step = result["step_time_s"]
    if step <= 0:
        return {}
    shares = {"comm": result["exposed_comm_s"] / step,
              "optimizer": result["phases_s"].get("optimizer", 0.0) / step}
    shares["compute"] = max(0.0, 1.0 - shares["comm"] - shares["optimizer"])
    return shares


def for_run(scn: Scenario, profile: str | Path, out: dict[str, Any],
            algorithms: list[str] | None = None) -> list[str]:
    """`simfed run --profile`: where the scenario leaves the profile's samples, per quantity,
    and by how much that widens each algorithm's step time (a p10-p90 half-width, relative,
    on top of the calibration's own uncertainty); recorded in `out` as `extrapolating`. No
    report beside the profile: nothing is known of its samples, nothing is said."""
    rep = report_for_profile(profile)
    if rep is None:
        return []
    flags = extrapolation(rep["ranges"], scenario_quantities(scn, algorithms))
    rms = {k: v.get("rms_rel_error") for k, v in rep.get("fits", {}).items()}
    lines = describe(flags)
    widen = {}
    for r in out.get("algorithms", []):
        extra = widening(flags, {k: v for k, v in rms.items() if v is not None},
                         step_shares(r))
        widen[r["name"]] = extra
        if flags:
            lines.append(f"  {r['name']}: step {r['step_time_s']:.4g} s, interval widened by "
                         f"+-{Z80 * extra:.1%} (p10-p90) for extrapolating")
    out["extrapolating"] = {"quantities": flags, "widening_rel_sd": widen}
    return lines
