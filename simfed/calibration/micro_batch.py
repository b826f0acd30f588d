"""Where a prediction's error lies: per token or per step, from micro-batch sweeps.

Published runs that differ only in their micro-batch (same scenario, GPU count, sequence,
checkpointing, sharding, gradient accumulation) measure how a step's time grows with the tokens
it processes. A straight line through them, step time = fixed + per_token x tokens (tokens per
GPU per step), splits the time into a part that grows with the tokens (the GEMMs, attention and
memory-bound kernels) and a part that does not (the optimizer step, exposed communication, host
work). The same line through the model's predictions of those runs says which part the model has
wrong: a per-token ratio (model over published) above 1 means the model's kernels are too slow;
a fixed part below the published one means the model misses per-step work. A level error that
comes out right at one micro-batch can hide two opposite errors; the split shows them.

Used by `simfed validate --published` (its `micro_batch_sweeps` and the printed summary).
"""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

MIN_MICRO_BATCHES = 3  # a line through two points has no check of its own


def sweeps(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each group of rows sharing `sweep` (everything but the micro-batch) with at least
    MIN_MICRO_BATCHES distinct micro-batches: the published and predicted lines."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("sweep"):
            by.setdefault(r["sweep"], []).append(r)
    out = []
    for key, rs in by.items():
        if len({r["micro_batch"] for r in rs}) < MIN_MICRO_BATCHES:
            continue
        rs = sorted(rs, key=lambda r: (r["micro_batch"], r["name"]))
        tokens = np.array([r["tokens_per_gpu_step"] for r in rs], dtype=float)
        fit = {}
        for which in ("published", "predicted"):
            step_s = tokens / np.array([r[which] for r in rs], dtype=float)
            per_token, fixed = np.polyfit(tokens, step_s, 1)
            fit[which] = {"fixed_s": float(fixed), "per_1k_tokens_s": float(1e3 * per_token)}
        out.append({
            "sweep": key, "scenario": rs[0]["scenario"], "gpus": rs[0]["gpus"],
            "sets": sorted({r["set"] for r in rs}), "cases": [r["name"] for r in rs],
            "micro_batches": sorted({r["micro_batch"] for r in rs}), **fit,
            "per_token_ratio": fit["predicted"]["per_1k_tokens_s"]
            / fit["published"]["per_1k_tokens_s"],
            "fixed_difference_s": fit["predicted"]["fixed_s"] - fit["published"]["fixed_s"],
        })
    return sorted(out, key=lambda s: (s["scenario"], s["gpus"], s["sweep"]))


def print_sweeps(rows: list[dict[str, Any]], console: Any) -> None:
    """One line per sweep: the per-token ratio and the fixed parts, published and model."""
    if not rows:
        return
    from rich.table import Table

    t = Table(title="micro-batch sweeps: step time = fixed + per-token x tokens, model against "
                    "published")
    for col in ("scenario", "sets", "GPUs", "micro-batches", "per-token, model / published",
                "fixed, published", "fixed, model"):
        t.add_column(col, justify="left" if col in ("scenario", "sets") else "right")
    for s in rows:
        t.add_row(s["scenario"], "+".join(s["sets"]), f"{s['gpus']:,}",
                  ",".join(map(str, s["micro_batches"])), f"{s['per_token_ratio']:.2f}",
                  f"{1e3 * s['published']['fixed_s']:.0f} ms",
                  f"{1e3 * s['predicted']['fixed_s']:.0f} ms")
    console.print(t)
    console.print(f"  micro-batch sweeps: per-token time, model over published, median "
                  f"{statistics.median(s['per_token_ratio'] for s in rows):.2f} over {len(rows)} "
                  f"sweeps; fixed part, model minus published, median "
                  f"{1e3 * statistics.median(s['fixed_difference_s'] for s in rows):+.0f} ms",
                  highlight=False)
