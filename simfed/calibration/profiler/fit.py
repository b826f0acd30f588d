"""The fit of the kernel model's efficiencies to per-operator samples (`fit_ops`), and what it
puts into a calibrated profile (`apply_to_profile`).

Fitting (`fit_ops`). The kernel model (simfed/compute.py) times each sample as
  gap + max(c / gemm_efficiency, b / hbm_efficiency)    a GEMM
  gap + b / hbm_efficiency                              a memory-bound operator
  gap + F / (peak x attention_efficiency_{forward,backward})    attention
where c is the GEMM's FLOPs at the GPU's peak over its tile and wave quantisation (the model's
`gemm_efficiency(m, n, k)` at efficiency 1), b its bytes over the nominal HBM bandwidth, and gap
a fixed time per operator (`kernel_gap_us`). Nonlinear least squares (scipy) on relative
residuals, each sample weighted by its share of the traced time, the parameters in log space so
they stay positive: a robust (soft-L1) first pass, then a plain one with each kind of operator
weighted by its own scatter in the first (so that how badly memory-bound operators fit does not
widen the GEMMs' interval); 95% intervals from the Jacobian. A parameter the samples do not
identify (`result.unidentified`: a 95% interval wider than +-50%, or none) is fixed at the
scenario's value and the rest refitted, as in the other calibration fits. An
efficiency above 1 is not used either (the scenario's peak or bandwidth is then below what was
measured).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..result import MIN_REL_SCATTER, FitResult, Param, covariance, unidentified
from .ops import NO_SHAPES, OpSample, pooled

PARAMS = {  # name -> (unit, the kernel class it times)
    "gemm_efficiency": ("fraction of peak", "gemm"),
    "hbm_efficiency": ("fraction of HBM bandwidth", "memory"),
    "attention_efficiency_forward": ("fraction of peak", "attention"),
    "attention_efficiency_backward": ("fraction of peak", "attention"),
    "kernel_gap_us": ("us", ""),
}


@dataclass(frozen=True)
class Terms:
    """Each sample's time at efficiency 1 (s) by class: the GEMM's compute part (tile and wave
    quantisation included), the bytes part, the attention FLOPs part (forward or backward)."""

    compute: np.ndarray
    memory: np.ndarray
    attn_fwd: np.ndarray
    attn_bwd: np.ndarray
    is_gemm: np.ndarray
    measured: np.ndarray


def terms(samples: list[OpSample], peak_flops: float, hbm_Bps: float, quantisation,
          causal_skip: bool = True) -> Terms:
    """`quantisation(m, n, k)`: the kernel model's GEMM efficiency at gemm_efficiency 1;
    `causal_skip`: causal attention does half the FLOPs (runtime.compute.causal_skip)."""
    n = len(samples)
    comp, mem, af, ab = (np.zeros(n) for _ in range(4))
    is_gemm = np.zeros(n, dtype=bool)
    for i, s in enumerate(samples):
        if s.kind == "gemm":
            _b, m, nn, k = s.gemm  # b: s.flops and s.nbytes count the batch already
            comp[i] = s.flops / (peak_flops * quantisation(m, nn, k))
            mem[i] = s.nbytes / hbm_Bps
            is_gemm[i] = True
        elif s.kind == "memory":
            mem[i] = s.nbytes / hbm_Bps
        else:
            f = s.flops / (2 if s.causal and causal_skip else 1) / peak_flops
            if s.phase == "backward":
                ab[i] = f
            else:
                af[i] = f
    return Terms(comp, mem, af, ab, is_gemm, np.array([s.time_s for s in samples]))


def predict(t: Terms, v: dict[str, float]) -> np.ndarray:
    """The kernel model's time of each sample with the parameter values `v`."""
    gap = v["kernel_gap_us"] * 1e-6
    mem = t.memory / v["hbm_efficiency"]
    gemm = np.maximum(t.compute / v["gemm_efficiency"], mem)
    return gap + np.where(t.is_gemm, gemm, mem) \
        + t.attn_fwd / v["attention_efficiency_forward"] \
        + t.attn_bwd / v["attention_efficiency_backward"]


def _identifiable(samples: list[OpSample]) -> list[str]:
    kinds = {s.kind for s in samples}
    names = [p for p, (_, k) in PARAMS.items() if not k or k in kinds]
    phases = {s.phase for s in samples if s.kind == "attention"}
    need = {"attention_efficiency_forward": "forward", "attention_efficiency_backward": "backward"}
    return [p for p in names if p not in need or need[p] in phases]


def fit_ops(samples: list[OpSample], configured: dict[str, float], peak_flops: float,
            hbm_Bps: float, quantisation, device: str = "", causal_skip: bool = True
            ) -> FitResult:
    """Fit the kernel model's efficiencies and per-operator gap to `samples` (one device);
    `configured`: the scenario's values (what stands for a parameter not identified)."""
    from scipy import optimize

    res = FitResult(kind="kernels")
    samples = pooled(samples)
    if not samples:
        res.note = "no per-operator samples (a torch.profiler trace with record_shapes)"
        return res
    t = terms(samples, peak_flops, hbm_Bps, quantisation, causal_skip)
    # each sample weighs by its share of the traced time (calls x median): the operators that
    # make up the step time set the fit, not the many microsecond-long scalar ones; relative
    # residuals x sqrt(share x n), so that equal shares give the plain relative fit
    share = np.array([len(s.times_s) for s in samples]) * t.measured
    weight = np.sqrt(share / share.sum() * len(samples))
    kinds = np.array([s.kind for s in samples])
    free = _identifiable(samples)
    fixed = {k: v for k, v in configured.items() if k not in free}
    reasons: dict[str, str] = {}
    for p in PARAMS:
        if p not in free:
            reasons[p] = "no samples of its kind in the traces"
    while True:
        vals = dict(configured)
        vals.update(fixed)
        if not free:
            break
        # start from the scenario's values; a gap configured 0 from the shortest samples'
        # times (log space cannot start at 0)
        start = {**configured, "kernel_gap_us": configured["kernel_gap_us"]
                 or float(np.percentile(t.measured, 10)) * 1e6}
        x0 = np.log(np.array([max(start[p], 1e-9) for p in free]))

        def resid(x, wt, free=free, vals=vals):
            v = {**vals, **dict(zip(free, np.exp(x), strict=True))}
            return wt * (predict(t, v) - t.measured) / t.measured

        # two passes: the second weighs each kind of operator by its own scatter in the first
        # (how well the model describes memory-bound operators says nothing about GEMMs)
        sol = optimize.least_squares(resid, x0, args=(weight,), loss="soft_l1", f_scale=0.1)
        # (a kind with no more samples than its own parameters has no scatter of its own: it
        # gets the largest of the others', or none is known and the fit has no interval)
        scatter: dict[str, float] = {}
        for k, own in (("gemm", 1), ("memory", 1), ("attention", 2)):
            sel = kinds == k
            if sel.sum() > own:
                scatter[k] = max(math.sqrt(float(np.mean(sol.fun[sel] ** 2))),
                                 MIN_REL_SCATTER)
        wt = weight.copy()
        for k in ("gemm", "memory", "attention"):
            sel = kinds == k
            if sel.any():
                wt[sel] /= scatter.get(k, max(scatter.values(), default=float("inf")))
        sol = optimize.least_squares(resid, sol.x, args=(wt,), loss="linear")
        r = sol.fun
        dof = max(1, len(r) - len(free))
        s2 = max(float(np.sum(r * r)) / dof, MIN_REL_SCATTER ** 2)
        cov = covariance(sol.jac, s2) if len(r) > len(free) else \
            np.full((len(free), len(free)), np.inf)
        params = []
        for i, p in enumerate(free):
            se = math.sqrt(cov[i, i]) if math.isfinite(cov[i, i]) else float("inf")
            val = float(math.exp(sol.x[i]))
            lo, hi = (val * math.exp(-1.96 * se), val * math.exp(1.96 * se)) \
                if math.isfinite(se) else (float("nan"), float("nan"))
            params.append(Param(p, val, (lo, hi), PARAMS[p][0]))
        worst, why = None, ""
        for q in params:  # the widest unidentified one (relative half-width) goes first
            w = unidentified(q) or ("above 1: measured faster than the scenario's peak or "
                                    "bandwidth allows" if q.name != "kernel_gap_us"
                                    and q.value > 1 else "")
            if w:
                rel = (q.ci95[1] - q.ci95[0]) / q.value if math.isfinite(q.ci95[1]) else \
                    float("inf")
                if worst is None or rel > worst[0]:
                    worst, why = (rel, q), w
        if worst is None:
            res.params = params
            vals.update({q.name: q.value for q in params})
            res.cov, res.cov_names = None, []
            break
        q = worst[1]
        res.not_used[q.name] = {**q.as_dict(), "reason": why,
                                "kept": f"the scenario's {configured[q.name]:g}"}
        fixed[q.name] = configured[q.name]
        free = [p for p in free if p != q.name]
    for p, why in reasons.items():
        res.not_used.setdefault(p, {"value": None, "ci95": [None, None],
                                    "unit": PARAMS[p][0], "reason": why,
                                    "kept": f"the scenario's {configured[p]:g}"})
    pred = predict(t, vals)
    for s, p in zip(samples, pred, strict=True):
        res.residuals.append({"label": s.label, "kind": s.kind, "measured_s": s.time_s,
                              "predicted_s": float(p),
                              "rel_error": float((p - s.time_s) / s.time_s)})
    res.note = (f"{len(samples)} operator samples ({sum(len(s.times_s) for s in samples)} "
                f"calls) on {device or 'one device'}; rms rel error by kind: " + ", ".join(
                    f"{k} {v:.1%} (n={sum(r['kind'] == k for r in res.residuals)})"
                    for k, v in kind_rms(res).items()))
    return res


def kind_rms(res: FitResult) -> dict[str, float]:
    """The rms relative error of a kernels fit's residuals, per kind of operator."""
    out = {}
    for k in ("gemm", "attention", "memory"):
        e = [r["rel_error"] for r in res.residuals if r.get("kind") == k]
        if e:
            out[k] = math.sqrt(sum(x * x for x in e) / len(e))
    return out


def _same_gpu(name: str, device: str) -> bool:
    """The scenario's GPU name and a trace's device name (deviceProperties) name one model:
    one holds the other, or they share a model token ("h100" in "H100-SXM-80GB" and "NVIDIA
    H100 80GB HBM3")."""
    a, b = name.lower(), device.lower()
    if a in b or b in a:
        return True
    model = re.compile(r"[a-z]+[0-9]+[a-z0-9]*")
    return bool(set(model.findall(a)) & set(model.findall(b)))


def fit_scenario(scn: Any, samples: list[OpSample], device: str | None = None
                 ) -> tuple[FitResult, str]:
    """`fit_ops` against `scn`'s GPU (peak, HBM bandwidth, SMs, GEMM tiles) on the samples of
    `device`, by default the device the scenario describes: the only device in the traces, or
    the one whose name holds the scenario's GPU name. Returns (fit, the device fitted)."""
    rt = scn.runtime.compute
    devices = sorted({s.device for s in samples}) if device is None else [device]
    gpu = scn.cluster.node.gpu.name
    if len(devices) > 1:
        match = [d for d in devices if _same_gpu(gpu, d)]
        if len(match) != 1:
            res = FitResult(kind="kernels")
            res.note = (f"traces from {len(devices)} devices ({', '.join(devices)}) and none "
                        f"(or several) named like the scenario's GPU {gpu!r}: not fitted")
            return res, ""
        devices = match
    device = devices[0] if devices else ""
    hw, unit = _unit_model(scn)
    configured = {p: float(getattr(rt, p)) for p in PARAMS}
    res = fit_ops([s for s in samples if s.device == device], configured, hw.peak_flops,
                  hw.hbm_Bps, unit.gemm_efficiency, device, rt.causal_skip)
    return res, device


def _unit_model(scn: Any):
    from ...compute import ComputeModel
    from ...hardware import Hardware

    hw = Hardware.from_spec(scn.cluster, scn.runtime)
    return hw, ComputeModel(hw=hw, rt=replace(scn.runtime.compute, gemm_efficiency=1.0),
                            tokens_per_gpu=1)


def predict_for(scn: Any, samples: list[OpSample], fit: FitResult | None = None
                ) -> np.ndarray:
    """The kernel model's time of each sample (median of its calls) on `scn`'s GPU, with the
    parameters `fit` uses (the rest at the scenario's values)."""
    hw, unit = _unit_model(scn)
    v = {p: float(getattr(scn.runtime.compute, p)) for p in PARAMS}
    if fit is not None:
        v.update({p.name: p.value for p in fit.params})
    return predict(terms(samples, hw.peak_flops, hw.hbm_Bps, unit.gemm_efficiency,
                         scn.runtime.compute.causal_skip), v)


def apply_to_profile(scn: Any, samples: Any, profile: dict[str, Any],
                     report: dict[str, Any]) -> FitResult | None:
    """Fit the kernel model to `samples.ops` and put what they identify into `profile`
    (runtime.compute.*, with provenance) and the fit into `report["fits"]["kernels"]`.
    The values take effect where the scenario runs `runtime.compute.model: kernels`."""
    ops: list[OpSample] = samples.ops
    if not ops:
        bare = sorted(k.removeprefix(NO_SHAPES) for k in samples.meta if k.startswith(NO_SHAPES))
        if bare:  # profiled, but without record_shapes: say why nothing was fitted
            res = FitResult(kind="kernels", note=(
                f"no operator samples: {', '.join(bare)} has no shapes (\"Input Dims\"); "
                "profile with record_shapes=True (realrun run --profile-steps does)"))
            report.setdefault("fits", {})["kernels"] = res.as_dict()
            return res
        return None
    res, device = fit_scenario(scn, ops)
    fits = report.setdefault("fits", {})
    fits["kernels"] = {**res.as_dict(), "device": device}
    for other in sorted({s.device for s in ops} - {device}):  # reported, not in the profile
        o, _ = fit_scenario(scn, ops, other)
        o.note += " (not the scenario's GPU: in the report only, against its figures)"
        fits[f"kernels {other}"] = {**o.as_dict(), "device": other}
    if not res.params:
        return res
    rms = kind_rms(res)
    runtime = profile.setdefault("runtime", {})
    compute = runtime.setdefault("compute", {})
    prov = runtime.setdefault("provenance", {})
    srcs = sorted({src for s in ops if s.device == device for src in s.source.split(", ")})
    where = srcs[0] if len(srcs) == 1 else f"{len(srcs)} traces ({srcs[0]}, ...)"
    for p in res.params:
        kind = PARAMS[p.name][1] or "all"
        compute[p.name] = round(p.value, 3 if p.name == "kernel_gap_us" else 6)
        prov[f"runtime.compute.{p.name}"] = (
            f"fitted to torch.profiler operator times on {device} (kernel model, n="
            f"{len(res.residuals)} operator samples, rms rel error of its {kind}"
            f" operators {rms.get(kind, res.rms_rel_error):.1%}, 95% CI "
            f"{p.ci95[0]:.4g}..{p.ci95[1]:.4g}) from {where}; used with "
            "runtime.compute.model: kernels")
    return res
