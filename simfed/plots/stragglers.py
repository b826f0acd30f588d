"""Throughput against straggler severity: one panel per (cluster size, kind of straggler), one
line per algorithm or FL variant, from the rows of `simfed.figures.straggler_rows`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure

from .common import algorithm_color, algorithm_marker, new_figure

_KIND_AXIS = {
    "slow_node": "one node slower by (%)",
    "gpu_jitter": "per-GPU jitter sigma (%)",
}
_VARIANT_STYLE = {"sync": "-", "budget": "--", "deadline": ":", "nesterov": "-."}


def plot_stragglers(rows: Sequence[Mapping[str, Any]], title: str = "") -> Figure:
    sizes = sorted({r["gpus"] for r in rows})
    kinds = [k for k in _KIND_AXIS if any(r["kind"] == k for r in rows)]
    fig = new_figure(3.9 * len(kinds), 2.5 * len(sizes) + 0.8)
    axes = fig.subplots(len(sizes), len(kinds), squeeze=False, sharey="row")
    series: list[tuple[str, str, str]] = []
    for r in rows:
        key = (r["label"], r["name"], r["variant"])
        if key not in series:
            series.append(key)
    for i, gpus in enumerate(sizes):
        for j, kind in enumerate(kinds):
            ax = axes[i][j]
            for n, (label, name, variant) in enumerate(series):
                pts = sorted((r["severity_pct"], r["tokens_per_s_per_gpu"]) for r in rows
                             if r["gpus"] == gpus and r["kind"] == kind and r["label"] == label)
                if not pts:
                    continue
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label,
                        color=algorithm_color(name, n), marker=algorithm_marker(name),
                        markersize=4, linestyle=_VARIANT_STYLE.get(variant, "-"))
            ax.set_xlabel(_KIND_AXIS[kind])
            ax.set_title(f"{gpus:,} GPUs", fontsize=10)
            ax.grid(True, alpha=0.3)
            if j == 0:
                ax.set_ylabel("tokens/s per GPU (useful steps)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=min(4, len(labels)),
               fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig
