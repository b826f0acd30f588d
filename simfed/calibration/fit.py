"""Fitting the simulator's constants to measurements, with confidence intervals and residuals.

- Collectives: the simulator's own alpha-beta model, t = launch + steps x hop(link class) +
  max over links (bytes on the link / its bandwidth), evaluated with the simulator's ring
  geometry for each sample's group shape (so fit and prediction cannot disagree on geometry);
  unknowns: the per-collective launch cost, the per-step latency of intra- and inter-node hops,
  and the intra- and inter-node bandwidths. Nonlinear least squares (scipy) on relative
  residuals; 95% intervals from the Jacobian.
- Compute: per phase, t = overhead + FLOPs / rate (linear regression).
- Optimizer: t = overhead + params x bytes-per-param / bandwidth.
- Debug checks: t = hop x (2 (p - 1) + 2 + (p - 1))... i.e. the simulator's check model with
  rank 0's per-peer cost taken as half a hop; one unknown, the gloo hop.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats

from ..compute import optimizer_bytes_per_param as _optimizer_bytes
from ..spec.scenario import Scenario
from ..spec.stats import expected_max_normal
from .fit_comm import fit_comm
from .result import (
    MIN_REL_SCATTER,
    FitResult,
    Param,
    ci95,
    unidentified,
)
from .samples import ABS_OF_SD, Samples

# ---- compute, optimizer, checks ----------------------------------------------------------------

def _line(x: np.ndarray, t: np.ndarray, fixed_intercept: float | None = None
          ) -> tuple[float, float, np.ndarray]:
    """t = intercept + slope x by least squares: (slope, intercept, cov of (slope, intercept));
    with `fixed_intercept`, only the slope (the intercept's variance 0). The covariance is the
    residuals' plus that of a MIN_REL_SCATTER relative scatter of each timing (weighted least
    squares' (X^T W X)^-1): a line through its points exactly still has an interval."""
    n = len(x)
    w = 1.0 / (MIN_REL_SCATTER * t) ** 2
    if fixed_intercept is not None:
        slope = float(np.sum(x * (t - fixed_intercept)) / np.sum(x * x))
        r = t - fixed_intercept - slope * x
        var = float(np.sum(r * r)) / max(1, n - 1) / float(np.sum(x * x)) \
            + 1.0 / float(np.sum(w * x * x))
        return slope, fixed_intercept, np.array([[var, 0.0], [0.0, 0.0]])
    X = np.column_stack([x, np.ones(n)])
    (slope, inter), *_ = np.linalg.lstsq(X, t, rcond=None)
    r = t - inter - slope * x
    s2 = float(np.sum(r * r)) / max(1, n - 2)
    cov = np.linalg.inv(X.T @ X) * s2 + np.linalg.inv(X.T @ (X * w[:, None]))
    return float(slope), float(inter), cov


def _rate_and_overhead(res: FitResult, x: np.ndarray, t: np.ndarray, names: tuple[str, str],
                       units: tuple[str, str], k_rate: float, configured_over_s: float
                       ) -> tuple[float, float]:
    """Fit t = overhead + x / rate; the overhead is used only if the samples identify it, else
    it stays at the scenario's value (`configured_over_s`) and the rate is fitted alone. Adds
    both (or the rate) to `res` with their covariance; returns (slope, overhead) in s."""
    rate_name, over_name = names
    if np.ptp(x) > 0:
        slope, inter, cov = _line(x, t)
        over = Param(over_name, inter * 1e6, ci95(inter * 1e6, math.sqrt(cov[1, 1]) * 1e6),
                     units[1])
        why = unidentified(over) or ("below zero" if inter < 0 else "")
    else:
        over = Param(over_name, float("nan"), (float("nan"), float("nan")), units[1])
        why = "one size only: the overhead and the rate are not told apart"
    if why:
        res.not_used[over_name] = {**over.as_dict(), "reason": why,
                                   "kept": f"the scenario's {configured_over_s * 1e6:g} us"}
        slope, inter, cov = _line(x, t, configured_over_s)
        slope = max(slope, 1e-30)
    rate = k_rate / slope
    d = np.array([-k_rate / slope**2, 1e6])  # d rate / d slope, d overhead_us / d intercept
    pcov = cov * np.outer(d, d)
    res.params.append(Param(rate_name, rate, ci95(rate, math.sqrt(pcov[0, 0])), units[0]))
    names_used = [rate_name]
    if not why:
        res.params.append(Param(over_name, inter * 1e6, ci95(inter * 1e6,
                                                            math.sqrt(pcov[1, 1])), units[1]))
        names_used.append(over_name)
    # one block per (rate, overhead): merged into the fit's covariance
    k = len(names_used)
    old = res.cov if res.cov is not None else np.zeros((0, 0))
    m = old.shape[0]
    new = np.zeros((m + k, m + k))
    new[:m, :m] = old
    new[m:, m:] = pcov[:k, :k]
    res.cov, res.cov_names = new, [*res.cov_names, *names_used]
    return slope, inter


def fit_units(samples: Samples, scn: Scenario | None = None) -> FitResult:
    """Per phase, t = overhead + FLOPs / rate; the overhead only where the samples identify
    it (else the scenario's `unit_overhead_*_us`)."""
    res = FitResult(kind="compute")
    for phase in ("forward", "backward"):
        pts = [u for u in samples.units if u.phase == phase]
        if len(pts) < 2:
            continue
        flops = np.array([u.flops for u in pts])
        t = np.array([u.time_s for u in pts])
        conf = getattr(scn.runtime.compute, f"unit_overhead_{phase}_us", 0.0) * 1e-6 \
            if scn is not None else 0.0
        slope, over = _rate_and_overhead(res, flops, t, (f"{phase}_flops_per_s",
                                                         f"{phase}_overhead_us"),
                                         ("FLOP/s", "us"), 1.0, conf)
        pred = over + flops * slope
        for u, p in zip(pts, pred, strict=True):
            res.residuals.append({"label": f"{u.label} {u.flops:.3g} FLOP", "measured_s": u.time_s,
                                  "predicted_s": float(p),
                                  "rel_error": float((float(p) - u.time_s) / u.time_s)})
    if not res.params:
        res.note = "no compute samples: efficiencies left as in the scenario"
    return res


def optimizer_bytes_per_param(scn: Scenario) -> float:
    """The bytes per shard element the scenario's optimizer step moves
    (`simfed.compute.optimizer_bytes_per_param`: its kernels, gradient clipping included)."""
    return _optimizer_bytes(scn.model, scn.training)[0]


def fit_optimizer(scn: Scenario, samples: Samples) -> FitResult:
    res = FitResult(kind="optimizer")
    pts = samples.optimizer
    if len(pts) < 2:
        res.note = "fewer than 2 optimizer samples: optimizer constants left as in the scenario"
        return res
    bpp = optimizer_bytes_per_param(scn)
    nbytes = np.array([o.params * bpp for o in pts])
    t = np.array([o.time_s for o in pts])
    slope, over = _rate_and_overhead(res, nbytes, t, ("optimizer_GBps", "optimizer_overhead_us"),
                                     ("GB/s", "us"), 1e-9,
                                     scn.runtime.compute.optimizer_overhead_us * 1e-6)
    for o, b in zip(pts, nbytes, strict=True):
        pred = over + b * slope
        res.residuals.append({"label": f"adamw {o.params:.3g} params", "measured_s": o.time_s,
                              "predicted_s": float(pred),
                              "rel_error": float((pred - o.time_s) / o.time_s)})
    return res


def _through_origin(res: FitResult, xs: list[float], ts: list[float], labels: list[str]
                    ) -> tuple[float, float]:
    """Least squares t = k x through the origin; records residuals; returns (k, its std err)."""
    x = np.array(xs, dtype=float)
    t = np.array(ts, dtype=float)
    k = float(np.sum(x * t) / np.sum(x * x))
    dof = max(1, len(x) - 1)
    se = math.sqrt(float(np.sum((t - k * x) ** 2)) / dof / float(np.sum(x * x)))
    for xi, ti, label in zip(x, t, labels, strict=True):
        pred = k * xi
        res.residuals.append({"label": label, "measured_s": float(ti), "predicted_s": float(pred),
                              "rel_error": float((pred - ti) / ti)})
    return k, se


def fit_fedavg(samples: Samples) -> FitResult:
    """FedAvg's local work: time = bytes / bandwidth (least squares through the origin)."""
    res = FitResult(kind="fedavg_local")
    pts = samples.fedavg
    if not pts:
        res.note = "no FedAvg samples: its local work is taken as free"
        return res
    s_per_byte, se = _through_origin(res, [p.nbytes for p in pts], [p.time_s for p in pts],
                                     [f"fedavg local {p.nbytes:.3g} B" for p in pts])
    bw = 1e-9 / s_per_byte
    res.params.append(Param("fedavg_local_GBps", bw, ci95(bw, 1e-9 * se / s_per_byte**2), "GB/s"))
    return res


def fit_out_of_step(samples: Samples, what: str = "comm", compute_cv: float = 0.0
                    ) -> FitResult:
    """How much longer, and how much more unevenly across ranks, a collective (`what` comm) or
    the compute block (compute) runs when the other ranks on its cores run a training-like loop
    out of step with it (compute, then their own collectives, free-running) than when they run
    the same work in step (every group at once from a barrier: the condition of the other
    samples and of the simulator's in-step ranks).
    - slowdown: t_busy = (1 + slowdown) x t_in_step, least squares through the origin;
    - cv: a rank's time's relative standard deviation beyond that in step,
      sqrt(cv_busy^2 - cv_in_step^2) per case, the median over cases. For collectives, where
      the bench ran the training-like loop itself (`Samples.loops`), the cv comes from how far
      apart the loop's ranks reached its all-gather instead, which is what the simulator's
      waits are made of: beside out-of-step ranks against beside idle ones, less the compute
      block's own spread (`compute_cv`), over the all-gather's time less its waits."""
    res = FitResult(kind=f"out_of_step_{what}")
    pts = samples.beside if what == "comm" else samples.compute_beside
    loops = samples.loops if what == "comm" else []
    if not pts and not loops:
        res.note = ("no beside-busy samples (the ranks have cores to themselves, or an older "
                    f"bench): {what} is not slowed by out-of-step ranks")
        return res
    notes = []
    if pts:
        k, se = _through_origin(res, [p["all_groups_s"] for p in pts],
                                [p["time_s"] for p in pts],
                                [f"beside busy: {p['label']}" for p in pts])
        for r, p in zip(res.residuals, pts, strict=True):
            r["all_groups_s"] = p["all_groups_s"]
            if p.get("idle_s") is not None:
                r["idle_s"] = p["idle_s"]
        res.params.append(Param("out_of_step_slowdown", max(k - 1.0, 0.0), ci95(k - 1.0, se), ""))
        if k < 1.0:
            notes.append(f"{what} beside out-of-step ranks ran {1 - k:.1%} faster than in "
                         "step: no slowdown")
    excess = [math.sqrt(max(p["cv"] ** 2 - (p.get("all_groups_cv") or 0.0) ** 2, 0.0))
              for p in pts if p.get("cv") is not None]
    if loops:
        excess = [_loop_cv(p, compute_cv) for p in loops]
        notes.append(f"cv from {len(loops)} free-running loop case(s): " + ", ".join(
            f"{p['label']}: arrivals {p['arrival_sd_s'] * 1e3:.1f} ms apart beside busy ranks, "
            f"{p['idle_arrival_sd_s'] * 1e3:.1f} beside idle" for p in loops))
    res.note = "; ".join(notes)
    if excess:
        cv = float(np.median(excess))
        lo, hi = (np.percentile(excess, [2.5, 97.5]) if len(excess) > 2
                  else (math.nan, math.nan))  # one or two cases: no interval
        res.params.append(Param("out_of_step_cv", cv, (float(lo), float(hi)), ""))
        for p in loops:  # the arrival spread each loop case gets back from the fitted cv
            got = math.sqrt(p["idle_arrival_sd_s"] ** 2 + (compute_cv * p["block_s"]) ** 2
                            + (cv * _loop_solo_s(p)) ** 2)
            res.residuals.append({"label": f"arrival spread: {p['label']}",
                                  "measured_s": p["arrival_sd_s"], "predicted_s": got,
                                  "rel_error": (got - p["arrival_sd_s"]) / p["arrival_sd_s"]})
    return res


def _loop_solo_s(p: dict[str, Any]) -> float:
    """The loop's all-gather beside idle ranks less its expected wait (a rank waits, on
    average, E[max of n normals] x sd for the latest of its group)."""
    return p["idle_coll_s"] - expected_max_normal(p["group_size"]) * p["idle_arrival_sd_s"]


def _loop_cv(p: dict[str, Any], compute_cv: float) -> float:
    """A collective's end spread beside out-of-step ranks, relative to its own time, from the
    bench's loop: the arrival spread (a rank's sd) beyond that beside idle ranks, less the
    block's share (compute_cv x block), over the all-gather's own time (`_loop_solo_s`)."""
    extra = p["arrival_sd_s"] ** 2 - p["idle_arrival_sd_s"] ** 2 - (compute_cv * p["block_s"]) ** 2
    solo = _loop_solo_s(p)
    return math.sqrt(max(extra, 0.0)) / solo if solo > 0 else 0.0


def fit_group_drift(samples: Samples) -> FitResult:
    """How fast federation groups on cores of their own drift apart (the bench's drift case:
    two groups run the training-like loop free from a common start): a random walk, a rank's
    variance growing as rate x time, so two groups' ends differ by sd^2 = 2 x rate x T. The
    simulator turns it into a mean wait (the expected latest of the group), so the sd is taken
    from the mean size of the difference, sd = E|d| x sqrt(pi/2) as for a normal d, not from
    its rms: one stall of a second in a round (a busy host) would otherwise set the rate of
    every round. Pooled over the cases' rounds (weighted by rounds), with a chi-square 95%
    interval on as many degrees of freedom (exact for a normal d); the parameter is the rate's
    square root, a rank's standard deviation after 1 s, in ms."""
    res = FitResult(kind="group_drift")
    pts = samples.drifts
    if not pts:
        res.note = ("no drift samples (fewer than 2 nodes, nodes sharing cores, or an older "
                    "bench): groups are taken to stay in step between FedAvg rounds")
        return res
    n = sum(p["samples"] for p in pts)
    rate = sum(p["samples"] * (p["mean_abs_s"] / ABS_OF_SD) ** 2 / (2 * p["time_s"])
               for p in pts) / n
    lo, hi = (rate * n / stats.chi2.ppf(q, n) for q in (0.975, 0.025))
    res.params.append(Param("group_drift_ms_per_sqrt_s", math.sqrt(rate) * 1e3,
                            (math.sqrt(lo) * 1e3, math.sqrt(hi) * 1e3), "ms/sqrt(s)"))
    for p in pts:
        got = math.sqrt(2 * rate * p["time_s"]) * ABS_OF_SD
        res.residuals.append({"label": f"{p['label']} ({p['time_s']:.2f} s): mean |d|",
                              "measured_s": p["mean_abs_s"], "predicted_s": got,
                              "rel_error": (got - p["mean_abs_s"]) / p["mean_abs_s"]})
    res.note = ", ".join(f"{p['label']}: groups {p['mean_abs_s'] * 1e3:.1f} ms apart (mean; "
                         f"rms {p['rms_s'] * 1e3:.1f}) after {p['time_s']:.2f} s, "
                         f"{p['samples']} rounds" for p in pts)
    return res


def check_units(p: int) -> float:
    """Debug-check cost in gloo hops for a group of p (rank 0's per-peer cost = half a hop):
    (p-1) hops + 2(p-1) x 0.5 hop + 2 hops."""
    return (p - 1) + (p - 1) + 2


def fit_checks(samples: Samples) -> FitResult:
    res = FitResult(kind="debug_checks")
    pts = [c for c in samples.checks if c.group_size >= 2]
    if not pts:
        res.note = "no debug-check samples: host check constants left as in the scenario"
        return res
    hop, se = _through_origin(res, [check_units(c.group_size) for c in pts],
                              [c.time_s for c in pts], [f"check p={c.group_size}" for c in pts])
    res.params.append(Param("gloo_hop_us", hop * 1e6, ci95(hop * 1e6, se * 1e6), "us"))
    return res


def _configured(scn: Scenario, *paths: str) -> float:
    """The scenario's value at the first of these dotted runtime paths that exists (keys move
    between releases), else 0."""
    for path in paths:
        obj: Any = scn
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, (int, float)):
            return float(obj)
    return 0.0


def fit_all(scn: Scenario, samples: Samples, force: tuple[str, ...] = ()) -> list[FitResult]:
    """Every fit the calibration uses, in `calibrate`'s order: collectives, compute, optimizer,
    debug checks, FedAvg local work, out-of-step collectives, out-of-step compute, group drift;
    each with only the parameters its samples identify (`FitResult.not_used`: the others, which
    keep the scenario's value). `force`: name prefixes used whatever their interval (to see
    what a mechanism whose coefficients the samples do not identify would have done)."""
    cstep = fit_out_of_step(samples, "compute")
    cstep.drop_unidentified(force=force)
    cv = next((p.value for p in cstep.params if p.name == "out_of_step_cv"), None)
    if cv is None:
        cv = _configured(scn, "runtime.shared_cores.compute_cv",
                         "runtime.compute.out_of_step_cv")
    step = fit_out_of_step(samples, "comm", compute_cv=cv)
    drift = fit_group_drift(samples)
    fits = [fit_comm(scn, samples, force), fit_units(samples, scn), fit_optimizer(scn, samples),
            fit_checks(samples), fit_fedavg(samples), step, cstep, drift]
    for f in fits:
        f.drop_unidentified(force=force)
    return fits
