"""One training step as a timeline per algorithm: phases, GPU compute and each communication
stream (shard, replicate, federated) and host work of one rank, from trace spans."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ..spec.trace import Span
from .common import PHASE_COLORS, fmt_seconds, new_figure


def comm_group(s: Span) -> str:
    """The process-group kind of a comm span: simfed writes stream `shard`, realrun
    `comm:shard`; both write group `shard`."""
    return s.group or s.stream.removeprefix("comm:")


# lanes top to bottom: (lane label, predicate on a span)
LANES = (
    ("phase", lambda s: s.cat == "phase"),
    ("GPU compute", lambda s: s.cat == "compute"),
    ("comm: shard", lambda s: s.cat == "comm" and comm_group(s) == "shard"),
    ("comm: replicate", lambda s: s.cat == "comm" and comm_group(s) == "replicate"),
    ("comm: FedAvg", lambda s: s.cat == "comm" and comm_group(s) == "fed"),
    ("comm: other", lambda s: s.cat == "comm"
     and comm_group(s) not in ("shard", "replicate", "fed")),
    ("host", lambda s: s.cat == "host"),
)

SPAN_COLORS = {
    "forward": "#9ecae1",
    "backward": "#3182bd",
    "optimizer": "#f2b134",
    "fedavg": "#d1495b",
    "all_gather": "#e6550d",
    "reduce_scatter": "#8856a7",
    "all_reduce": "#2a9d8f",
    "fed all_reduce": "#d1495b",
    "debug check": "#969696",
    "host other": "#d9d9d9",
}


def span_kind(s: Span) -> str:
    """The colour class of a span (legend entry)."""
    name = s.name.lower()
    if s.cat == "phase":
        return s.name
    if s.cat == "compute":
        for k in ("forward", "backward", "optimizer", "fedavg"):
            if name.startswith(k):
                return k
        return "optimizer" if "optim" in name else "backward"
    if s.cat == "comm":
        if comm_group(s) == "fed" or "fedavg" in name:
            return "fed all_reduce"
        for k in ("all_gather", "reduce_scatter", "all_reduce"):
            if name.startswith(k):
                return k
        return "all_reduce"
    if s.cat == "host":
        return "debug check" if name.startswith("debug check") else "host other"
    return "host other"


def _color(kind: str) -> str:
    return PHASE_COLORS.get(kind) or SPAN_COLORS.get(kind, "#bbbbbb")


def pick_step(spans: Sequence[Span], step: int | None) -> int:
    """`step`, checked; by default the last training step (one with a `step` span: realrun
    also traces set-up at step -1 and evaluation after the last step)."""
    steps = sorted({s.step for s in spans if s.step >= 0})
    if not steps:
        raise ValueError("no spans with a step number")
    if step is None:
        framed = sorted({s.step for s in spans if s.cat == "step" and s.step >= 0})
        return (framed or steps)[-1]
    if step not in steps:
        raise ValueError(f"step {step} not traced; traced steps: {steps[0]}..{steps[-1]}")
    return step


def _result_for(key: str, results: Any) -> Mapping[str, Any]:
    """The run result of an algorithm, by label or name, from a mapping or a list."""
    if not results:
        return {}
    items = results.values() if isinstance(results, Mapping) else results
    if isinstance(results, Mapping) and isinstance(results.get(key), Mapping):
        return results[key]
    return next((r for r in items if key in (r.get("label"), r.get("name"))), {})


def plot_gantt(spans_by_label: Mapping[str, Sequence[Span]], *, step: int | None = None,
               rank: int | None = None, title: str | None = None,
               results: Mapping[str, Mapping[str, Any]] | Sequence[Mapping[str, Any]] | None
               = None) -> Figure:
    """One panel per algorithm (a shared time axis from each step's start). `step` defaults to
    the last traced step (trace 8 steps with K=8 to see a FedAvg round); `rank` to the lowest
    traced rank. `results` (the run's per-algorithm dicts, a list or keyed by label) adds labels
    and mean step times to the panel titles."""
    if not spans_by_label:
        raise ValueError("no spans to plot")
    panels = []
    for label, spans in spans_by_label.items():
        if not spans:
            raise ValueError(f"{label}: no spans")
        r = rank if rank is not None else min(s.rank for s in spans)
        mine = [s for s in spans if s.rank == r]
        if not mine:
            raise ValueError(f"{label}: rank {r} not traced")
        st = pick_step(mine, step)
        in_step = [s for s in mine if s.step == st]
        frame = [s for s in in_step if s.cat == "step"]
        t0 = min(s.start_s for s in (frame or in_step))
        t1 = max(s.end_s for s in (frame or in_step))
        lanes = [(name, [s for s in in_step if pred(s)]) for name, pred in LANES]
        lanes = [(n, ss) for n, ss in lanes if ss]
        panels.append((label, r, st, t0, t1, lanes))
    heights = [max(2, len(p[5])) for p in panels]
    fig = new_figure(11.0, 1.0 + sum(0.42 * h + 0.55 for h in heights))
    axes = fig.subplots(len(panels), 1, sharex=True, height_ratios=heights, squeeze=False)[:, 0]
    kinds_seen: dict[str, None] = {}
    longest = max(p[4] - p[3] for p in panels)
    for ax, (label, r, st, t0, t1, lanes) in zip(axes, panels, strict=True):
        for li, (_, ss) in enumerate(lanes):
            by_kind: dict[str, list[tuple[float, float]]] = {}
            for s in ss:
                k = span_kind(s)
                by_kind.setdefault(k, []).append((s.start_s - t0, max(s.dur_s, longest * 1e-4)))
                kinds_seen.setdefault(k)
            y = len(lanes) - 1 - li
            for k, bars in by_kind.items():
                # white edges separate wide bars; on thin ones they would wash the colour out
                wide = [b for b in bars if b[1] >= 0.004 * longest]
                thin = [b for b in bars if b[1] < 0.004 * longest]
                if wide:
                    ax.broken_barh(wide, (y - 0.38, 0.76), facecolors=_color(k),
                                   edgecolor="white", linewidth=0.3)
                if thin:
                    ax.broken_barh(thin, (y - 0.38, 0.76), facecolors=_color(k),
                                   edgecolor="none")
            if lanes[li][0] == "phase":
                for s in ss:
                    if s.dur_s > 0.06 * longest:
                        ax.text(s.start_s - t0 + s.dur_s / 2, y, s.name, ha="center",
                                va="center", fontsize=7)
        ax.set_yticks(range(len(lanes)))
        ax.set_yticklabels([n for n, _ in reversed(lanes)], fontsize=8)
        ax.set_ylim(-0.6, len(lanes) - 0.4)
        ax.grid(True, axis="x", alpha=0.3)
        res = _result_for(label, results)
        extra = (f" (mean over the run: {fmt_seconds(res['step_time_s'])})"
                 if "step_time_s" in res else "")
        shown = res.get("label") or label
        ax.set_title(f"{shown}: step {st + 1} of rank {r} takes {fmt_seconds(t1 - t0)}{extra}",
                     fontsize=9, loc="left")
    axes[-1].set_xlabel("time from the start of the step (s)")
    axes[-1].set_xlim(0, longest * 1.01)
    order = ["forward", "backward", "optimizer", "aggregation", "other", "fedavg", "all_gather",
             "reduce_scatter", "all_reduce", "fed all_reduce", "debug check", "host other"]
    names = {"fedavg": "FedAvg divide", "fed all_reduce": "FedAvg all_reduce",
             "host other": "other host work", "all_reduce": "all_reduce (replicas)"}
    handles = [Patch(color=_color(k), label=names.get(k, k)) for k in order if k in kinds_seen]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(6, len(handles)),
               fontsize=8, frameon=False)
    fig.suptitle(title or "One training step per algorithm: compute and communication streams",
                 fontsize=11)
    return fig
