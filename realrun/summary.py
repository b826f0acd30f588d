"""A run's results: DIR/summary.json from every rank's record, and DIR/trace.json, the Chrome /
Perfetto view of all ranks' JSONL traces.

Conventions: a step's time is the job's wall time per step (`simfed.spec.wall_step_times`: from
the last rank's end of the previous step to the last rank's end of this one, so that steps add up
to the run's wall time also when federation groups run out of phase between FedAvg rounds; the
slowest rank's own step times are in `slowest_rank_step_times_s`);
`phases_s` is the mean per step over ranks and steps; losses are in nats, perplexity = e^loss;
train loss of a step is the mean over all ranks (per group: over the group's ranks); eval
perplexity pools every group's evaluation of the whole eval set (per group in `*_per_group`).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from statistics import fmean
from typing import Any

from simfed.spec import PHASES, Span, SpecError, read_trace, wall_step_times, write_chrome
from simfed.spec.paths import write_text_atomic


def _ppl(loss_nats: float) -> float:
    return math.exp(min(loss_nats, 700.0))


def summarize(records: list[dict[str, Any]], ctx: dict[str, Any]) -> dict[str, Any]:
    meta = ctx["meta"]
    plan = meta["plan"]
    world, steps = meta["world_size"], ctx["steps"]
    records = sorted(records, key=lambda r: r["rank"])
    groups: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[r["coords"][0]].append(r)

    slowest = [max(r["step_s"][s] for r in records) for s in range(steps)]
    step_times = wall_step_times(
        {s: (r["step_start_s"][s], r["step_start_s"][s] + r["step_s"][s]) for s in range(steps)}
        for r in records)
    step_time_s = fmean(step_times)
    tokens_per_step = world * ctx["micro_batch"] * ctx["seq_len"]
    phases = {ph: fmean(fmean(r["phase_s"][ph]) for r in records) for ph in PHASES}
    train_loss = [fmean(r["train_loss"][s] for r in records) for s in range(steps)]
    loss_per_group = [[fmean(r["train_loss"][s] for r in groups[g]) for s in range(steps)]
                      for g in sorted(groups)]

    def pooled(key: str, members: list[dict[str, Any]]) -> float:
        loss = sum(r[key][0] for r in members)
        tokens = sum(r[key][1] for r in members)
        return loss / tokens if tokens else float("nan")

    eval_loss = pooled("eval", records)
    eval_per_group = [pooled("eval", groups[g]) for g in sorted(groups)]
    untrained = pooled("eval_untrained", records)
    sha_per_group = [groups[g][0]["sha256"] for g in sorted(groups)]
    floor_bits = ctx["entropy_floor_bits"]

    return {
        "algorithm": ctx["algorithm"],
        "title": ctx["title"],
        "scenario": ctx["scenario"],
        "world_size": world,
        "plan": plan,
        "backend": meta["backend"],
        "device": meta["device"],
        "cores": meta["cores"],
        "threads": meta["threads"],
        "torch_version": meta["torch_version"],
        "debug_checks": meta["debug_checks"],
        "steps": steps,
        "seq_len": ctx["seq_len"],
        "micro_batch": ctx["micro_batch"],
        "tokens_per_step": tokens_per_step,
        "step_time_s": step_time_s,
        "step_time_s_after_first": fmean(step_times[1:]) if steps > 1 else step_time_s,
        "step_times_s": step_times,
        "slowest_rank_step_times_s": slowest,
        "tokens_per_s": tokens_per_step / step_time_s,
        "phases_s": phases,
        "train_loss": train_loss,
        "train_perplexity": [_ppl(x) for x in train_loss],
        "train_loss_per_group": loss_per_group,
        "eval_loss": eval_loss,
        "eval_perplexity": _ppl(eval_loss),
        "eval_perplexity_per_group": [_ppl(x) for x in eval_per_group],
        "eval_sequences": ctx["eval_sequences"],
        "untrained_eval_perplexity": _ppl(untrained),
        "entropy_floor_bits": floor_bits,
        "floor_perplexity": 2.0**floor_bits if floor_bits is not None else None,
        "vocab_perplexity": ctx["vocab"],
        "final_model_sha256": sha_per_group,
        "replicas_identical": all(len({r["sha256"] for r in groups[g]}) == 1 for g in groups),
        "groups_identical": len(set(sha_per_group)) == 1,
        "fedavg": None if ctx["aggregate_every"] is None else {
            "every": ctx["aggregate_every"],
            "steps": records[0]["fedavg_steps"],
            "dtype": meta["fedavg_dtype"],
            "nbytes_per_rank": ctx["fedavg_nbytes_per_rank"],
            "optimizer_state": "local to each group, never averaged",
        },
        "model": meta["model"],
        "sharding": meta["sharding"],
        "data": ctx["data"],
        "training": ctx["training"],
        "notes": _notes(meta),
    }


def _notes(meta: dict[str, Any]) -> list[str]:
    if meta["backend"] != "gloo":
        return []
    return ["gloo runs reduce_scatter as a full all-reduce of its input",
            "CPU collectives block the rank: communication never overlaps compute"]


def comm_per_step(spans: list[Span], steps: int, ranks: int) -> dict[str, dict[str, float]]:
    """Training-step collectives per mesh dimension: calls, bytes and time per rank per step."""
    acc: dict[str, dict[str, float]] = defaultdict(lambda: {"calls": 0.0, "nbytes": 0.0,
                                                           "time_s": 0.0})
    for s in spans:
        if s.cat == "comm" and 0 <= s.step < steps:
            a = acc[s.group or "other"]
            a["calls"] += 1
            a["nbytes"] += s.nbytes
            a["time_s"] += s.dur_s
    norm = max(1, steps * ranks)
    return {k: {m: v / norm for m, v in a.items()} for k, a in sorted(acc.items())}


def write_outputs(out: Path, records: list[dict[str, Any]], ctx: dict[str, Any]
                  ) -> dict[str, Any]:
    """summary.json and trace.json (rank 0, after every rank closed its trace)."""
    summary = summarize(records, ctx)
    spans: list[Span] = []
    merged = []
    for r in range(summary["world_size"]):
        path = out / f"trace_rank{r}.jsonl"
        try:
            _, rank_spans = read_trace(path)
        except SpecError:
            continue  # not on a shared file system: merge what this node sees
        spans.extend(rank_spans)
        merged.append(r)
    summary["comm_per_step"] = comm_per_step(spans, summary["steps"], max(1, len(merged)))
    summary["trace_ranks_merged"] = merged
    write_chrome(out / "trace.json", spans, meta={**ctx["meta"], "ranks": merged},
                 process_name=summary["algorithm"])
    write_text_atomic(out / "summary.json", json.dumps(summary, indent=1, sort_keys=False) + "\n")
    return summary
