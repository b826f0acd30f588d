"""How sure a GPU-cluster prediction is: what the published validation covers, and where a
scenario leaves it.

`simfed validate --published` measures the kernel model on published FSDP runs
(validation/published/cases.yaml, with the claims tests/test_published.py holds it to). A
scenario run with the same model (`runtime.compute.model: kernels`) and no calibrated profile
is then as good as those runs say where it resembles them; `simfed run` prints the claim and
each quantity outside the runs' range (GPUs, nodes, parameters, sequence length, the GPU type)
and each setting none of them had (float8, torch.compile, FSDP2, the checkpointing policy,
debug checks, the fabric; some are checked as speedups instead), so a prediction at 4,096 GPUs
or with float8 says that it extrapolates.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import yaml

from ..spec.scenario import Scenario
from ..spec.schema import SpecError
from .published import DEFAULT_DIR, load_cases, load_claims

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
            "training.fsdp_version": str(tr.fsdp_version),
            "training.activation_checkpointing": tr.ac_policy,
            "runtime.host.debug_checks": str(scn.runtime.host.debug_checks),
            "cluster.fabric.topology": scn.cluster.fabric.topology}


# settings that validation/published/speedups.yaml checks as ratios to a baseline
SPEEDUP_CHECKED = {"training.float8", "training.compile", "training.fsdp_version",
                   "training.activation_checkpointing"}


def _gpu_family(name: str) -> str:
    up = name.upper()
    return next((f for f in ("A100", "H100", "H200", "B200", "MI300") if f in up), up)


@functools.lru_cache(maxsize=2)
def published_envelope(folder: Path = DEFAULT_DIR) -> dict[str, Any] | None:
    """Ranges of the published cases' quantities, their GPU families and the claims; None when
    the folder is not there (an installed package without the repository)."""
    from ..spec import load_scenario

    if not (folder / "cases.yaml").is_file():
        return None
    ranges: dict[str, list[float]] = {}
    families: set[str] = set()
    seen: dict[str, set[str]] = {}
    cases = load_cases(folder)
    for c in cases:
        scn = load_scenario(folder / c["scenario"])
        families.add(_gpu_family(scn.cluster.node.gpu.name))
        for k, v in _settings(scn).items():
            seen.setdefault(k, set()).add(v)
        for k, v in _quantities(scn).items():
            lo, hi = ranges.get(k, [v, v])
            ranges[k] = [min(lo, v), max(hi, v)]
    return {"ranges": ranges, "gpus_families": sorted(families), "cases": len(cases),
            "settings": {k: sorted(v) for k, v in seen.items()},
            "claims": load_claims(folder)}


def outside(scn: Scenario, env: dict[str, Any]) -> list[str]:
    """What of the scenario the published FSDP runs do not cover, one phrase each."""
    out = []
    q = _quantities(scn)
    for key, (lo, hi) in env["ranges"].items():
        v = q[key]
        if v <= 0 or lo <= 0 or lo * 0.99 <= v <= hi * 1.01:
            continue
        bound = hi if v > hi else lo
        out.append(f"{QUANTITIES[key]} {v:,.4g} (runs: {lo:,.4g}..{hi:,.4g}, "
                   f"{abs(math.log2(v / bound)):.1f} doublings out)")
    fam = _gpu_family(scn.cluster.node.gpu.name)
    if fam not in env["gpus_families"]:
        out.append(f"GPU {scn.cluster.node.gpu.name} (runs: {', '.join(env['gpus_families'])})")
    for key, value in _settings(scn).items():
        runs = env["settings"].get(key, [])
        if value in runs:
            continue
        note = ("; checked as a speedup: validation/published/speedups.yaml"
                if key in SPEEDUP_CHECKED else "")
        out.append(f"{key} {value} (runs: {', '.join(runs)}{note})")
    return out


def for_run(scn: Scenario, folder: Path = DEFAULT_DIR) -> list[str]:
    """`simfed run` without a calibrated profile, kernel model: the published claim and what
    of the scenario lies outside the published runs; nothing for other compute models."""
    if scn.runtime.compute.model != "kernels":
        return []
    try:
        env = published_envelope(folder)
    except (SpecError, OSError, yaml.YAMLError):  # a broken validation folder: say nothing
        return []
    if env is None:
        return []
    c = env["claims"]
    head = (f"how sure: on {env['cases']} published FSDP runs the kernel model's tokens/s/GPU "
            f"error is at most {100 * c.get('median_abs_error', float('nan')):.1f}% median, "
            f"{100 * c.get('worst_abs_error', float('nan')):.0f}% worst (simfed validate "
            "--published, docs/accuracy.md)")
    rest = outside(scn, env)
    if not rest:
        return [head + "; this scenario lies within their range"]
    return [head + "; outside their range here:"] + [f"  {r}" for r in rest]
