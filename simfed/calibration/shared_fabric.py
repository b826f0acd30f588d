"""A fabric shared with other jobs (`cluster.fabric.shared_bandwidth`) against its measurements
(validation/published/shared-fabric.yaml: NCCL all-reduce on Leonardo's default and quiet
InfiniBand service levels, De Sensi et al. SC24): the collective model's bus bandwidth with the
mechanism on (the cluster's measured shares) and off (a quiet fabric), row by row.

    python -m simfed.calibration.shared_fabric
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from .published_collectives import entry_model, entry_rows, load

DEFAULT_FILE = Path(__file__).resolve().parents[2] / "validation" / "published" / \
    "shared-fabric.yaml"
QUIET = {"cluster.fabric.shared_bandwidth": []}


def compare(path: Path = DEFAULT_FILE) -> list[dict[str, Any]]:
    """Per row: published busbw, predicted with the entry's own settings ("as"), and with the
    fabric quiet ("quiet"), and their errors."""
    from ..collectives.nccl import bus_factor

    out = []
    for e in load(path)["cases"] + load(path)["tables"]:
        preds = {}
        for how, extra in (("as", {}), ("quiet", QUIET)):
            model, n = entry_model({**e, "set_keys": {**(e.get("set_keys") or {}), **extra}},
                                   path.parent)
            preds[how] = [(size, pub, size / model.best(e["op"], size, n, e["nodes"]).time_s
                           * bus_factor(e["op"], n) / 1e9) for size, pub in entry_rows(e)]
        for (size, pub, p_as), (_, _, p_quiet) in zip(preds["as"], preds["quiet"], strict=True):
            out.append({"name": e["name"], "nodes": e["nodes"], "size_bytes": size,
                        "published_GBps": pub, "predicted_GBps": p_as,
                        "quiet_GBps": p_quiet, "error": p_as / pub - 1,
                        "quiet_error": p_quiet / pub - 1,
                        "shared": bool(e.get("set_keys", {}).get(
                            "cluster.fabric.shared_bandwidth", True))})
    return out


def summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Median |error| of the quiet-fabric rows, and of the shared-fabric rows with the mechanism
    on and off."""
    quiet = [abs(r["error"]) for r in rows if not r["shared"]]
    on = [abs(r["error"]) for r in rows if r["shared"]]
    off = [abs(r["quiet_error"]) for r in rows if r["shared"]]
    return {"quiet_rows": statistics.median(quiet), "shared_rows_on": statistics.median(on),
            "shared_rows_off": statistics.median(off)}


def main() -> None:
    rows = compare()
    print("| row | nodes | published busbw GB/s | predicted | error | mechanism off | error |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['name']} | {r['nodes']} | {r['published_GBps']:.1f} | "
              f"{r['predicted_GBps']:.1f} | {r['error']:+.1%} | {r['quiet_GBps']:.1f} | "
              f"{r['quiet_error']:+.1%} |")
    s = summary(rows)
    print(f"quiet service level: median |error| {s['quiet_rows']:.1%}; default (shared) service "
          f"level: {s['shared_rows_on']:.1%} with fabric.shared_bandwidth, "
          f"{s['shared_rows_off']:.1%} without")


if __name__ == "__main__":
    main()
