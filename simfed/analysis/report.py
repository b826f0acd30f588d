"""Results as a person reads them: a table per scenario, where the time goes, and why one
algorithm beats another; plus deterministic JSON and trace files."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ..convergence.profile import closed_note, unreached_note
from ..spec.paths import write_text_atomic
from ..spec.trace import Span, write_chrome, write_trace

PHASE_ORDER = ("forward", "backward", "optimizer", "aggregation", "other")


def fmt_bytes(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_s(t: float) -> str:
    if t >= 100:
        return f"{t:,.0f} s"
    if t >= 1:
        return f"{t:.2f} s"
    return f"{t * 1e3:.0f} ms" if t >= 1e-3 else f"{t * 1e6:.0f} us"


def results_table(out: dict[str, Any]) -> Table:
    algs = out["algorithms"]
    t = Table(title=f"{out['scenario']}: {out['model']['name']} on {out['cluster']['world']} x "
                    f"{out['cluster']['gpu']} ({out['cluster']['nodes']} nodes)",
              show_lines=False, header_style="bold")
    t.add_column("", style="bold")
    for a in algs:
        t.add_column(a["label"], justify="right")

    def row(name: str, fn) -> None:
        t.add_row(name, *[fn(a) for a in algs])

    row("plan (groups x repl x shard)",
        lambda a: f"{a['plan']['groups']} x {a['plan']['replicate']} x {a['plan']['shard']}")
    row("models / seqs per step per model",
        lambda a: f"{a['models']} / {a['global_batch_sequences']}")
    row("step time", lambda a: fmt_s(a["step_time_s"]))
    row(f"speedup vs {algs[0]['label']}", lambda a: f"{a['speedup']:.2f}x")
    row("tokens/s (cluster)", lambda a: f"{a['tokens_per_s']:,.0f}")
    row("tokens/s per GPU", lambda a: f"{a['tokens_per_s_per_gpu']:,.0f}")
    row("samples/s", lambda a: f"{a['samples_per_s']:,.1f}")
    row("MFU", lambda a: f"{100 * a['mfu']:.1f}%")
    for p in PHASE_ORDER:
        row(f"  {p}", lambda a, p=p: fmt_s(a["phases_s"][p]))
    row("  aggregation per event",
        lambda a: fmt_s(a["aggregation_per_event_s"]) if a["aggregations"] else "-")
    row("aggregations", lambda a: str(a["aggregations"]) if a["aggregations"] else "-")
    row("GPU compute per step", lambda a: fmt_s(a["compute_s"]))
    row("exposed communication", lambda a: fmt_s(a["exposed_comm_s"]))
    row("host debug checks per step",
        lambda a: fmt_s(a["debug_checks_s"]) if a["debug_checks_s"] else "-")
    for k, label in (("nvlink", "NVLink bytes/step"), ("inter_node", "inter-node bytes/step"),
                     ("leaf_uplink", "leaf-uplink bytes/step"), ("global", "global bytes/step")):
        if any(a["bytes_by_link"].get(k, 0) for a in algs):
            row(label, lambda a, k=k: fmt_bytes(a["bytes_by_link"][k]))
    row("peak memory / GPU",
        lambda a: f"{a['peak_memory_bytes'] / 2**30:.1f} GiB"
        + ("" if a["fits"] else " (DOES NOT FIT)"))
    row("epoch (data set) time", lambda a: fmt_s(a["epoch_time_s"]))
    conv = out.get("convergence")
    if conv:
        row("final eval perplexity [p10, p90]", lambda a: _ppl_band(a["convergence"]))
    if conv and conv.get("target_loss") is not None:
        row(f"steps to ppl {conv['target_perplexity']:.4g} [p10, p90]",
            lambda a: _count_band(a, "steps_to_target", "steps_to_target_interval"))
        row("tokens to target [p10, p90]",
            lambda a: _count_band(a, "tokens_to_target", "tokens_to_target_interval", True))
        row("time to target [p10, p90]", _time_band)
    return t


def _ppl_band(c: dict[str, Any]) -> str:
    lo, hi = (math.exp(v) for v in c["loss_final_interval"])
    return f"{c['perplexity_final']:.4g} [{lo:.4g}, {hi:.4g}]"


def _count_band(a: dict[str, Any], key: str, band: str, short: bool = False) -> str:
    v = a.get(key)
    if v is None:
        return "not reached"
    lo, hi = a.get(band) or [None, None]

    def f(x: int | None) -> str:
        if x is None:
            return "not reached"
        return fmt_count(x) if short else f"{x:,}"

    extra = " +FedAvg" if key == "steps_to_target" and a.get("fedavg_to_reach_target") else ""
    return f"{f(v)}{extra} [{f(lo)}, {f(hi)}]"


def fmt_count(n: float) -> str:
    """1234567 -> 1.23M (tokens)."""
    for div, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:.0f}"


def _time_band(a: dict[str, Any]) -> str:
    if a["time_to_target_s"] is None:
        return "not reached"
    lo, hi = a["time_to_target_interval_s"]
    return (f"{fmt_s(a['time_to_target_s'])} [{fmt_s(lo) if lo is not None else '-'}, "
            f"{fmt_s(hi) if hi is not None else 'not reached'}]")


def unsettled(algorithms: list[dict[str, Any]], first: str | None) -> list[str]:
    """The labels of the algorithms whose [p10, p90] time to target starts inside the band of
    the first one (`first`: its label): which of them gets there first is not settled by the
    convergence profile. An algorithm that does not fit its GPUs' memory is not among them."""
    algs = {a["label"]: a for a in algorithms if a.get("fits", True) or a["label"] == first}
    if first not in algs or not algs[first].get("time_to_target_interval_s"):
        return []
    hi = algs[first]["time_to_target_interval_s"][1]
    hi = math.inf if hi is None else hi
    return [label for label, a in algs.items() if label != first
            and (a.get("time_to_target_interval_s") or [None])[0] is not None
            and a["time_to_target_interval_s"][0] <= hi]


def _close_to(out: dict[str, Any], first: str | None) -> str:
    close = unsettled(out["algorithms"], first)
    unfit = [a["label"] for a in out["algorithms"] if not a.get("fits", True)]
    return ((f"; {', '.join(close)} within its p10-p90 band (not settled)" if close else "")
            + (f"; {', '.join(unfit)} {'does' if len(unfit) == 1 else 'do'} not fit in memory, "
               "so not ranked" if unfit else ""))


def convergence_lines(out: dict[str, Any]) -> list[str]:
    """Which algorithm reaches the target first, and every extrapolation of the profile."""
    conv = out.get("convergence")
    if not conv:
        return []
    lines = []
    if conv.get("target_loss") is not None:
        first = conv["first_to_target"]
        lines.append(f"time to eval perplexity {conv['target_perplexity']:.4g}: "
                     + (f"{first} reaches it first" if first else "no algorithm reaches it "
                        "within the run's steps") + _close_to(out, first))
        for a in out["algorithms"]:
            if a.get("fedavg_to_reach_target"):
                lines.append(f"{a['label']}: its groups' mean reaches the target at step "
                             f"{a['steps_to_target']}, between FedAvg rounds: one extra FedAvg "
                             f"({fmt_s(a['aggregation_per_event_s'])}) makes that model")
            lo, hi = a.get("steps_to_target_interval") or [None, None]
            if (a.get("aggregate_every") and lo is not None and lo == hi
                    and a.get("steps_to_target") is not None):
                lines.append(f"{a['label']}: the band collapses to one step ({lo}): every "
                             "draw reaches the target at the same step")
    checks = [c for c in conv.get("checks") or [] if c.get("median_abs_error") is not None]
    seen = [c for c in checks if c.get("seen")]
    if seen:  # development data: one line, the held-out checks are the claim
        lines.append("development checks (their runs seen before the model was fixed), median "
                     "|steps error|: " + ", ".join(f"{c['what']} {c['median_abs_error']:.0%}"
                                                   for c in seen))
    for c in checks:
        if not c.get("seen"):
            lines.append(f"how sure (time to target): held out {c['what']} (fit {c['fit']}, "
                         f"check {c['check']}): median |steps error| "
                         f"{c['median_abs_error']:.0%}, worst {c['worst_abs_error']:.0%}, "
                         f"{c['inside_band']:.0%} inside [p10, p90]{closed_note(c)}"
                         f"{unreached_note(c)}")
    if conv.get("on_bound"):
        lines.append("convergence profile: on a bound of their range (not identified): "
                     + ", ".join(conv["on_bound"]))
    for e in conv.get("data_constants") or []:
        lines.append(f"convergence data constant from the scenario: {e}")
    for e in conv["extrapolation"]:
        lines.append(f"convergence EXTRAPOLATION: {e}")
    return lines


def explain(out: dict[str, Any]) -> list[str]:
    """One line per algorithm on where its step time goes, and what a speedup comes from."""
    lines = []
    algs = out["algorithms"]
    base = algs[0]
    for a in algs:
        step = a["step_time_s"]
        host = a["debug_checks_s"]
        gpu_bound = a["compute_s"] + a["exposed_comm_s"]
        parts = [f"compute {100 * a['compute_s'] / step:.0f}%",
                 f"exposed comm {100 * a['exposed_comm_s'] / step:.0f}%"]
        if a["aggregations"]:
            parts.append(f"FedAvg {100 * a['phases_s']['aggregation'] / step:.0f}%")
        if host > gpu_bound:
            parts.append(f"HOST-BOUND: {fmt_s(host)} of debug checks per step")
        line = f"{a['label']}: {fmt_s(step)}/step = " + ", ".join(parts)
        if a is not base:
            diffs = {p: base["phases_s"][p] - a["phases_s"][p] for p in PHASE_ORDER}
            saved = base["step_time_s"] - step
            if saved > 0:
                top = sorted(diffs.items(), key=lambda kv: -kv[1])[:2]
                line += f"; {a['speedup']:.2f}x vs {base['label']}: saves " + ", ".join(
                    f"{fmt_s(v)} in {p}" for p, v in top if v > 0)
        lines.append(line)
    return lines


def print_report(out: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    console.print(results_table(out))
    for line in explain(out) + convergence_lines(out):
        console.print("  " + line, highlight=False, markup=False)  # "[p10, p90]" is text


def dumps(out: dict[str, Any]) -> str:
    return json.dumps(out, indent=2, sort_keys=True, allow_nan=False) + "\n"  # strict JSON


def write_json(path: str | Path, out: dict[str, Any]) -> Path:
    """Atomic write: a crash never leaves a half-written file in place of a good one."""
    return write_text_atomic(path, dumps(out))


def write_traces(directory: str | Path, out: dict[str, Any],
                 spans: dict[str, list[Span]]) -> list[Path]:
    directory = Path(directory)
    written = []
    for label, sp in spans.items():
        alg = next(a for a in out["algorithms"] if a["label"] == label or a["name"] == label)
        meta = {"source": "simfed", "scenario": out["scenario"], "algorithm": alg["name"],
                "label": alg["label"], "world_size": out["cluster"]["world"],
                "note": "one rank per actor (class of identical ranks); attrs.ranks = class size"}
        stem = alg["label"].lower().replace("+", "_").replace(" ", "_")
        written.append(write_trace(directory / f"{stem}.jsonl", meta, sp))
        written.append(write_chrome(directory / f"{stem}.trace.json", sp, meta,
                                    process_name=alg["label"]))
    return written
