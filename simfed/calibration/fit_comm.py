"""The collective fit: the simulator's own alpha-beta model with its ring geometry per sample
(see `simfed.calibration.fit`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import optimize

from ..collectives import collective_impl
from ..contention.shared_cores import core_stack_s, nodes_per_core
from ..hardware import Hardware
from ..network.geometry import ring_load
from ..network.links import NIC, NVLINK, SWITCH
from ..spec.cluster import node_cores
from ..spec.scenario import Scenario
from .result import MIN_REL_SCATTER, FitResult, Param, ci95, covariance, unidentified
from .samples import CommSample, Samples

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
    # most nodes with ranks in the collective that one host core carries (CPU testbeds: a
    # core hosting two nodes' ranks runs both nodes' network stacks)
    core_nodes: float = 1.0
    rate_scale: float = 1.0  # the scenario's link rate over the sample's

    @property
    def domain(self) -> str:
        """Where its bandwidth factor applies: inside one node or across nodes, in rings of two
        ranks or longer."""
        return ("inter" if self.inter else "intra") + ("_pair" if self.pair else "")


def core_nodes(s: CommSample, cpu: int, host: int) -> float:
    """Most nodes with ranks in sample `s` that one host core carries, each node's ranks on
    its `cpu` of the `host` cores (`node_cores`; a node over two cores counts half on each;
    1 off a testbed)."""
    if host <= 0:
        return 1.0
    nodes = {r // s.gpus_per_node for inst in s.instances for r in inst}
    return nodes_per_core([node_cores(n, cpu, host) for n in nodes])


def _comm_features(scn: Scenario, samples: Samples, impl_name: str) -> list[_CommFeature]:
    base = Hardware.from_spec(scn.cluster, scn.runtime)
    impl = collective_impl(impl_name)
    feats = []
    # the host cores the benchmarks ran on (recorded by the bench; else the scenario's)
    cpu = scn.cluster.node.cpu_cores
    host = int(samples.meta.get("host_cores") or scn.cluster.host_cores)
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
                                  pair=bool(phases) and all(ph.pair for ph in phases),
                                  core_nodes=core_nodes(s, cpu, host), rate_scale=rate_scale))
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
    # a host core that carries the ranks of several nodes runs all their network stacks
    # (veth, TCP): their flows share its capacity (`SharedCores.core_stack_s`); identifiable
    # only where some samples put more than one node's flows on a core
    stacked = any(f.inter and f.core_nodes > 1 for f in feats)
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
                  + [2e-9] * len(host_ops)
                  # start the core where it binds for two nodes' flows (at the kink of max()
                  # the slope is 0 and the fit would not move it)
                  + [0.75 * 8 / (n.nics.bw_Gbps * 1e9)] * stacked)
    free = [True, has_intra, has_inter, has_intra, has_inter, has_switch] \
        + [True] * len(others) + [True] * len(host_ops) + [True] * stacked
    if not has_switch:
        x0[5] = 0.0
    slow_ix = {o: 6 + i for i, o in enumerate(others)}
    host_ix = {o: 6 + len(others) + i for i, o in enumerate(host_ops)}
    core_ix = 6 + len(others) + len(host_ops) if stacked else -1

    def model(x: np.ndarray, f: _CommFeature) -> float:
        """Launches and hops, host work, bytes on the links: gloo does its host work between
        transfers, so it adds to the wire time (as in the simulator); only samples at two link
        rates tell the two apart."""
        hop = x[2] if f.inter else x[1]
        key = (f.op, f.domain)
        slow = x[slow_ix[key]] if key in slow_ix else 1.0
        host = (x[host_ix[f.op]] * f.ring_bytes * f.ranks_per_core
                if f.inter and f.op in host_ix else 0.0)
        if f.inter and core_ix >= 0:  # as `SharedCores.core_stack_s`
            host += core_stack_s(f.ring_bytes, f.core_nodes, x[core_ix],
                                 x[4] * f.rate_scale)
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
    if core_ix >= 0:  # s per byte -> Gb/s
        conv[core_ix] = ("core_stack_Gbps", lambda v: 8e-9 / v, lambda v: -8e-9 / v**2, "Gbps")
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
        if i == core_ix:
            shared = getattr(scn.runtime, "shared_cores", None)
            cap = shared.core_stack_Gbps if shared is not None else 0.0
            return (8e-9 / cap if cap > 0 else 0.0), \
                f"runtime.shared_cores.core_stack_Gbps {cap:g}" + (" (none)" if not cap else "")
        raise AssertionError(i)

    def solve(idx: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Least squares over the unknowns idx (the others at x0): x, the cov of x[idx]."""
        def resid(z: np.ndarray) -> np.ndarray:
            x = x0.copy()
            x[idx] = z
            return np.array([(model(x, f) - f.measured) / f.measured for f in feats])

        if not idx:  # every unknown set aside: the scenario's values stand
            return x0.copy(), np.zeros((0, 0)), resid(np.zeros(0))
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
        cov = covariance(sol.jac, s2) * np.outer(scale, scale)
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
            p = Param(name, v, ci95(v, abs(dval(x[i])) * se[k]), unit)
            params[i] = p
            why = "" if force and name.startswith(force) else unidentified(p)
            if i == 5 and not why:
                binds = sum(f.sw_bytes * x[5] > max(f.nv_bytes * x[3], f.nic_bytes * x[4])
                            for f in feats)
                if not binds:
                    why = "no sample loads the switch beyond its links' own rates"
            if i == core_ix and not why and not any(
                    core_stack_s(f.ring_bytes, f.core_nodes, x[i], x[4] * f.rate_scale) > 0
                    for f in feats if f.inter):
                why = "no sample's core carries its nodes' flows slower than their links"
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
