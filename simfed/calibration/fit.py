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

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import optimize, stats

from ..collectives import collective_impl
from ..hardware import Hardware
from ..network.geometry import ring_load
from ..network.links import NIC, NVLINK, SWITCH
from ..spec.scenario import Scenario
from ..spec.stats import expected_max_normal
from ..spec.units import dtype_nbytes
from .samples import ABS_OF_SD, Samples

_Z95 = 1.96


@dataclass
class Param:
    name: str
    value: float
    ci95: tuple[float, float]
    unit: str

    def __post_init__(self) -> None:  # plain floats (YAML/JSON), never numpy scalars
        self.value = float(self.value)
        self.ci95 = (float(self.ci95[0]), float(self.ci95[1]))

    def as_dict(self) -> dict[str, Any]:
        return {"value": self.value, "ci95": list(self.ci95), "unit": self.unit}


# A parameter is used for prediction only if the samples identify it: its 95% interval's
# half-width is at most this share of its value (a wider interval, an undefined one, or one the
# samples leave unconstrained: it stays at its physical or configured value, and the report's
# `not_used` says so). One rule for every fit, chosen before the held-out check set was run.
MAX_REL_HALF_WIDTH = 0.5
# the least relative scatter a timing is taken to have when computing intervals (a fit that
# happens to go through its points exactly still cannot tell apart what the samples confound)
MIN_REL_SCATTER = 0.01


@dataclass
class FitResult:
    kind: str
    params: list[Param] = field(default_factory=list)
    residuals: list[dict[str, Any]] = field(default_factory=list)  # label, measured, predicted
    note: str = ""
    # parameters the samples do not identify: name -> {value, ci95, unit, reason, kept}, left
    # out of `params` (so out of the profile: the scenario's own value stands)
    not_used: dict[str, dict[str, Any]] = field(default_factory=dict)
    # covariance of the used parameters (in their units, ordered as `cov_names`); parameters
    # without one are drawn independently from their 95% intervals (`draw`)
    cov: np.ndarray | None = None
    cov_names: list[str] = field(default_factory=list)

    def drop_unidentified(self, kept: dict[str, str] | None = None,
                          force: tuple[str, ...] = ()) -> None:
        """Move every parameter whose interval is wide or undefined to `not_used` (but those
        whose name starts with one of `force`: used whatever their interval)."""
        for p in list(self.params):
            why = "" if p.name.startswith(force) and force else unidentified(p)
            if why:
                self.leave_out(p, why, (kept or {}).get(p.name, "the scenario's value"))

    def leave_out(self, p: Param, reason: str, kept: str) -> None:
        self.params = [q for q in self.params if q.name != p.name]
        self.not_used[p.name] = {**p.as_dict(), "reason": reason, "kept": kept}
        if p.name in self.cov_names and self.cov is not None:
            i = self.cov_names.index(p.name)
            self.cov = np.delete(np.delete(self.cov, i, 0), i, 1)
            self.cov_names.pop(i)

    def draw(self, rng: np.random.Generator) -> FitResult:
        """A copy with its used parameters drawn from the fit's uncertainty: jointly from
        `cov` where the fit has one, else each from a normal whose 95% interval is its own;
        a draw never crosses zero (rates, times and factors are positive: folded at 1% of the
        value)."""
        vals = {p.name: p.value for p in self.params}
        if self.cov is not None and self.cov_names:
            mean = np.array([vals[n] for n in self.cov_names])
            got = rng.multivariate_normal(mean, self.cov, method="eigh")
            vals.update(zip(self.cov_names, (float(v) for v in got), strict=True))
        for p in self.params:
            if p.name in self.cov_names:
                continue
            sd = (p.ci95[1] - p.ci95[0]) / (2 * _Z95)
            if math.isfinite(sd) and sd > 0:
                vals[p.name] = p.value + sd * float(rng.standard_normal())
        out = dataclasses.replace(self, params=[
            Param(p.name, max(vals[p.name], 0.01 * p.value) if p.value > 0 else vals[p.name],
                  p.ci95, p.unit) for p in self.params])
        return out

    @property
    def rms_rel_error(self) -> float:
        if not self.residuals:
            return float("nan")
        errs = [r["rel_error"] for r in self.residuals]
        return math.sqrt(sum(e * e for e in errs) / len(errs))

    def as_dict(self) -> dict[str, Any]:
        return {
            "params": {p.name: p.as_dict() for p in self.params},
            "not_used": self.not_used,
            "n": len(self.residuals),
            "rms_rel_error": self.rms_rel_error,
            "max_abs_rel_error": max((abs(r["rel_error"]) for r in self.residuals), default=None),
            "residuals": self.residuals,
            "note": self.note,
        }


def _ci(value: float, se: float) -> tuple[float, float]:
    if not math.isfinite(se):
        return (float("nan"), float("nan"))
    return (value - _Z95 * se, value + _Z95 * se)


def unidentified(p: Param) -> str:
    """Why the samples do not identify `p` ("" if they do)."""
    lo, hi = p.ci95
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "no 95% interval (the samples do not constrain it, or too few cases)"
    half = (hi - lo) / 2
    if p.value == 0 and half == 0:
        return ""
    if p.value == 0 and hi < 0:
        return f"the samples put it below 0 (95% interval {lo:.4g}..{hi:.4g}): none"
    if half > MAX_REL_HALF_WIDTH * abs(p.value):
        return (f"95% interval {lo:.4g}..{hi:.4g} {p.unit} is wider than "
                f"+-{MAX_REL_HALF_WIDTH:.0%} of {p.value:.4g}")
    return ""


def _covariance(jac: np.ndarray, s2: float) -> np.ndarray:
    """(J^T J)^-1 s2, with an infinite variance for every parameter with weight in a direction
    the samples do not constrain (J^T J singular there: pinv would hide it as 0)."""
    jtj = jac.T @ jac
    w, v = np.linalg.eigh(jtj)
    tol = max(float(np.max(w)), 0.0) * 1e-10
    null = w <= tol
    inv_w = np.where(null, 0.0, 1.0 / np.where(null, 1.0, w))
    cov = (v * inv_w) @ v.T * s2
    loose = np.any((v[:, null] ** 2) > 1e-6, axis=1) if np.any(null) else \
        np.zeros(len(w), dtype=bool)
    cov[loose, :] = np.inf
    cov[:, loose] = np.inf
    return cov


# ---- collectives -------------------------------------------------------------------------------

@dataclass
class _CommFeature:
    steps: int  # ring steps over all phases
    inter: bool  # hops cross nodes
    phases: int  # collective launches (1 for ring)
    nv_bytes: float  # bytes over the busiest NVLink class link (at efficiency 1)
    nic_bytes: float  # bytes over the busiest NIC class link (at efficiency 1)
    sw_bytes: float  # bytes through the busiest leaf switch (all its nodes' egress)
    measured: float
    label: str
    op: str  # the collective asked for, whose bandwidth factor applies
    ring_bytes: float = 0.0  # E: bytes each rank moves (the host per-byte term's measure)
    link_Gbps: float = 0.0  # the inter-node link rate it ran at (nic_bytes are scaled to it)
    ranks_per_core: float = 1.0  # host work per byte is shared out over the cores

    pair: bool = False  # a ring of two ranks

    @property
    def domain(self) -> str:
        """Where its bandwidth factor applies: inside one node or across nodes, in rings of two
        ranks or longer."""
        return ("inter" if self.inter else "intra") + ("_pair" if self.pair else "")


def _comm_features(scn: Scenario, samples: Samples, impl_name: str) -> list[_CommFeature]:
    base = Hardware.from_spec(scn.cluster, scn.runtime)
    impl = collective_impl(impl_name)
    feats = []
    for s in samples.comm:
        # the geometry the sample was measured on (ranks per node, nodes), the scenario's links
        nodes = -(-s.world // s.gpus_per_node)
        hw = dataclasses.replace(base, gpus_per_node=s.gpus_per_node, nodes=nodes)
        # link classes: one per (kind, position in the node); all nodes alike
        index: dict[tuple[str, int], int] = {}

        def link_index(kind: str, node: int, sub: int, index=index) -> int:
            return index.setdefault((kind, sub if node >= 0 else -1), len(index))

        steps = 0
        nv = nic = sw = ring = 0.0
        inter = False
        phases = impl(s.run_op, s.instances, s.gpus_per_node)
        # NIC bytes in units of the scenario's link rate (a sample at half the rate counts double)
        rate_scale = (scn.cluster.node.nics.bw_Gbps / s.link_Gbps) if s.link_Gbps > 0 else 1.0
        for ph in phases:
            load = ring_load(hw, ph.instances, link_index, switch=True)
            steps += ph.steps
            e_bytes = ph.e_factor * s.nbytes
            ring += e_bytes
            kinds = {v: k[0] for k, v in index.items()}
            for c, d in load.demand_per_E.items():
                if kinds[c] == NVLINK:
                    nv = max(nv, d * e_bytes)
                elif kinds[c] == NIC:
                    nic = max(nic, d * e_bytes * rate_scale)
                    inter = True
                elif kinds[c] == SWITCH:
                    sw = max(sw, d * e_bytes)
        feats.append(_CommFeature(steps, inter, len(phases), nv, nic, sw, s.time_s, s.label,
                                  s.op, ring, s.link_Gbps, s.ranks_per_core,
                                  pair=bool(phases) and all(ph.pair for ph in phases)))
    return feats


def fit_comm(scn: Scenario, samples: Samples, force: tuple[str, ...] = ()) -> FitResult:
    """Fit launch_us, nvlink/nic per-step latency and bandwidths to collective samples."""
    impl = scn.runtime.comm.collective
    feats = _comm_features(scn, samples, impl)
    res = FitResult(kind="collectives")
    if not feats:
        res.note = "no collective samples: comm constants left as in the scenario"
        return res
    # rings of two ranks get factors of their own only where longer rings of the same op and
    # domain were measured too (a gloo pair exchanges both ways with one peer; a longer ring
    # sends to one neighbour and receives from the other); else one factor serves both
    both = ({(f.op, f.inter) for f in feats if f.pair}
            & {(f.op, f.inter) for f in feats if not f.pair})
    for f in feats:
        f.pair = f.pair and (f.op, f.inter) in both
    has_intra = any(f.nv_bytes > 0 for f in feats)
    has_inter = any(f.inter for f in feats)
    n = scn.cluster.node
    # per-implementation bandwidth factors, relative to all-reduce (or the most common op),
    # inside a node and across nodes apart (gloo's loopback copies are not its TCP streams)
    ops = sorted({f.op for f in feats})
    ref = "all_reduce" if "all_reduce" in ops else ops[0]
    others = sorted({(f.op, f.domain) for f in feats if f.op != ref})
    # a host time per byte that does not scale with the link rate (CPU copies, reductions, the
    # kernel's network stack on the node's cores) is told apart from the wire time only by
    # samples at two or more link rates: then every op gets one across nodes
    rates = {f.link_Gbps for f in feats if f.inter}
    host_ops = sorted({f.op for f in feats if f.inter}) if len(rates) > 1 else []
    # a leaf switch's aggregate capacity is identifiable only if some samples load it harder
    # (more nodes sending at once) than others
    # (more nodes sending at once) than others, and only of a switch the scenario has: a
    # switched fabric, or a capacity it configures. An ideal fabric is non-blocking by the
    # scenario's word; a capacity fitted there only stands in for whatever else slows many
    # nodes sending at once (the host's cores), and caps every faster link it is used for
    fab = scn.cluster.fabric
    sw_ratio = {round(f.sw_bytes / f.nic_bytes, 6) for f in feats if f.nic_bytes > 0}
    has_switch = has_inter and len(sw_ratio) > 1 and (fab.topology != "ideal"
                                                      or fab.switch_capacity_Gbps > 0)
    # unknowns: launch_s, hop_intra_s, hop_inter_s, s_per_byte_nvlink, s_per_byte_nic,
    # s_per_byte_switch, and 1 / bandwidth factor of every other op
    x0 = np.array([1e-5, 1e-5, 1e-5, 1 / (n.nvlink.bw_GBps * 1e9), 8 / (n.nics.bw_Gbps * 1e9),
                   # start the switch where it binds (twice a node's rate), or max() hides it
                   0.5 * 8 / (n.nics.bw_Gbps * 1e9)] + [1.0] * len(others)
                  + [2e-9] * len(host_ops))
    free = [True, has_intra, has_inter, has_intra, has_inter, has_switch] \
        + [True] * len(others) + [True] * len(host_ops)
    if not has_switch:
        x0[5] = 0.0
    slow_ix = {o: 6 + i for i, o in enumerate(others)}
    host_ix = {o: 6 + len(others) + i for i, o in enumerate(host_ops)}

    def model(x: np.ndarray, f: _CommFeature) -> float:
        """Launches and hops, host work, bytes on the links: gloo does its host work between
        transfers, so it adds to the wire time (as in the simulator); only samples at two link
        rates tell the two apart."""
        hop = x[2] if f.inter else x[1]
        key = (f.op, f.domain)
        slow = x[slow_ix[key]] if key in slow_ix else 1.0
        host = (x[host_ix[f.op]] * f.ring_bytes * f.ranks_per_core
                if f.inter and f.op in host_ix else 0.0)
        wire = slow * max(f.nv_bytes * x[3], f.nic_bytes * x[4], f.sw_bytes * x[5])
        return f.phases * x[0] + f.steps * hop + host + wire

    # what each unknown is as a reported parameter: name, value(x), d value / dx, unit
    conv: dict[int, tuple[str, Callable[[float], float], Callable[[float], float], str]] = {
        0: ("launch_us", lambda v: v * 1e6, lambda v: 1e6, "us"),
        1: ("nvlink_step_latency_us", lambda v: v * 1e6, lambda v: 1e6, "us"),
        2: ("nic_step_latency_us", lambda v: v * 1e6, lambda v: 1e6, "us"),
        3: ("nvlink_bw_GBps", lambda v: 1e-9 / v, lambda v: -1e-9 / v**2, "GBps"),
        4: ("nic_bw_Gbps", lambda v: 8e-9 / v, lambda v: -8e-9 / v**2, "Gbps"),
        5: ("switch_capacity_Gbps", lambda v: 8e-9 / v, lambda v: -8e-9 / v**2, "Gbps"),
    }
    for (op, dom), i in slow_ix.items():  # factor = 1 / slowdown
        conv[i] = (f"bw_factor_{op}_{dom}", lambda v: 1.0 / v, lambda v: -1.0 / v**2, "")
    for op, i in host_ix.items():  # s per byte -> us per MB
        conv[i] = (f"host_us_per_MB_{op}_inter", lambda v: v * 1e12, lambda v: 1e12, "us/MB")
    rt = scn.runtime.comm
    sw_lat = scn.cluster.fabric.switch_latency_us if scn.cluster.fabric.topology != "ideal" \
        else 0.0

    def configured(i: int, launch_free: bool) -> tuple[float, str]:
        """The scenario's own value of unknown i (what stands when the samples do not
        identify it): physical rates stay physical, the rest as configured."""
        soft = 0.0 if launch_free else rt.step_latency_us  # calibration zeroes it with launch
        if i == 0:
            return rt.launch_us * 1e-6, f"runtime.comm.launch_us {rt.launch_us:g} us"
        if i == 1:
            v = n.nvlink.latency_us + soft
            return v * 1e-6, f"cluster.node.nvlink.latency_us {v:g} us (with step latency)"
        if i == 2:
            v = n.nics.latency_us + sw_lat + soft
            return v * 1e-6, f"cluster.node.nics.latency_us {v:g} us (with switch, step)"
        if i == 3:
            bw = n.nvlink.bw_GBps * rt.nvlink_efficiency
            return 1e-9 / bw, f"nvlink {bw:g} GB/s (bw_GBps x nvlink_efficiency)"
        if i == 4:
            bw = n.nics.bw_Gbps * rt.nic_efficiency
            return 8e-9 / bw, f"nics {bw:g} Gb/s (bw_Gbps x nic_efficiency)"
        if i == 5:
            cap = scn.cluster.fabric.switch_capacity_Gbps
            return (8e-9 / cap if cap > 0 else 0.0), \
                f"cluster.fabric.switch_capacity_Gbps {cap:g}" + (" (non-blocking)" if not cap
                                                                 else "")
        for (op, dom), k in slow_ix.items():
            if k == i:
                fac = rt.bw_factor(op, dom.startswith("intra"), dom.endswith("_pair"))
                return 1.0 / fac, f"bandwidth factor {fac:g}"
        for op, k in host_ix.items():
            if k == i:
                shared = getattr(scn.runtime, "shared_cores", None)
                v = shared.host_s_per_byte(op, False) if shared is not None else 0.0
                return v, f"host work {v * 1e12:g} us/MB"
        raise AssertionError(i)

    def solve(idx: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Least squares over the unknowns idx (the others at x0): x, the cov of x[idx]."""
        def resid(z: np.ndarray) -> np.ndarray:
            x = x0.copy()
            x[idx] = z
            return np.array([(model(x, f) - f.measured) / f.measured for f in feats])

        scale = np.where(x0[idx] > 0, x0[idx], 1e-9)
        # robust (soft L1 beyond 10%): a case that hit a TCP loss-and-backoff on the
        # tc-limited links, or a scheduler hiccup on a shared core, must not drag the fit
        sol = optimize.least_squares(lambda z: resid(z * scale), np.ones(len(idx)),
                                     bounds=(0, np.inf), x_scale="jac", loss="soft_l1",
                                     f_scale=0.1)
        x = x0.copy()
        x[idx] = sol.x * scale
        dof = max(1, len(feats) - len(idx))
        s2 = max(float(np.sum(sol.fun**2)) / dof, MIN_REL_SCATTER**2)
        cov = _covariance(sol.jac, s2) * np.outer(scale, scale)
        return x, cov, sol.fun

    fixed: dict[int, str] = {}  # unknown -> why it is left at the scenario's value
    for i, why in ((1, "no sample inside a node"), (3, "no sample inside a node"),
                   (2, "no sample across nodes"), (4, "no sample across nodes"),
                   (5, "no two samples load the leaf switch differently" if fab.topology
                    != "ideal" or fab.switch_capacity_Gbps > 0 else "the scenario's fabric "
                    "is ideal (non-blocking) and configures no switch capacity")):
        if not free[i]:
            res.not_used[conv[i][0]] = {"value": None, "ci95": None, "unit": conv[i][3],
                                        "reason": why, "kept": configured(i, True)[1]}
    while True:
        idx = [i for i, fr in enumerate(free) if fr and i not in fixed]
        x, cov, _ = solve(idx)
        se = np.sqrt(np.clip(np.diag(cov), 0, None))
        cands: list[tuple[float, int, Param, str]] = []
        params: dict[int, Param] = {}
        for k, i in enumerate(idx):
            name, val, dval, unit = conv[i]
            if x[i] <= 0 and i >= 3:  # a bandwidth or factor term at its bound
                why = "at its bound 0: none of the samples needs it"
                p = Param(name, 0.0, (float("nan"), float("nan")), unit)
                cands.append((math.inf, i, p, why))
                continue
            v = val(x[i])
            p = Param(name, v, _ci(v, abs(dval(x[i])) * se[k]), unit)
            params[i] = p
            why = "" if force and name.startswith(force) else unidentified(p)
            if i == 5 and not why:
                binds = sum(f.sw_bytes * x[5] > max(f.nv_bytes * x[3], f.nic_bytes * x[4])
                            for f in feats)
                if not binds:
                    why = "no sample loads the switch beyond its links' own rates"
            if why:
                half = (p.ci95[1] - p.ci95[0]) / 2 / max(abs(v), 1e-300)
                cands.append((half if math.isfinite(half) else math.inf, i, p, why))
        if not cands:
            break
        _w, i, p, why = max(cands, key=lambda c: c[0])
        x0[i], kept = configured(i, 0 in idx and i != 0)
        fixed[i] = why
        res.not_used[p.name] = {**p.as_dict(), "reason": why, "kept": kept}
    for i in idx:
        res.params.append(params[i])
    # the used parameters' covariance in their own units (delta method: elementwise maps)
    d = np.array([conv[i][2](x[i]) for i in idx])
    res.cov = cov * np.outer(d, d)
    res.cov_names = [conv[i][0] for i in idx]
    for f in feats:
        pred = model(x, f)
        res.residuals.append({"label": f.label, "measured_s": f.measured,
                              "predicted_s": float(pred),
                              "rel_error": float((pred - f.measured) / f.measured)})
    if res.not_used:
        res.note = "not identified by the samples, kept at the scenario's value: " + "; ".join(
            f"{k} ({v['reason']}; kept: {v['kept']})" for k, v in res.not_used.items())
    return res


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
        over = Param(over_name, inter * 1e6, _ci(inter * 1e6, math.sqrt(cov[1, 1]) * 1e6),
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
    res.params.append(Param(rate_name, rate, _ci(rate, math.sqrt(pcov[0, 0])), units[0]))
    names_used = [rate_name]
    if not why:
        res.params.append(Param(over_name, inter * 1e6, _ci(inter * 1e6,
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


def optimizer_bytes_per_param(scn: Scenario) -> int:
    p = scn.model.dtype_nbytes
    s = dtype_nbytes(scn.training.optimizer_state_dtype)
    return 2 * p + p + 4 * s if scn.training.optimizer == "adamw" else 3 * p


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
    res.params.append(Param("fedavg_local_GBps", bw, _ci(bw, 1e-9 * se / s_per_byte**2), "GB/s"))
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
        res.params.append(Param("out_of_step_slowdown", max(k - 1.0, 0.0), _ci(k - 1.0, se), ""))
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
    res.params.append(Param("gloo_hop_us", hop * 1e6, _ci(hop * 1e6, se * 1e6), "us"))
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
