"""An nccl-tests-style table from the NCCL model: size, time, algbw, busbw and NCCL's choice, for
one collective over a cluster's GPUs, so users can hold it against their own nccl-tests output."""

from __future__ import annotations

from typing import Any

from ..hardware import Hardware
from ..spec.scenario import Scenario
from .nccl import bus_factor, nccl_model


def sizes(min_bytes: int, max_bytes: int, factor: int = 2) -> list[int]:
    out, s = [], max(1, min_bytes)
    while s <= max_bytes:
        out.append(s)
        s *= factor
    return out


def collective_table(scn: Scenario, op: str, ranks: int, nodes: int,
                     byte_sizes: list[int]) -> list[dict[str, Any]]:
    hw = Hardware.from_spec(scn.cluster, scn.runtime)
    model = nccl_model(hw, scn.runtime.comm)
    rows = []
    for s in byte_sizes:
        ch = model.best(op, s, ranks, nodes)
        algbw = s / ch.time_s if ch.time_s > 0 else 0.0
        rows.append({"size_bytes": s, "time_us": ch.time_s * 1e6, "algbw_GBps": algbw / 1e9,
                     "busbw_GBps": algbw * bus_factor(op, ranks) / 1e9,
                     "algorithm": ch.algorithm, "protocol": ch.protocol})
    return rows
