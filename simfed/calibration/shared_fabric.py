"""A fabric shared with other jobs (`cluster.fabric.shared_bandwidth`) against its measurements
(validation/published/shared-fabric.yaml: NCCL all-reduce on Leonardo's default and quiet
InfiniBand service levels, De Sensi et al. SC24): the collective model's bus bandwidth with the
mechanism on (the cluster's measured shares) and off (a quiet fabric), row by row.

    python -m simfed.calibration.shared_fabric

The same machine's NCCL all-reduce by message size (validation/published/leonardo-allreduce.yaml,
2-128 MiB, one node to 256) tests the latency its trees pay a level beyond a leaf switch
(`cluster.fabric.tree_level_us`): `sizes()` gives every row with it on and off, and

    python -m simfed.calibration.shared_fabric levels

prints the fit rows' median |busbw error| over a 6.25 us grid, the rule that chose its value.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from . import published_collectives as pc

DEFAULT_FILE = Path(__file__).resolve().parents[2] / "validation" / "published" / \
    "shared-fabric.yaml"
SIZES_FILE = DEFAULT_FILE.with_name("leonardo-allreduce.yaml")
KEY = "cluster.fabric.shared_bandwidth"
LEVEL_KEY = "cluster.fabric.tree_level_us"


def compare(path: Path = DEFAULT_FILE) -> list[dict[str, Any]]:
    """published_collectives.compare's rows (every size; the entry's own settings) with the
    same prediction on a quiet fabric beside them ("quiet_GBps", "quiet_error") and whether the
    entry ran on the shared fabric ("shared": its own settings do not turn the share off)."""
    data = pc.load(path)
    quiet = {e["name"] for kind in ("tables", "cases") for e in data.get(kind) or []
             if (e.get("set_keys") or {}).get(KEY) == []}
    rows = pc.compare(path, min_bytes=0)
    off = pc.compare(path, min_bytes=0, set_keys={KEY: []})
    return [{**r, "name": r["table"], "quiet_GBps": q["predicted_GBps"],
             "quiet_error": q["error"], "shared": r["table"] not in quiet}
            for r, q in zip(rows, off, strict=True)]


def summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Median |error| of the quiet-fabric rows, and of the shared-fabric rows with the mechanism
    on and off."""
    quiet = [abs(r["error"]) for r in rows if not r["shared"]]
    on = [abs(r["error"]) for r in rows if r["shared"]]
    off = [abs(r["quiet_error"]) for r in rows if r["shared"]]
    return {"quiet_rows": statistics.median(quiet), "shared_rows_on": statistics.median(on),
            "shared_rows_off": statistics.median(off)}


def summary_line(rows: list[dict[str, Any]]) -> str:
    s = summary(rows)
    return (f"median |busbw error| {s['shared_rows_on']:.1%} on the shared service level with "
            f"fabric.shared_bandwidth, {s['shared_rows_off']:.1%} without; "
            f"{s['quiet_rows']:.1%} on the quiet one")


def sizes(path: Path = SIZES_FILE) -> list[dict[str, Any]]:
    """published_collectives.compare's rows of the all-reduce size tables (every size) with the
    prediction without the tree-level latency beside them ("off_GBps", "off_error")."""
    rows = pc.compare(path, min_bytes=0)
    off = pc.compare(path, min_bytes=0, set_keys={LEVEL_KEY: 0.0})
    return [{**r, "off_GBps": o["predicted_GBps"], "off_error": o["error"]}
            for r, o in zip(rows, off, strict=True)]


def sizes_line(rows: list[dict[str, Any]]) -> str:
    """Median |busbw error| per set (published_collectives.summarise), with the tree-level
    latency and without it."""
    on = pc.summarise(rows)
    off = pc.summarise([{**r, "error": r["off_error"]} for r in rows])
    return "median |busbw error| with a tree's latency per level beyond a leaf: " + "; ".join(
        f"{name} {s['median_abs_error']:.1%} over {s['rows']} rows "
        f"({off[name]['median_abs_error']:.1%} without it)" for name, s in on.items())


def level_grid(path: Path = SIZES_FILE, step_us: float = 6.25, top_us: float = 100.0
               ) -> list[tuple[float, float]]:
    """(tree_level_us, median |busbw error| of the fit rows over more than two nodes) on a grid:
    the value with the smallest median is the cluster's."""
    out = []
    for k in range(int(top_us / step_us) + 1):
        rows = pc.compare(path, min_bytes=0, set_keys={LEVEL_KEY: k * step_us})
        fit = [abs(r["error"]) for r in rows if r["set"] == "fit" and r["nodes"] > 2]
        out.append((k * step_us, statistics.median(fit)))
    return out


def main() -> None:
    import sys

    if sys.argv[1:] == ["levels"]:
        for us, err in level_grid():
            print(f"tree_level_us {us:6.2f}: fit median |busbw error| {err:.1%}")
        return
    rows = compare()
    print("| row | nodes | published busbw GB/s | predicted | error | mechanism off | error |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['name']} | {r['nodes']} | {r['published_GBps']:.1f} | "
              f"{r['predicted_GBps']:.1f} | {r['error']:+.1%} | {r['quiet_GBps']:.1f} | "
              f"{r['quiet_error']:+.1%} |")
    print(summary_line(rows))


if __name__ == "__main__":
    main()
