"""Convergence figures: predicted evaluation perplexity against simulated wall-clock time for a
scenario's algorithms, with the p10..p90 band (the paper's kind of figure); and the measured
final evaluation loss of the convergence study's FL grid against the number of groups."""

from __future__ import annotations

import math
import textwrap
from itertools import accumulate
from typing import Any

from matplotlib.figure import Figure

from ..spec import SpecError
from .common import algorithm_color, new_figure

MARKERS = ("o", "s", "^", "D", "v", "P")


def plot_time_to_target(out: dict[str, Any]) -> Figure:
    """`simfed run` result of a scenario with a `convergence:` section."""
    conv = out.get("convergence")
    if not conv:
        raise SpecError("plot: the result has no convergence prediction (the scenario needs a "
                        "convergence: section)")
    fig = new_figure(8.0, 4.8)
    ax = fig.add_subplot()
    for i, a in enumerate(out["algorithms"]):
        c = a["convergence"]
        times = [0.0, *accumulate(a["step_times_s"])]
        n = min(len(times), len(c["loss_curve"]))
        t = times[:n]
        color = algorithm_color(a["name"], i)
        ax.plot(t, [math.exp(v) for v in c["loss_curve"][:n]], color=color, label=a["label"])
        ax.fill_between(t, [math.exp(v) for v in c["loss_curve_p10"][:n]],
                        [math.exp(v) for v in c["loss_curve_p90"][:n]], color=color, alpha=0.18,
                        linewidth=0)
        if a.get("time_to_target_s") is not None:
            # the marker is the time to target (the rule in the result's convergence.rule):
            # where the curve crosses the target, or after the one extra FedAvg a federated
            # run pays off a round (a dashed segment from the crossing)
            tt, ppl = a["time_to_target_s"], conv["target_perplexity"]
            if a.get("fedavg_to_reach_target"):
                cross = times[a["steps_to_target"]] if a["steps_to_target"] < len(times) else tt
                ax.plot([cross, tt], [ppl, ppl], color=color, linestyle="--", linewidth=1.2)
            ax.plot([tt], [ppl], marker=MARKERS[i % len(MARKERS)], color=color,
                    markersize=8 - 1.5 * (i % 3), markeredgecolor="black", markeredgewidth=0.6,
                    linestyle="none", zorder=5)
    if conv.get("target_perplexity"):
        ax.axhline(conv["target_perplexity"], color="#555555", linestyle=":", linewidth=1,
                   label=f"target {conv['target_perplexity']:.4g}")
    ax.set_yscale("log")
    ax.set_xlabel("simulated wall-clock time (s)")
    ax.set_ylabel("predicted eval perplexity")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    title = f"{out['scenario']}: predicted eval perplexity vs time (band p10..p90)"
    if conv["extrapolation"]:
        more = len(conv["extrapolation"]) - 1
        title += "\n" + textwrap.shorten(f"EXTRAPOLATED: {conv['extrapolation'][0]}", 100) + (
            f" (+{more} more)" if more else "")
    ax.set_title(title, fontsize=9)
    ax.text(0.99, 0.99, "markers: time to target" + (
        "; dashed: the extra FedAvg a federated run pays off a round"
        if any(a.get("fedavg_to_reach_target") for a in out["algorithms"]) else ""),
        transform=ax.transAxes, ha="right", va="top", fontsize=7, color="#444444")
    return fig


def plot_fl_grid(study: dict[str, Any]) -> Figure:
    """Measured final evaluation loss (mean over seeds) against the number of groups: FL+FSDP
    per K at a fixed per-group batch, FSDP on the union of the groups' batches."""
    lr = study["recipe"]["paper_lr"]
    runs = [r for r in study["runs"] if math.isclose(r["lr"], lr)]
    per_group = study["ranks_per_group"] * study["micro_batch"]
    fig = new_figure(7.5, 4.5)
    ax = fig.add_subplot()

    def mean_final(rs: list[dict[str, Any]]) -> float:
        return sum(r["eval_loss"][-1] for r in rs) / len(rs)

    sync: dict[int, list] = {}
    for r in runs:
        if r["algorithm"] == "fsdp" and r["batch_per_model"] % per_group == 0:
            sync.setdefault(r["batch_per_model"] // per_group, []).append(r)
    gs = sorted(sync)
    ax.plot(gs, [mean_final(sync[g]) for g in gs], color="#4c72b0", marker="o",
            label=f"FSDP, {per_group} x G sequences per step")
    ks = sorted({r["aggregate_every"] for r in runs if r["algorithm"] == "fl_fsdp"})
    for j, k in enumerate(ks):
        by_g: dict[int, list] = {}
        for r in runs:
            if r["algorithm"] == "fl_fsdp" and r["aggregate_every"] == k:
                by_g.setdefault(r["groups"], []).append(r)
        xs = sorted(by_g)
        ax.plot(xs, [mean_final(by_g[g]) for g in xs], marker="^", linestyle="--",
                color=("#2a9d5c", "#67c08b", "#a3d9b5", "#c44e52", "#8172b3")[j % 5],
                label=f"FL+FSDP, K = {k}, {per_group} sequences per group")
    if 1 in sync:
        ax.axhline(mean_final(sync[1]), color="#8c8c8c", linestyle=":", linewidth=1,
                   label="one group alone")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("federation groups G (FSDP: batch in units of one group's)")
    ax.set_ylabel(f"eval loss after {runs[0]['steps']} steps (nats)")
    seeds = len({r["seed"] for r in runs})
    ax.set_title(f"{study['experiment']}: {study['model']['name']}, {study['data']['source']}"
                 f", lr {lr:g} ({seeds} seed{'s' if seeds > 1 else ''})", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return fig


# line styles of the runs longer than 128 steps, shortest first
LONG_STYLES = (("--", "dashed"), (":", "dotted"), ("-.", "dash-dot"),
               ((0, (8, 2, 1, 2, 1, 2)), "dash-dot-dot"), ((0, (1, 4)), "loosely dotted"))

# per panel, the first learning rate at which the size has the central comparison (lr 3e-3 at
# the sizes with the full grid, the paper's 3e-4 at the largest), and its three shapes; FL+FSDP
# is 32 groups x 4 where the host could run them, else 8 x 4
SIZE_LRS = ("0.003", "0.0003")
SIZE_SHAPES = ((("fsdp/n32/k0",), "FSDP, 128 sequences"),
               (("fl_fsdp/n32/k8", "fl_fsdp/n8/k8"), "FL+FSDP, {g} groups x 4, K = 8"),
               (("fsdp/n1/k0",), "one group of 4"))


def _size_panel(runs: list[dict[str, Any]]) -> tuple[str, list[tuple[str, str]]]:
    """(lr, [(key prefix, label)]) of a size's central comparison."""
    keys = {r["key"].split("/s")[0] for r in runs}
    for lr in SIZE_LRS:
        found = []
        for prefixes, label in SIZE_SHAPES:
            hit = next((p for p in prefixes if f"{p}/lr{lr}" in keys), None)
            if hit:
                found.append((f"{hit}/lr{lr}", label.format(g=hit.split("/n")[1].split("/")[0])))
        if found:
            return lr, found
    return SIZE_LRS[0], []


def plot_size_study(studies: list[dict[str, Any]]) -> Figure:
    """The size study's central comparison, one panel per model size (every file of that
    model together): measured eval loss against steps for FSDP, FL+FSDP and one group alone
    at lr 3e-3, or at the paper's 3e-4 where a size has no 3e-3 runs (every seed; 128-step runs
    solid, longer ones dashed and dotted), with the data's unigram loss, where the small
    models stall."""
    by_model: dict[str, list[dict[str, Any]]] = {}
    for st in sorted(studies, key=lambda st: st["model"].get("non_embedding_params") or 0):
        by_model.setdefault(st["model"]["name"], []).append(st)
    fig = new_figure(4.0 * len(by_model), 4.0)
    axes = fig.subplots(1, len(by_model), sharey=True, squeeze=False)[0]
    colors = ("#4c72b0", "#2a9d5c", "#8c8c8c")
    lengths = sorted({int(r["steps"]) for st in studies for r in st["runs"]} - {128})
    styles = dict(zip(lengths, LONG_STYLES, strict=False))  # (style, name) per longer length
    for ax, group in zip(axes, by_model.values(), strict=True):
        runs = [r for st in group for r in st["runs"]]
        lr, shapes = _size_panel(runs)
        for (key, label), color in zip(shapes, colors, strict=False):
            first = True
            for r in runs:
                if r["key"].split("/s")[0] != key:
                    continue
                ax.plot(r["eval_steps"], r["eval_loss"], color=color, linewidth=1.0,
                        alpha=0.9 if r["seed"] == 0 else 0.45,
                        linestyle=styles.get(int(r["steps"]), ("-", ""))[0],
                        label=label if first else None)
                first = False
        st = group[0]
        u = st["data"].get("unigram_loss_nats")
        if u:
            ax.axhline(u, color="#c44e52", linestyle=":", linewidth=1, label="unigram loss")
        n = st["model"].get("non_embedding_params") or st["model"]["params"]
        ax.set_title(f"{st['model']['name']} ({n / 1e6:.3g}M non-embedding), lr {float(lr):g}",
                     fontsize=9)
        ax.set_xscale("symlog", linthresh=16)
        ax.set_xlim(left=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    longer = ", ".join(f"{name}: {k}" for k, (_, name) in styles.items())
    fig.supxlabel("optimizer steps (solid: 128" + (f"; {longer}" if longer else "") + ")",
                  fontsize=9)
    axes[0].set_ylabel("eval loss (nats)")
    fig.suptitle("size study: FedAvg of AdamW groups against one large batch and one group "
                 "(every seed; lr 3e-3, or the paper's 3e-4 at the sizes without 3e-3 runs)",
                 fontsize=10)
    return fig
