"""Train and eval perplexity against wall-clock time, one line per realrun run, from the
`summary.json` files that `realrun run` writes."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from ..spec import SpecError
from ..spec.jsonio import read_json
from ..spec.limits import MAX_TIME_S
from .common import algorithm_color, algorithm_marker, new_figure


def load_summaries(paths: Sequence[str | Path]) -> list[dict[str, Any]]:
    """Read realrun summary.json files (a run folder stands for its summary.json)."""
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            p = p / "summary.json"
        # bounded, nested <= 64; NaN allowed: a diverged run's losses (realrun writes them)
        data = read_json(p, "realrun summary.json", allow_nan=True)
        if not isinstance(data, dict):
            raise SpecError(f"{p}: expected a JSON object (a realrun summary.json)")
        _check_series(data, p)
        data.setdefault("_path", str(p))
        out.append(data)
    return out


def _check_series(data: Mapping[str, Any], p: Path) -> None:
    """The per-step lists the plot draws are lists of numbers (a SpecError naming the file, key
    and item otherwise): step times finite, 0 to 10^7 s; losses and perplexities may be NaN or
    infinite (a run that diverged writes them so: matplotlib leaves those points out)."""
    for key in ("step_times_s", "train_perplexity", "train_loss"):
        v = data.get(key)
        if v is None:
            continue
        if not isinstance(v, list):
            raise SpecError(f"{p}: {key}: expected a list of numbers (one per step), got "
                            f"{str(v)[:60]!r}")
        for i, x in enumerate(v):
            if isinstance(x, bool) or not isinstance(x, (int, float)) or (
                    key == "step_times_s" and not 0 <= x <= MAX_TIME_S):
                want = (f"a step time of 0 to {MAX_TIME_S:g} s" if key == "step_times_s"
                        else "a number")
                raise SpecError(f"{p}: {key}[{i}]: expected {want}, got {str(x)[:60]!r}")


def _label(s: Mapping[str, Any], i: int) -> str:
    base = str(s.get("title") or s.get("algorithm") or Path(str(s.get("_path", ""))).parent.name
               or f"run {i + 1}")
    world = s.get("world_size")
    return f"{base} ({world} ranks)" if world else base


def plot_perplexity(summaries: Sequence[Mapping[str, Any]], *, title: str | None = None,
                    log_y: bool = True) -> Figure:
    """Train perplexity per step at the cumulative step time; eval perplexity before training
    (`untrained_eval_perplexity`, at 0 s) and after it (`eval_perplexity`, at the end), joined
    by a dotted line; the data's entropy floor when the summary gives it."""
    usable = []
    for s in summaries:
        times = s.get("step_times_s") or []
        ppl = s.get("train_perplexity") or [math.exp(min(x, 700.0))
                                            for x in s.get("train_loss") or []]
        if times and ppl:
            n = min(len(times), len(ppl))
            usable.append((s, list(accumulate(float(t) for t in times[:n])), ppl[:n]))
    if not usable:
        raise ValueError("no summary has step_times_s and train_perplexity (or train_loss)")
    fig = new_figure(8.0, 4.8)
    ax = fig.subplots()
    floors = set()
    for i, (s, t, ppl) in enumerate(usable):
        name = str(s.get("algorithm") or "")
        color = algorithm_color(name, i)
        label = _label(s, i)
        ax.plot(t, ppl, color=color, linewidth=1.6, label=f"{label}: train")
        ev = s.get("eval_perplexity")
        ev0 = s.get("untrained_eval_perplexity")
        if isinstance(ev, (int, float)) and math.isfinite(ev):
            xs, ys = [t[-1]], [float(ev)]
            if isinstance(ev0, (int, float)) and math.isfinite(ev0):
                xs, ys = [0.0, *xs], [float(ev0), *ys]
            ax.plot(xs, ys, color=color, linestyle=":", marker=algorithm_marker(name),
                    markersize=7, label=f"{label}: eval ({float(ev):.3g} at {t[-1]:.3g} s)")
        if isinstance(s.get("floor_perplexity"), (int, float)):
            floors.add(float(s["floor_perplexity"]))
    for f in sorted(floors):
        ax.axhline(f, color="0.5", linestyle="--", linewidth=1)
        ax.annotate(f"entropy floor {f:.3g}", (0, f), textcoords="offset points",
                    xytext=(4, 3), fontsize=7, color="0.35")
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel("wall-clock training time (s, sum of step times)")
    ax.set_ylabel("perplexity (log scale)" if log_y else "perplexity")
    ax.set_xlim(left=0)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    scen = {str(s.get("scenario")) for s, _, _ in usable if s.get("scenario")}
    where = f" ({scen.pop()})" if len(scen) == 1 else ""
    ax.set_title(title or f"Perplexity against wall time{where}", fontsize=11)
    return fig
