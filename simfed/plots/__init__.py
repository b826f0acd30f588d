"""Figures from simfed results (matplotlib, Agg only): each function takes result dicts, sweep
rows or spans and returns a Figure; `save_figure` writes PNG and SVG.

Names load on first use, so that `simfed --help` does not import matplotlib."""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "save_figure": "common",
    "plot_gantt": "gantt",
    "plot_heatmap": "heatmap",
    "load_summaries": "perplexity",
    "plot_perplexity": "perplexity",
    "plot_fl_grid": "convergence",
    "plot_size_study": "convergence",
    "plot_phases": "phases",
    "plot_scaling": "scaling",
    "plot_stragglers": "stragglers",
    "plot_time_to_target": "convergence",
    "plot_validation": "validation",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
