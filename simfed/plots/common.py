"""Shared look of simfed figures: Agg-only figures, colours per algorithm and phase, axis labels
for scenario keys, and a deterministic PNG/SVG save helper."""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..analysis.report import fmt_s
from ..spec.paths import write_bytes

DPI = 110
FORMATS = ("png", "svg")

ALGORITHM_COLORS = {
    "fsdp": "#4c72b0",
    "hsdp": "#dd8452",
    "fl_fsdp": "#2a9d5c",
    "fl_hsdp": "#c44e52",
}
ALGORITHM_MARKERS = {"fsdp": "o", "hsdp": "s", "fl_fsdp": "^", "fl_hsdp": "D"}
_EXTRA_COLORS = ("#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974", "#64b5cd")

PHASE_COLORS = {
    "forward": "#9ecae1",
    "backward": "#3182bd",
    "optimizer": "#f2b134",
    "aggregation": "#d1495b",
    "other": "#bdbdbd",
}
PHASE_ORDER = ("forward", "backward", "optimizer", "aggregation", "other")

# axis labels for the scenario keys people sweep most
KEY_LABELS = {
    "cluster.nodes": "nodes",
    "cluster.world": "GPUs",
    "cluster.node.nics.bw_Gbps": "inter-node bandwidth per rail (Gb/s)",
    "cluster.node.nvlink.bw_GBps": "NVLink bandwidth per GPU (GB/s)",
    "training.seq_len": "sequence length (tokens)",
    "training.micro_batch": "sequences per GPU per step",
    "training.steps": "steps",
    "runtime.host.debug_checks": "TORCH_DISTRIBUTED_DEBUG checks",
}
_LEAF_LABELS = {
    "group_nodes": "nodes per federation group",
    "aggregate_every": "K (local steps between FedAvg)",
    "shard_size": "shard group size (GPUs)",
}


def new_figure(width_in: float = 8.0, height_in: float = 4.5) -> Figure:
    """A figure bound to the Agg canvas (no display, no pyplot global state)."""
    fig = Figure(figsize=(width_in, height_in), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def algorithm_color(name: str, index: int = 0) -> str:
    return ALGORITHM_COLORS.get(name, _EXTRA_COLORS[index % len(_EXTRA_COLORS)])


def algorithm_marker(name: str) -> str:
    return ALGORITHM_MARKERS.get(name, "v")


def key_label(key: str) -> str:
    """`algorithms.fl_fsdp.group_nodes` -> `nodes per federation group (fl_fsdp)`."""
    if key in KEY_LABELS:
        return KEY_LABELS[key]
    parts = key.split(".")
    leaf = parts[-1]
    if parts[0] == "algorithms" and len(parts) == 3 and leaf in _LEAF_LABELS:
        return f"{_LEAF_LABELS[leaf]} ({parts[1]})"
    return key


def param(row: Mapping[str, Any], key: str) -> Any:
    """A sweep row's value for `key`: a swept parameter, or a (dotted) result field."""
    params = row.get("params") or {}
    if key in params:
        return params[key]
    if key in ("gpus", "cluster.world"):
        return (row.get("cluster") or {}).get("world")
    cur: Any = row
    for part in key.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return None
        cur = cur[part]
    return cur


fmt_seconds = fmt_s  # one formatting of durations for tables and figures


def fmt_count(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.3g}"


def scenario_title(rows: Sequence[Mapping[str, Any]]) -> str:
    """`paper-512gpu: llama3.1-8b on A100-SXM-64GB` from a row or run result."""
    for r in rows:
        model = r.get("model") or {}
        cluster = r.get("cluster") or {}
        if r.get("scenario"):
            extra = []
            if model.get("name"):
                extra.append(str(model["name"]))
            if cluster.get("gpu"):
                extra.append(f"on {cluster['gpu']}")
            return f"{r['scenario']}: {' '.join(extra)}" if extra else str(r["scenario"])
    return ""


def save_figure(fig: Figure, path: str | Path, formats: Iterable[str] | None = None,
                dpi: int = DPI) -> list[Path]:
    """Write the figure. `path` with a suffix (x.png) writes that format; without one, every
    format in `formats` (PNG and SVG by default). Writes are atomic and byte-reproducible
    (no dates, fixed SVG ids)."""
    path = Path(path)
    suffix = path.suffix.lower().lstrip(".")
    known = suffix in ("png", "svg", "pdf")
    stem = path.with_suffix("") if known else path
    if formats is None:
        formats = (suffix,) if known else FORMATS
    written = []
    for fmt in formats:
        target = stem.with_name(f"{stem.name}.{fmt}")
        meta: dict[str, Any]
        kwargs: dict[str, Any] = {}
        if fmt == "png":
            meta = {"Software": None}
        elif fmt == "svg":
            meta = {"Date": None, "Creator": None}
        else:
            meta = {"CreationDate": None, "Creator": None, "Producer": None}
        with matplotlib.rc_context({"svg.hashsalt": "simfed", "svg.fonttype": "none"}):
            buf = io.BytesIO()
            fig.savefig(buf, format=fmt, dpi=dpi, metadata=meta, **kwargs)
        write_bytes(target, buf.getvalue())  # atomic; a device or FIFO in place
        written.append(target)
    return written
