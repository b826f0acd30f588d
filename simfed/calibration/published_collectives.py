"""Published nccl-tests tables against the NCCL model (validation/published/collectives.yaml).

Each entry names a scenario (its cluster and runtime profile), `set_keys` overrides for what the
source's system differs in (nodes, NICs, NCCL version, NCCL_ALGO), the collective, the ranks and the
published bus bandwidths: a table of rows (size in bytes, busbw in GB/s) or one point (`nbytes`,
`published_busbw_GBps`). `compare()` runs the model (`NcclModel.best`, as `simfed collective` does)
for every row from `min_bytes` (1 MiB) up and returns predicted against published bus bandwidth;
`summarise()` gives the median and worst |error| of the fit set and the check set apart.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from ..spec.schema import SpecError

DEFAULT_FILE = Path(__file__).resolve().parents[2] / "validation" / "published" / "collectives.yaml"
SETS = ("fit", "check")
MIN_BYTES = 1 << 20


def load(path: Path = DEFAULT_FILE) -> dict[str, Any]:
    from . import published_files as files

    data = files.read(path)
    return {**data, "tables": files.entries(path, data, "tables", files.CollectiveTable),
            "cases": files.entries(path, data, "cases", files.CollectivePoint)}


def entry_rows(entry: dict[str, Any]) -> list[tuple[int, float]]:
    """(size bytes, published busbw GB/s) of a table or a single point."""
    if "rows" in entry:
        return [(int(s), float(b)) for s, b in entry["rows"]]
    return [(int(entry["nbytes"]), float(entry["published_busbw_GBps"]))]


def entry_model(entry: dict[str, Any], folder: Path):
    """The NCCL model of an entry's system: its scenario with the entry's overrides."""
    from ..collectives.nccl import nccl_model
    from ..hardware import Hardware
    from ..spec import load_scenario

    try:
        scn = load_scenario(folder / entry["scenario"], entry.get("set_keys"))
    except SpecError as exc:
        raise SpecError(f"{entry['name']}: {exc}") from None
    n = entry["nodes"] * entry["gpus_per_node"]
    if entry["gpus_per_node"] != scn.cluster.node.gpus or entry["nodes"] > scn.cluster.nodes:
        raise SpecError(f"{entry['name']}: {entry['nodes']} x {entry['gpus_per_node']} GPUs do "
                        f"not fit the scenario's {scn.cluster.nodes} x {scn.cluster.node.gpus}")
    return nccl_model(Hardware.from_spec(scn.cluster, scn.runtime), scn.runtime.comm), n


def fit_set_curves(path: Path = DEFAULT_FILE, *, min_bytes: int = MIN_BYTES
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
    """runtime.comm.nccl_bw_curve fitted on the fit set's rows only (simfed.calibration.
    nccl_tests.fit_curves, as `simfed calibrate` does with nccl-tests output), and its report."""
    from .nccl_tests import curve_samples, fit_curves

    data = load(path)
    samples = []
    for kind in ("tables", "cases"):
        for e in data.get(kind) or []:
            if e["set"] != "fit":
                continue
            model, n = entry_model(e, path.parent)
            samples += curve_samples(model, [(e["op"], size, pub, n, e["nodes"], e["name"])
                                             for size, pub in entry_rows(e)])
    return fit_curves(samples, min_bytes=min_bytes)


def compare(path: Path = DEFAULT_FILE, *, min_bytes: int = MIN_BYTES,
            curves: dict[str, Any] | None = None,
            set_keys: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One row per published size >= min_bytes: predicted against published busbw; with
    `curves`, every entry's model carries them as its runtime.comm.nccl_bw_curve; `set_keys`
    are applied on top of every entry's own (a setting turned off for all of them)."""
    from dataclasses import replace

    from ..collectives.nccl import bus_factor

    data = load(path)
    out = []
    for kind in ("tables", "cases"):
        for e in data.get(kind) or []:
            if set_keys:
                e = {**e, "set_keys": {**(e.get("set_keys") or {}), **set_keys}}
            model, n = entry_model(e, path.parent)
            if curves is not None:
                model = replace(model, bw_curve=curves or None)
            for size, pub in entry_rows(e):
                if size < min_bytes:
                    continue
                ch = model.best(e["op"], size, n, e["nodes"])
                pred = size / ch.time_s * bus_factor(e["op"], n) / 1e9
                out.append({"table": e["name"], "set": e["set"], "op": e["op"],
                            "nodes": e["nodes"], "ranks": n, "size_bytes": size,
                            "published_GBps": pub, "predicted_GBps": pred,
                            "algorithm": f"{ch.algorithm}/{ch.protocol}",
                            "error": pred / pub - 1.0})
    return out


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and worst |busbw error| per set (and per table)."""
    out: dict[str, Any] = {}
    for name in SETS:
        sel = [r for r in rows if r["set"] == name]
        if not sel:
            continue
        worst = max(sel, key=lambda r: abs(r["error"]))
        tables = {}
        for t in dict.fromkeys(r["table"] for r in sel):
            tr = [r for r in sel if r["table"] == t]
            tables[t] = {"rows": len(tr),
                         "median_abs_error": statistics.median(abs(r["error"]) for r in tr),
                         "worst_error": max((r["error"] for r in tr), key=abs)}
        out[name] = {"rows": len(sel),
                     "median_abs_error": statistics.median(abs(r["error"]) for r in sel),
                     "worst": {"table": worst["table"], "size_bytes": worst["size_bytes"],
                               "error": worst["error"]},
                     "tables": tables}
    return out


def print_comparison(rows: list[dict[str, Any]], console: Any) -> None:
    from rich.table import Table

    t = Table(title="published nccl-tests bus bandwidth vs the NCCL model (from 1 MiB)")
    for col in ("table", "set", "size", "published", "predicted", "error", "choice"):
        t.add_column(col, justify="left" if col in ("table", "set", "choice") else "right")
    for r in rows:
        t.add_row(r["table"], r["set"], f"{r['size_bytes']:,}", f"{r['published_GBps']:.1f}",
                  f"{r['predicted_GBps']:.1f}", f"{100 * r['error']:+.1f}%", r["algorithm"])
    console.print(t)
    print_summary(rows, console)


def print_summary(rows: list[dict[str, Any]], console: Any, how: str = "") -> None:
    """One line per set: median and worst |busbw error| (`how` qualifies the model)."""
    for name, s in summarise(rows).items():
        w = s["worst"]
        console.print(f"  collectives {name}{how}: median |busbw error| "
                      f"{100 * s['median_abs_error']:.1f}% over {s['rows']} rows; worst "
                      f"{w['table']} at {w['size_bytes']:,} B {100 * w['error']:+.1f}%",
                      highlight=False)
