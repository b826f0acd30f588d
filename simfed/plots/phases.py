"""Where a step's time goes, per algorithm: stacked phases (forward, backward, optimizer,
aggregation, other) next to GPU compute, exposed communication and host debug checks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from .common import PHASE_COLORS, PHASE_ORDER, algorithm_color, fmt_seconds, new_figure

_WHY = (("compute_s", "GPU compute", "#3182bd"),
        ("exposed_comm_s", "exposed communication", "#e6550d"),
        ("debug_checks_s", "host debug checks", "#756bb1"))


def _algorithms(result: Mapping[str, Any] | Sequence[Mapping[str, Any]]
                ) -> tuple[list[Mapping[str, Any]], Mapping[str, Any]]:
    if isinstance(result, Mapping):
        algs = result.get("algorithms")
        if not isinstance(algs, list) or not algs:
            raise ValueError("expected `simfed run --json` output (an `algorithms` list)")
        return algs, result
    algs = list(result)
    if not algs:
        raise ValueError("no algorithms to plot")
    return algs, algs[0]


def plot_phases(result: Mapping[str, Any] | Sequence[Mapping[str, Any]], *,
                title: str | None = None) -> Figure:
    """`result` is `simfed run --json` output (or a list of its per-algorithm dicts, e.g. the
    sweep rows of one point). Left: seconds per step by phase, stacked, with the step time and
    speedup on top; right: the same steps as compute, exposed communication and host checks."""
    algs, ctx = _algorithms(result)
    labels = [str(a.get("label") or a.get("name")) for a in algs]
    fig = new_figure(11.0, 4.8)
    ax, ax_w = fig.subplots(1, 2, width_ratios=[1.25, 1])
    pos = np.arange(len(algs))
    bottom = np.zeros(len(algs))
    for phase in PHASE_ORDER:
        vals = np.array([float((a.get("phases_s") or {}).get(phase) or 0.0) for a in algs])
        if not vals.any():
            continue
        ax.bar(pos, vals, 0.6, bottom=bottom, label=phase, color=PHASE_COLORS[phase],
               edgecolor="white", linewidth=0.5)
        bottom += vals
    top = max(float(bottom.max()), 1e-12)
    for i, a in enumerate(algs):
        step = float(a.get("step_time_s") or bottom[i])
        text = fmt_seconds(step)
        if a.get("speedup") is not None and i > 0:
            text += f"\n{a['speedup']:.2f}x"
        ax.text(i, bottom[i] + 0.015 * top, text, ha="center", va="bottom", fontsize=8)
    ax.set_xticks(pos)
    ax.set_xticklabels(labels)
    for tick, a in zip(ax.get_xticklabels(), algs, strict=True):
        tick.set_color(algorithm_color(str(a.get("name"))))
    ax.set_ylabel("time per step (s)")
    ax.set_ylim(0, top * 1.22)
    ax.set_title("Phases of a step (mean over steps)")
    ax.legend(fontsize=8, loc="upper right", ncol=2)
    ax.grid(True, axis="y", alpha=0.3)

    width = 0.8 / len(_WHY)
    for k, (key, name, color) in enumerate(_WHY):
        vals = [float(a.get(key) or 0.0) for a in algs]
        ax_w.bar(pos + (k - (len(_WHY) - 1) / 2) * width, vals, width, label=name, color=color)
    ax_w.set_xticks(pos)
    ax_w.set_xticklabels(labels)
    ax_w.set_ylabel("time per step (s)")
    ax_w.set_title("Compute, exposed communication, host checks")
    ax_w.legend(fontsize=8, loc="upper right")
    ax_w.grid(True, axis="y", alpha=0.3)
    ymax = max((float(a.get(k) or 0.0) for a in algs for k, _, _ in _WHY), default=1.0)
    ax_w.set_ylim(0, max(ymax, 1e-12) * 1.15)

    if title is None:
        cluster = ctx.get("cluster") or {}
        model = (ctx.get("model") or {}).get("name", "")
        world = cluster.get("world")
        where = f" on {world:,} x {cluster.get('gpu', 'GPU')}" if world else ""
        title = f"{ctx.get('scenario', '')}: {model}{where}: where the step time goes".strip(": ")
    fig.suptitle(title, fontsize=11)
    return fig
