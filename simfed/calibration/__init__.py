"""Calibration: from measurements to a cluster profile a scenario can be run with.

`calibrate(scenario, samples)` fits every group of constants the samples inform (collectives,
per-unit compute, optimizer, debug checks; from torch.profiler traces with shapes, the kernel
model's efficiencies: `profiler`; from nccl-tests outputs, the NCCL model's bandwidth curves:
`nccl_tests`) and returns (profile, report): the profile is a
partial scenario (cluster and runtime keys) recording where each number came from; the report
holds the fitted parameters with 95% intervals and every sample's residual.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any

from ..collectives import OPS
from ..spec.scenario import Scenario
from ..spec.yamlio import dump_yaml
from .extrapolation import sample_ranges
from .fit import FitResult, fit_all, optimizer_bytes_per_param
from .samples import Samples, read_inputs

__all__ = ["Samples", "calibrate", "read_inputs", "write_profile"]


def _val(res: FitResult, name: str) -> float | None:
    for p in res.params:
        if p.name == name:
            return p.value
    return None


def calibrate(scn: Scenario, samples: Samples, fits: list[FitResult] | None = None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
    """`fits`: `fit_all`'s results to build the profile from (e.g. a draw from their
    uncertainty, `FitResult.draw`) instead of fitting the samples again."""
    if fits is None:
        fits = fit_all(scn, samples)
    comm, units, opt, checks, fedavg, step, cstep, drift = fits
    node = scn.cluster.node
    cluster: dict[str, Any] = {"node": {}}
    runtime: dict[str, Any] = {"compute": {}, "comm": {}, "host": {}}
    prov: dict[str, str] = {}
    srcs = ", ".join(sorted(set(samples.sources))) or "none"

    def note(key: str, fit: FitResult, param: str | None = None) -> None:
        prov[key] = f"fitted ({fit.kind}, n={len(fit.residuals)}, rms rel error " \
                    f"{fit.rms_rel_error:.1%}) from {srcs}"
        for p in fit.params:
            if p.name == param and not (p.ci95[0] > 0 and p.ci95[1] < 2 * p.value):
                prov[key] += (f"; POORLY DETERMINED: 95% CI {p.ci95[0]:.4g}..{p.ci95[1]:.4g} "
                              f"{p.unit} (the samples barely depend on it)")

    # ---- collectives
    for key in ("reduce_scatter_impl", "overlap_compute"):
        if key in samples.meta:
            runtime["comm"][key] = samples.meta[key]
            prov[f"runtime.comm.{key}"] = f"backend facts recorded by the benchmark ({srcs})"
    if samples.meta.get("host_cores"):  # a testbed on one host: its ranks share these cores
        cluster["host_cores"] = int(samples.meta["host_cores"])
        prov["cluster.host_cores"] = f"the testbed host, recorded by the benchmark ({srcs})"
    v = _val(comm, "launch_us")
    if v is not None:
        runtime["comm"]["launch_us"] = round(v, 3)
        runtime["comm"]["step_latency_us"] = 0.0
        note("runtime.comm.launch_us", comm, "launch_us")
    v = _val(comm, "nvlink_step_latency_us")
    if v is not None:
        cluster["node"].setdefault("nvlink", {})["latency_us"] = round(v, 3)
        note("cluster.node.nvlink.latency_us", comm, "nvlink_step_latency_us")
    v = _val(comm, "nic_step_latency_us")
    if v is not None:
        sw = scn.cluster.fabric.switch_latency_us if scn.cluster.fabric.topology != "ideal" \
            else 0.0
        cluster["node"].setdefault("nics", {})["latency_us"] = round(max(v - sw, 0.0), 3)
        note("cluster.node.nics.latency_us", comm, "nic_step_latency_us")
    for param, part, key, nominal, eff_key in (
        ("nvlink_bw_GBps", "nvlink", "bw_GBps", node.nvlink.bw_GBps, "nvlink_efficiency"),
        ("nic_bw_Gbps", "nics", "bw_Gbps", node.nics.bw_Gbps, "nic_efficiency"),
    ):
        v = _val(comm, param)
        if v is None:
            continue
        if v <= nominal or part == "nics":  # an efficiency against the datasheet figure
            # a NIC's rate is physical (the testbed's tc rate): it stays, so a rate set later
            # scales the wire time; measured at or above it, the efficiency is 1
            runtime["comm"][eff_key] = round(min(v / nominal, 1.0), 5)
            note(f"runtime.comm.{eff_key}", comm, param)
        else:  # faster than the nominal figure: the nominal figure was a placeholder
            cluster["node"].setdefault(part, {})[key] = round(v, 5)
            runtime["comm"][eff_key] = 1.0
            note(f"cluster.node.{part}.{key}", comm, param)

    v = _val(comm, "switch_capacity_Gbps")
    if v is not None:
        # far above what the nodes can inject: the switch never binds (non-blocking)
        inject = scn.cluster.nodes * node.nics.count * node.nics.bw_Gbps
        cap = round(v, 4) if v < 4 * inject else 0.0
        cluster.setdefault("fabric", {})["switch_capacity_Gbps"] = cap
        note("cluster.fabric.switch_capacity_Gbps", comm, "switch_capacity_Gbps")
    # per-op tables {op: {intra|inter: value}} from params named PREFIX{op}_{domain}
    for prefix, (section, key), digits in (("bw_factor_", ("comm", "op_bw_factor"), 5),
                                           ("host_us_per_MB_", ("shared_cores", "host_us_per_MB"),
                                            3)):
        table: dict[str, dict[str, float]] = {}
        for p in comm.params:
            if p.name.startswith(prefix):
                rest = p.name.removeprefix(prefix)
                op = next(o for o in OPS if rest.startswith(o + "_"))
                dom = rest.removeprefix(op + "_")
                table.setdefault(op, {})[dom] = round(p.value, digits)
        if table:
            runtime.setdefault(section, {})[key] = table
            note(f"runtime.{section}.{key}", comm)

    # ranks sharing host cores (simfed.contention): runtime.shared_cores
    for fit, what in ((step, "comm"), (cstep, "compute")):
        for param, key in (("out_of_step_slowdown", f"{what}_slowdown"),
                           ("out_of_step_cv", f"{what}_cv")):
            v = _val(fit, param)
            if v is not None:
                runtime.setdefault("shared_cores", {})[key] = round(v, 4)
                note(f"runtime.shared_cores.{key}", fit, param)

    v = _val(drift, "group_drift_ms_per_sqrt_s")
    if v is not None:
        runtime.setdefault("shared_cores", {})["group_drift_ms_per_sqrt_s"] = round(v, 3)
        note("runtime.shared_cores.group_drift_ms_per_sqrt_s", drift, "group_drift_ms_per_sqrt_s")
    v = _val(comm, "core_stack_Gbps")  # a host core's network stack (simfed.contention)
    if v is not None:
        runtime.setdefault("shared_cores", {})["core_stack_Gbps"] = round(v, 5)
        note("runtime.shared_cores.core_stack_Gbps", comm, "core_stack_Gbps")

    # ---- compute: rate = peak x efficiency; the peak moves up if measured faster
    rates = {ph: _val(units, f"{ph}_flops_per_s") for ph in ("forward", "backward")}
    if all(r is not None for r in rates.values()):
        peak = node.gpu.peak_tflops * 1e12
        top = max(r for r in rates.values() if r is not None)
        if top > peak:
            peak = top
            cluster["node"].setdefault("gpu", {})["peak_tflops"] = round(peak / 1e12, 9)
            note("cluster.node.gpu.peak_tflops", units)
        for ph, r in rates.items():
            assert r is not None
            runtime["compute"][f"efficiency_{ph}"] = round(r / peak, 6)
            note(f"runtime.compute.efficiency_{ph}", units)
            over = _val(units, f"{ph}_overhead_us")
            if over is not None:  # else not identified: the scenario's value stands
                runtime["compute"][f"unit_overhead_{ph}_us"] = round(over, 3)
                note(f"runtime.compute.unit_overhead_{ph}_us", units)

    # ---- optimizer
    v = _val(opt, "optimizer_GBps")
    if v is not None:
        eff = v / node.gpu.hbm_bw_GBps
        if eff <= 1.0:
            runtime["compute"]["optimizer_hbm_efficiency"] = round(eff, 6)
            note("runtime.compute.optimizer_hbm_efficiency", opt)
        else:
            cluster["node"].setdefault("gpu", {})["hbm_bw_GBps"] = round(v, 6)
            runtime["compute"]["optimizer_hbm_efficiency"] = 1.0
            note("cluster.node.gpu.hbm_bw_GBps", opt)
        over = _val(opt, "optimizer_overhead_us")
        if over is not None:  # else not identified: the scenario's value stands
            runtime["compute"]["optimizer_overhead_us"] = round(over, 3)
            note("runtime.compute.optimizer_overhead_us", opt)

    # ---- FedAvg local work
    v = _val(fedavg, "fedavg_local_GBps")
    if v is not None:
        runtime["compute"]["fedavg_local_GBps"] = round(v, 6)
        note("runtime.compute.fedavg_local_GBps", fedavg)

    # ---- debug checks
    v = _val(checks, "gloo_hop_us")
    if v is not None:
        runtime["host"]["gloo_hop_us"] = round(v, 3)
        runtime["host"]["gloo_rank0_msg_us"] = round(v / 2, 3)
        note("runtime.host.gloo_hop_us", checks, "gloo_hop_us")
        prov["runtime.host.gloo_rank0_msg_us"] = "half a gloo hop (model assumption)"

    runtime["provenance"] = prov
    profile: dict[str, Any] = {}
    cluster["node"] = {k: v for k, v in cluster["node"].items() if v}
    cluster = {k: v for k, v in cluster.items() if v}
    if cluster:
        profile["cluster"] = cluster
    profile["runtime"] = {k: v for k, v in runtime.items() if v}
    report = {
        "scenario": scn.name,
        "created": _dt.date.today().isoformat(),
        "sources": sorted(set(samples.sources)),
        "optimizer_bytes_per_param": optimizer_bytes_per_param(scn),
        "fits": {f.kind: f.as_dict() for f in fits},
        # where the samples were taken: a prediction outside these ranges extrapolates
        "ranges": sample_ranges(scn, samples),
    }
    # torch.profiler traces: the kernel model's efficiencies from their operators' times
    from .profiler import apply_to_profile

    apply_to_profile(scn, samples, profile, report)
    # nccl-tests outputs: the NCCL model's bandwidth-efficiency curves (nccl_tests)
    from .nccl_tests import apply_to_profile as apply_nccl_tests

    apply_nccl_tests(scn, samples.nccl_tests, profile, report)
    return profile, report


def write_profile(path: str | Path, profile: dict[str, Any], header: str = "") -> Path:
    from ..spec.paths import write_text_atomic

    text = "".join(f"# {line}\n" for line in header.splitlines())
    text += dump_yaml(profile, sort_keys=True, width=100)
    return write_text_atomic(path, text)
