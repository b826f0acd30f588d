"""The "how sure" claims by band (cases.yaml `claims.by_comm_share`, `claims.by_gpus`): the
check runs at or above each edge of a quantity, their median |error| and 9-in-10 bound, and the
communication share that places a run or a scenario's algorithm in its band."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..spec.schema import SpecError


def round_up(x: float, step: float = 0.001) -> float:
    return round(math.ceil(x / step - 1e-9) * step, 6)


# the lower edges of the bands the claims are also given for: communication share in steps of
# 0.2, the GPUs a run synchronises in powers of 4 from 64; and the fewest check runs a band needs
# for a bound of its own
BANDS_FROM = {"by_comm_share": (0.2, 0.4, 0.6, 0.8), "by_gpus": (64, 256, 1024)}
BAND_MIN_CASES = 5


def comm_share(scn: Any, alg: dict[str, Any]) -> float:
    """How near one algorithm's step comes to waiting on its collectives: the bytes a GPU moves
    per step over NVLink and over the NICs (`bytes_by_link_per_gpu`), each at the link's nominal
    rate (the GPU's NVLink bw_GBps; its node's NIC line rate shared by its GPUs), the larger of
    the two over the step's GPU compute time (`compute_s`); 0 without compute. Near 1 and above,
    the step is as long as its collectives unless every byte overlaps compute."""
    node = scn.cluster.node
    per_gpu = alg.get("bytes_by_link_per_gpu") or {}
    compute = float(alg.get("compute_s") or 0.0)
    if compute <= 0:
        return 0.0
    nic_Bps = node.nics.bw_Gbps / 8 * 1e9 * node.nics.count / node.gpus
    nvl_Bps = node.nvlink.bw_GBps * 1e9
    times = [float(per_gpu.get("inter_node", 0.0)) / nic_Bps if nic_Bps > 0 else 0.0,
             float(per_gpu.get("nvlink", 0.0)) / nvl_Bps if nvl_Bps > 0 else 0.0]
    return max(times) / compute


def band_of(value: float, bands: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The claims band (`by_comm_share`, `by_gpus`) a value falls in: the highest lower edge at
    or below it, or None under the lowest."""
    within = [b for b in bands if value >= b["from"]]
    return max(within, key=lambda b: b["from"]) if within else None


def scale_bound(gpus: float, claims: dict[str, Any]) -> float:
    """The 9-in-10 bound a scenario on `gpus` GPUs gets inside the validated runs: the check
    set's (claims `p90_abs_error`), or its GPU-count band's (`by_gpus`) where that is wider."""
    overall = float(claims.get("p90_abs_error", float("nan")))
    band = band_of(gpus, claims.get("by_gpus") or [])
    return overall if band is None else max(overall, float(band["p90_abs_error"]))


def collective_bound(scn: Any, algs: list[dict[str, Any]], claims: dict[str, Any]
                     ) -> list[tuple[dict[str, Any], float, dict[str, Any]]]:
    """The algorithms (result dicts) whose communication share falls in a band of claims
    `by_comm_share` wider than `scale_bound` at the scenario's GPU count: (algorithm, share,
    band) each."""
    floor = scale_bound(float(scn.cluster.world), claims)
    out = []
    for a in algs:
        share = comm_share(scn, a)
        band = band_of(share, claims.get("by_comm_share") or [])
        if band is not None and band["p90_abs_error"] > floor:
            out.append((a, share, band))
    return out


def fit_unsettled(alg: dict[str, Any], worst: float) -> bool:
    """Whether an algorithm's (result dict's) predicted peak memory lies within `worst` (the
    check runs' worst |peak-memory error|, claims memory_worst_abs_error) of its GPU's capacity,
    on either side: whether it fits is not settled."""
    peak, cap = alg.get("peak_memory_bytes"), alg.get("memory_capacity_bytes")
    return bool(peak and cap) and abs(peak / cap - 1.0) <= worst


def check_bands(rows: list[dict[str, Any]], key: str, edges: tuple[float, ...]
                ) -> list[dict[str, Any]]:
    """The check runs whose `key` (`comm_share`, `gpus`) is at or above each edge: their count,
    median |error| and the bound 9 in 10 of them lie within, rounded up to 0.1%; a band with
    fewer than BAND_MIN_CASES runs is left out."""
    check = [r for r in rows if r["set"] == "check" and r.get(key) is not None]
    out = []
    for edge in edges:
        errs = sorted(abs(r["error"]) for r in check if r[key] >= edge)
        if len(errs) < BAND_MIN_CASES:
            continue
        out.append({"from": edge, "cases": len(errs),
                    "median_abs_error": round_up(statistics.median(errs)),
                    "p90_abs_error": round_up(errs[math.ceil(0.9 * len(errs)) - 1])})
    return out


class Band(BaseModel):
    """One band of `claims.by_comm_share` / `claims.by_gpus`."""
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    from_: Annotated[float, Field(alias="from", ge=0, allow_inf_nan=False)]
    cases: Annotated[int, Field(ge=1)]
    median_abs_error: Annotated[float, Field(ge=0, lt=100)]
    p90_abs_error: Annotated[float, Field(ge=0, lt=100)]


def validate_bands(path: Path, name: str, bands: Any) -> list[dict[str, Any]]:
    """cases.yaml `claims.<name>` checked against `Band`, one band after another; a bad one is a
    one-line SpecError naming the band and the field with what was found."""
    where = f"{path}: claims.{name}"
    if not isinstance(bands, list):
        raise SpecError(f"{where}: expected a list, got {bands!r}")
    for i, b in enumerate(bands):
        try:
            Band.model_validate(b)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = "".join(f".{p}" for p in err["loc"] if isinstance(p, str))
            what = ("missing" if err["type"] == "missing"
                    else f"{err['msg'][0].lower()}{err['msg'][1:]}, got {err['input']!r}")
            raise SpecError(f"{where}[{i}]{field}: {what}") from None
    return bands
