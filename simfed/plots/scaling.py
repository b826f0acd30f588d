"""Throughput and speedup against GPU count (or any swept value), one line per algorithm: the
paper's headline picture, drawn from sweep rows."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullLocator

from .common import (
    algorithm_color,
    algorithm_marker,
    fmt_count,
    key_label,
    new_figure,
    param,
    scenario_title,
)

_LINESTYLES = ("-", "--", ":", "-.")
_SHORT = {"group_nodes": "group", "aggregate_every": "K", "shard_size": "shard"}


def _relevant(key: str, row: Mapping[str, Any]) -> bool:
    """`algorithms.X.*` only matters to algorithm X's rows."""
    parts = key.split(".")
    if parts[0] == "algorithms" and len(parts) >= 3:
        return parts[1] in (row.get("name"), row.get("label"))
    return True


def series_of(rows: Sequence[Mapping[str, Any]], x: str) -> dict[tuple, list[Mapping[str, Any]]]:
    """Rows grouped into lines: by algorithm, then by every other swept key that varies and
    matters to that algorithm (x itself, and nodes when x is the GPU count, excluded)."""
    skip = {x}
    if x in ("gpus", "cluster.world"):
        skip.add("cluster.nodes")
    keys: list[str] = []
    for r in rows:
        for k in (r.get("params") or {}):
            if k not in skip and k not in keys:
                keys.append(k)
    varying = [k for k in keys if len({repr(param(r, k)) for r in rows}) > 1]
    out: dict[tuple, list[Mapping[str, Any]]] = {}
    for r in rows:
        extra = tuple((k, param(r, k)) for k in varying if _relevant(k, r))
        out.setdefault((r.get("label") or r.get("name"), r.get("name"), extra), []).append(r)
    return out


def _series_label(label: str, extra: tuple) -> str:
    if not extra:
        return label
    parts = [f"{_SHORT.get(k.split('.')[-1], k.split('.')[-1])}={v}" for k, v in extra]
    return f"{label} ({', '.join(parts)})"


def _numeric(values: Sequence[Any]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def plot_scaling(rows: Sequence[Mapping[str, Any]], *, x: str = "gpus",
                 where: Callable[[Mapping[str, Any]], bool] | None = None,
                 title: str | None = None, speedup: bool = True) -> Figure:
    """Left: tokens/s of the cluster against `x` (log-log for GPU counts) with the linear-scaling
    reference; right: speedup over the sweep's baseline algorithm at the same point."""
    usable = [r for r in rows if r.get("status", "ok") in ("ok", "does_not_fit")
              and r.get("tokens_per_s") is not None and (where is None or where(r))]
    if not usable:
        raise ValueError("no simulated rows to plot (every point invalid, or filtered out)")
    xs_all = [param(r, x) for r in usable]
    if any(v is None for v in xs_all):
        raise ValueError(f"rows have no value for {x!r} (a swept key or a result field)")
    numeric = _numeric(xs_all)
    cats = sorted(set(map(str, xs_all))) if not numeric else []

    def xpos(r: Mapping[str, Any]) -> float:
        v = param(r, x)
        return float(v) if numeric else float(cats.index(str(v)))

    logx = numeric and min(xs_all) > 0 and max(xs_all) / min(xs_all) >= 8
    groups = series_of(usable, x)
    fig = new_figure(11.0 if speedup else 6.5, 4.6)
    axes = fig.subplots(1, 2) if speedup else [fig.subplots(1, 1)]
    ax_t = axes[0]
    baseline = next((r.get("baseline") for r in usable if r.get("baseline")), None)
    variants: dict[str, int] = {}
    any_oom = False
    ends: list[tuple[float, float, str]] = []  # last speedup of each line: (y, x, colour)
    for i, ((label, name, extra), rs) in enumerate(groups.items()):
        rs = sorted(rs, key=xpos)
        seen: dict[float, Mapping[str, Any]] = {}
        for r in rs:
            seen.setdefault(xpos(r), r)  # identical points of a series (unrelated keys)
        rs = list(seen.values())
        v = variants.setdefault(str(name), 0)
        variants[str(name)] += 1
        style = {"color": algorithm_color(str(name), i), "marker": algorithm_marker(str(name)),
                 "linestyle": _LINESTYLES[v % len(_LINESTYLES)], "markersize": 5,
                 "linewidth": 1.8}
        text = _series_label(str(label), extra)
        ok = [r for r in rs if r.get("status", "ok") == "ok"]
        oom = [r for r in rs if r.get("status") == "does_not_fit"]
        any_oom = any_oom or bool(oom)
        ax_t.plot([xpos(r) for r in ok], [r["tokens_per_s"] for r in ok], label=text, **style)
        if oom:
            ax_t.plot([xpos(r) for r in oom], [r["tokens_per_s"] for r in oom], "x",
                      color=style["color"], markersize=8)
        if speedup:
            sp = [r for r in ok if r.get("speedup") is not None]
            if name == baseline or label == baseline:
                continue
            axes[1].plot([xpos(r) for r in sp], [r["speedup"] for r in sp], label=text, **style)
            if sp:
                ends.append((sp[-1]["speedup"], xpos(sp[-1]), style["color"]))
    if numeric and x in ("gpus", "cluster.world"):
        # tokens/s growing in proportion to the GPUs from the best run at the smallest count:
        # a wide grey band under the lines, so an algorithm that scales linearly (drawn on
        # top of it) leaves it visible on both sides
        x0 = min(xs_all)
        best = max((r for r in usable if param(r, x) == x0),
                   key=lambda r: r["tokens_per_s_per_gpu"])
        per_gpu = best["tokens_per_s_per_gpu"]
        lo, hi = min(xs_all), max(xs_all)
        ax_t.plot([lo, hi], [per_gpu * lo, per_gpu * hi], color="0.55", alpha=0.35,
                  linewidth=7, solid_capstyle="butt", zorder=0,
                  label=f"linear scaling from {best.get('label') or best.get('name')} "
                        f"at {x0:,}")
    xlabel = key_label("cluster.world" if x == "gpus" else x)
    for ax in axes:
        ax.set_xlabel(xlabel)
        ax.grid(True, which="major", alpha=0.3)
        if logx:
            ax.set_xscale("log", base=2)
            ticks = sorted(set(xs_all))
            ax.set_xticks(ticks)
            ax.xaxis.set_minor_locator(NullLocator())
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        elif not numeric:
            ax.set_xticks(range(len(cats)))
            ax.set_xticklabels(cats)
    ax_t.set_ylabel("throughput (tokens/s, whole cluster)")
    ax_t.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt_count(v)))
    if logx:
        ax_t.set_yscale("log")
        ax_t.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt_count(v)))
    ax_t.set_title("Throughput")
    ax_t.legend(fontsize=8, loc="best")
    if any_oom:
        ax_t.text(0.99, 0.01, "x: does not fit in GPU memory", transform=ax_t.transAxes,
                  ha="right", va="bottom", fontsize=7, color="0.3")
    if speedup:
        ax_s = axes[1]
        _label_ends(ax_s, ends, logx)
        ax_s.axhline(1.0, color="0.4", linestyle="--", linewidth=1,
                     label=f"{baseline} (baseline)" if baseline else "baseline")
        ax_s.set_ylabel(f"speedup over {baseline or 'the baseline'} (step time ratio)")
        ax_s.set_title(f"Speedup over {baseline}" if baseline else "Speedup")
        ax_s.set_ylim(bottom=0)
        ax_s.legend(fontsize=8, loc="upper left")
    fig.suptitle(title or f"{scenario_title(usable)}: throughput and speedup vs {xlabel}",
                 fontsize=11)
    return fig


def _label_ends(ax, ends: list[tuple[float, float, str]], logx: bool) -> None:
    """`18.4x` right of each line's last point, nudged apart so that labels never overlap."""
    if not ends:
        return
    top = max(y for y, _, _ in ends)
    gap = 0.05 * max(top, 1.0)
    placed: list[float] = []
    for y, x, color in sorted(ends):
        y_text = max(y, placed[-1] + gap) if placed else y
        placed.append(y_text)
        x_text = x * 1.07 if logx else x + 0.02 * max(abs(x), 1.0)
        ax.text(x_text, y_text, f"{y:.1f}x", va="center", ha="left", fontsize=8, color=color)
    xs = [x for _, x, _ in ends]
    lo, hi = ax.get_xlim()
    ax.set_xlim(lo, max(hi, max(xs) * 1.6 if logx else max(xs) + 0.15 * (max(xs) - lo)))
