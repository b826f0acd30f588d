"""Speedup (or any result field) of one algorithm over a two-key grid, e.g. federation group
size x K, as an annotated heatmap; impossible points are hatched and labelled."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.colors import Normalize, TwoSlopeNorm
from matplotlib.figure import Figure

from .common import fmt_seconds, key_label, new_figure, param, scenario_title

VALUE_LABELS = {
    "speedup": "speedup over {baseline} (step time ratio)",
    "tokens_per_s": "tokens/s (whole cluster)",
    "step_time_s": "step time (s)",
    "mfu": "MFU",
    "epoch_time_s": "epoch time (s)",
}


def _sort_key(v: Any) -> tuple:
    return (0, float(v), "") if isinstance(v, (int, float)) else (1, 0.0, str(v))


def _tick(v: object) -> str:
    """A swept value as a tick label, cut to 40 characters (a long string would take the
    figure's whole width and seconds to lay out)."""
    text = str(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _fmt(value: str, v: float) -> str:
    if value in ("speedup", "epoch_speedup"):
        return f"{v:.2f}x"
    if value.endswith("_s"):
        return fmt_seconds(v)
    if value == "mfu":
        return f"{100 * v:.0f}%"
    if abs(v) >= 1e4:
        return f"{v / 1e6:.2f}M" if abs(v) >= 1e6 else f"{v / 1e3:.0f}k"
    return f"{v:.3g}"


def with_baseline(rows: Sequence[Mapping[str, Any]], baseline: str) -> list[dict[str, Any]]:
    """Rows with `speedup` recomputed against `baseline` (name or label) at the same point."""
    base = {r.get("point"): r for r in rows if baseline in (r.get("name"), r.get("label"))}
    if not base:
        raise ValueError(f"no rows for baseline {baseline!r}")
    out = []
    for r in rows:
        b = base.get(r.get("point"))
        new = dict(r)
        ok = b is not None and b.get("step_time_s") and r.get("step_time_s")
        new["speedup"] = b["step_time_s"] / r["step_time_s"] if ok else None
        new["baseline"] = (b or {}).get("label") or baseline
        out.append(new)
    return out


def plot_heatmap(rows: Sequence[Mapping[str, Any]], *, x: str, y: str,
                 algorithm: str | None = None, value: str = "speedup",
                 baseline: str | None = None, title: str | None = None) -> Figure:
    """One cell per (x, y) point for `algorithm` (default: the last algorithm in the rows),
    coloured by `value`; for speedups the colours diverge at 1.0 (red: slower than the
    baseline, green: faster). `baseline` recomputes speedups against another algorithm of the
    same sweep (default: the sweep's own baseline, its first algorithm)."""
    if baseline is not None:
        rows = with_baseline(rows, baseline)
    names = [r.get("name") for r in rows]
    if algorithm is None:
        algorithm = next((n for n in reversed(names) if n), None)
    mine = [r for r in rows if algorithm in (r.get("name"), r.get("label"))]
    if not mine:
        have = ", ".join(sorted({str(n) for n in names if n}))
        raise ValueError(f"no rows for algorithm {algorithm!r}; the rows have: {have}")
    for key in (x, y):
        if any(param(r, key) is None for r in mine):
            raise ValueError(f"rows have no value for {key!r} (a swept key)")
    xs = sorted({param(r, x) for r in mine}, key=_sort_key)
    ys = sorted({param(r, y) for r in mine}, key=_sort_key)
    grid = np.full((len(ys), len(xs)), np.nan)
    status: dict[tuple[int, int], str] = {}
    for r in mine:
        j, i = xs.index(param(r, x)), ys.index(param(r, y))
        if (i, j) in status:
            raise ValueError(f"more than one row per ({x}, {y}) cell: the rows vary another key;"
                             " filter them first")
        st = r.get("status", "ok")
        status[(i, j)] = st
        v = r.get(value)
        if st in ("ok", "does_not_fit") and v is not None:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
                raise ValueError(f"row {r.get('point')} ({r.get('label') or r.get('name')}): "
                                 f"{value} is {str(v)[:60]!r}, not a finite number")
            grid[i, j] = float(v)
    finite = grid[np.isfinite(grid)]
    fig = new_figure(1.6 + 0.85 * len(xs) + 2.0, 1.4 + 0.55 * len(ys) + 0.8)
    ax = fig.subplots()
    if finite.size:
        lo, hi = float(finite.min()), float(finite.max())
        if value in ("speedup", "epoch_speedup") and lo < 1.0 < hi:
            norm: Normalize = TwoSlopeNorm(vcenter=1.0, vmin=lo, vmax=hi)
            cmap = "RdYlGn"
        else:
            norm = Normalize(vmin=lo, vmax=hi if hi > lo else lo + 1e-9)
            cmap = "Greens" if value in ("speedup", "epoch_speedup", "tokens_per_s",
                                         "mfu") else "viridis_r"
    else:
        norm, cmap = Normalize(0, 1), "Greens"
    im = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, norm=norm, aspect="auto",
                   origin="lower")
    ax.set_facecolor("#eeeeee")
    for (i, j), st in status.items():
        v = grid[i, j]
        if np.isfinite(v):
            rgba = im.cmap(im.norm(v))
            dark = 0.299 * rgba[0] + 0.587 * rgba[1] + 0.114 * rgba[2] < 0.5
            text = _fmt(value, v) + ("\nOOM" if st == "does_not_fit" else "")
            ax.text(j, i, text, ha="center", va="center", fontsize=9,
                    color="white" if dark else "black")
        else:
            ax.add_patch(_hatch(j, i))
            ax.text(j, i, "n/a" if st == "invalid" else st, ha="center", va="center",
                    fontsize=7, color="0.35")
    ax.set_xticks(range(len(xs)))
    ax.set_xticklabels([_tick(v) for v in xs])
    ax.set_yticks(range(len(ys)))
    ax.set_yticklabels([_tick(v) for v in ys])
    ax.set_xlabel(key_label(x))
    ax.set_ylabel(key_label(y))
    baseline = next((r.get("baseline") for r in rows if r.get("baseline")), "the baseline")
    label = mine[0].get("label") or algorithm
    cbar = fig.colorbar(im, ax=ax, shrink=0.9)
    cbar.set_label(VALUE_LABELS.get(value, value).format(baseline=baseline))
    ctx = scenario_title(mine)
    gpus = {param(r, "gpus") for r in mine if param(r, "gpus")}
    where = f", {gpus.pop():,} GPUs" if len(gpus) == 1 else ""
    what = f"speedup over {baseline}" if value == "speedup" else value
    ax.set_title(title or f"{label}: {what}\n{ctx}{where}", fontsize=10)
    if any(s != "ok" for s in status.values()):
        fig.supxlabel("n/a: the plan does not divide the cluster;  OOM: does not fit in GPU "
                      "memory", fontsize=7, color="0.35")
    return fig


def _hatch(j: int, i: int):
    from matplotlib.patches import Rectangle

    return Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", edgecolor="0.7",
                     linewidth=0)
