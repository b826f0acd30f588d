"""Predicted against measured, from `simfed validate` JSON: step times on a parity plot, phase
times side by side, and speedups; panels without data are left out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FormatStrFormatter, NullFormatter

from ..spec.limits import MAX_TIME_S
from .common import PHASE_COLORS, PHASE_ORDER, algorithm_color, new_figure

MAX_SPEEDUP = 1e6  # a ratio of two step times; published and predicted ones are under 100


def _num(v: Any, hi: float = MAX_TIME_S) -> float | None:
    """A positive finite number up to `hi` (a time: 10^7 s), else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if np.isfinite(f) and 0 < f <= hi else None


def _checked(items: list[Any], keys: tuple[str, ...], what: str, hi: float) -> None:
    """A value that is present is a number in range (absent or null: the item is skipped; a
    number of 10^308 would take the figure minutes to draw)."""
    for i, r in enumerate(items):
        if not isinstance(r, Mapping):
            continue
        for k in keys:
            v = r.get(k)
            if v is not None and _num(v, hi) is None:
                raise ValueError(f"{what}[{i}].{k}: expected a number above 0 and at most "
                                 f"{hi:g}, got {str(v)[:60]!r}")


def plot_validation(data: Mapping[str, Any], *, title: str | None = None) -> Figure:
    """`data`: {"runs": [{name, algorithm, predicted_step_time_s, measured_step_time_s,
    predicted_phases_s, measured_phases_s}], "speedups": [{name, predicted, measured}]};
    every field is optional, runs or speedups missing a side are skipped. A run marked
    `baseline` (a shape's FSDP run repeated to pair a speedup) is left out of the step panels,
    as `simfed validate`'s summary leaves it out of the medians."""
    for key in ("runs", "speedups"):  # absent or null: none; else a list
        if data.get(key) is not None and not isinstance(data.get(key), list):
            raise ValueError(f"{key}: expected a list, got {str(data.get(key))[:60]!r}")
    _checked(data.get("runs") or [], ("predicted_step_time_s", "measured_step_time_s"), "runs",
             MAX_TIME_S)
    _checked(data.get("speedups") or [], ("predicted", "measured"), "speedups", MAX_SPEEDUP)
    runs = [r for r in (data.get("runs") or []) if isinstance(r, Mapping)
            and not r.get("baseline")]
    steps = [r for r in runs if _num(r.get("predicted_step_time_s"))
             and _num(r.get("measured_step_time_s"))]
    phased = [r for r in runs if isinstance(r.get("predicted_phases_s"), Mapping)
              and isinstance(r.get("measured_phases_s"), Mapping)]
    for r in phased:  # a phase present is a time (a missing one draws as 0)
        for side in ("predicted", "measured"):
            for phase, v in r[f"{side}_phases_s"].items():
                if v is not None and _num(v) is None and not (v == 0 and
                                                              not isinstance(v, bool)):
                    raise ValueError(f"run {str(r.get('name'))[:60]!r}: {side}_phases_s.{phase}"
                                     f": expected seconds (a finite number >= 0), got "
                                     f"{str(v)[:60]!r}")
    speedups = [s for s in (data.get("speedups") or []) if isinstance(s, Mapping)
                and _num(s.get("predicted"), MAX_SPEEDUP) and _num(s.get("measured"), MAX_SPEEDUP)]
    panels = [p for p, have in (("steps", steps), ("phases", phased), ("speedups", speedups))
              if have]
    if not panels:
        raise ValueError("nothing to compare: no run or speedup has both a predicted and a "
                         "measured value")
    widths = {"steps": 1.0, "phases": 1.4, "speedups": 1.0}
    fig = new_figure(1.0 + 4.4 * sum(widths[p] for p in panels), 4.6)
    axes = fig.subplots(1, len(panels), width_ratios=[widths[p] for p in panels], squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        if panel == "steps":
            _parity(ax, steps)
        elif panel == "phases":
            _phases(ax, phased)
        else:
            _speedups(ax, speedups)
    fig.suptitle(title or "simfed validation: predicted vs measured", fontsize=11)
    return fig


def _name(r: Mapping[str, Any], i: int) -> str:
    return str(r.get("name") or r.get("algorithm") or f"run {i + 1}")


def _parity(ax, runs: list[Mapping[str, Any]]) -> None:
    pred = np.array([float(r["predicted_step_time_s"]) for r in runs])
    meas = np.array([float(r["measured_step_time_s"]) for r in runs])
    lo, hi = float(min(pred.min(), meas.min())) / 1.5, float(max(pred.max(), meas.max())) * 1.5
    line = np.array([lo, hi])
    ax.plot(line, line, color="0.3", linewidth=1, label="exact")
    ax.fill_between(line, line / 1.2, line * 1.2, color="0.85", label="within 20%")
    ax.fill_between(line, line / 1.1, line * 1.1, color="0.75", label="within 10%")
    # fit shapes (developed on) hollow squares, held-out check shapes filled circles; a run is
    # labelled only outside 10% (the others sit in the band and would only crowd it)
    marker = {"fit": "s", "check": "o"}
    for i, r in enumerate(runs):
        split = str(r.get("split") or "")
        color = algorithm_color(str(r.get("algorithm")), i)
        ax.scatter(meas[i], pred[i], marker=marker.get(split, "o"), s=30, zorder=3,
                   facecolors="none" if split == "fit" else color, edgecolors=color)
        err = 100 * (pred[i] - meas[i]) / meas[i]
        if round(abs(err)) > 10:  # as printed
            ax.annotate(f"{_name(r, i)} ({err:+.0f}%)", (meas[i], pred[i]), fontsize=7,
                        textcoords="offset points", xytext=(5, 3))
    for split in marker:
        if any(r.get("split") == split for r in runs):
            ax.scatter([], [], marker=marker[split], s=30, color="0.4",
                       facecolors="none" if split == "fit" else "0.4", label=f"{split} set")
    if hi / lo > 20:
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(FormatStrFormatter("%g"))
            axis.set_minor_formatter(NullFormatter())
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal", adjustable="box")
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("predicted step time (s)")
    errs = np.abs(pred - meas) / meas
    splits = [(sp, errs[[r.get("split") == sp for r in runs]]) for sp in marker]
    parts = [f"{sp} median |error| {100 * float(np.median(e)):.1f}%" for sp, e in splits if len(e)]
    ax.set_title(f"Step time (mean |error| {100 * errs.mean():.0f}%)" + (
        "\n" + ", ".join(parts) if parts else ""), fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(True, alpha=0.3)


def _phases(ax, runs: list[Mapping[str, Any]]) -> None:
    pos = np.arange(len(runs))
    width = 0.38
    for side, off, hatch in (("predicted", -width / 2, ""), ("measured", width / 2, "//")):
        bottom = np.zeros(len(runs))
        for phase in PHASE_ORDER:
            vals = np.array([float((r.get(f"{side}_phases_s") or {}).get(phase) or 0.0)
                             for r in runs])
            if not vals.any():
                continue
            ax.bar(pos + off, vals, width, bottom=bottom, color=PHASE_COLORS[phase],
                   hatch=hatch, edgecolor="white", linewidth=0.4,
                   label=phase if side == "predicted" else None)
            bottom += vals
    ax.set_xticks(pos)
    ax.set_xticklabels([_name(r, i) for i, r in enumerate(runs)], **_tick_style(len(runs)))
    ax.set_ylabel("time per step (s)")
    ax.set_title("Phases: left bar predicted, right (hatched) measured", fontsize=10)
    ax.legend(fontsize=7, loc="upper right")
    ax.grid(True, axis="y", alpha=0.3)


def _tick_style(n: int) -> dict[str, Any]:
    """Bar labels: slanted a little for a few bars, steeply and smaller for many."""
    return ({"fontsize": 8, "rotation": 20, "ha": "right"} if n <= 8 else
            {"fontsize": 7, "rotation": 55, "ha": "right", "rotation_mode": "anchor"})


def _speedups(ax, items: list[Mapping[str, Any]]) -> None:
    pos = np.arange(len(items))
    width = 0.38
    pred = [float(s["predicted"]) for s in items]
    meas = [float(s["measured"]) for s in items]
    ax.bar(pos - width / 2, pred, width, label="predicted", color="#3182bd")
    ax.bar(pos + width / 2, meas, width, label="measured", color="#bdbdbd", hatch="//",
           edgecolor="white")
    many = len(items) > 8  # upright value labels would overlap their neighbours
    for i, (p, m) in enumerate(zip(pred, meas, strict=True)):
        for x, v in ((i - width / 2, p), (i + width / 2, m)):
            ax.text(x, v, f"{v:.2f}x", ha="center", va="bottom", fontsize=6 if many else 7,
                    rotation=90 if many else 0)
    ax.axhline(1.0, color="0.4", linestyle="--", linewidth=1)
    ax.set_xticks(pos)
    ax.set_xticklabels([str(s.get("name") or f"#{i + 1}") for i, s in enumerate(items)],
                       **_tick_style(len(items)))
    ax.set_ylabel("speedup (x)")
    ax.set_ylim(0, max(pred + meas) * 1.18)
    ax.set_title("Speedups", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(True, axis="y", alpha=0.3)
