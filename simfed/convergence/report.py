"""The convergence study in tables (markdown), from its files:

    python -m simfed.convergence.report results/convergence/*.json [--holdout]

Per study: the final evaluation loss of every configuration (mean and spread over seeds); the
paper's claim (FL+FSDP with 128 groups against FSDP on the same 512 sequences per step, after
the same tokens) under the paper's recipe and with each method's best learning rate of the sweep;
with --holdout, the held-out check of the fitted model and the critical-batch fit."""

from __future__ import annotations

import argparse
import math
import statistics
from collections import defaultdict
from typing import Any

from ..spec import SpecError
from ..spec.study import is_size_study
from .fit import critical_batch, holdout, read_study


def _stats(xs: list[float]) -> str:
    if len(xs) == 1:
        return f"{xs[0]:.3f}"
    return f"{statistics.fmean(xs):.3f} ± {statistics.stdev(xs):.3f}"


def finals(study: dict[str, Any]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = defaultdict(list)
    for r in study["runs"]:
        out[r["key"]].append(r["eval_loss"][-1])
    return out


def grid_table(study: dict[str, Any]) -> list[str]:
    f = finals(study)
    seeds = sorted({r["seed"] for r in study["runs"]})
    lines = [f"### {study['experiment']}: {study['what']}", "",
             f"Seeds {', '.join(map(str, seeds))}; {study['data']['describe']}; untrained eval "
             f"loss {statistics.fmean(r['eval_loss'][0] for r in study['runs']):.3f} nats.", "",
             "| run (algorithm / groups or nodes / K / lr) | seqs/step/model | groups | final "
             "eval loss (nats) | seeds |", "|---|---|---|---|---|"]
    seen = set()
    for r in study["runs"]:
        if r["key"] in seen:
            continue
        seen.add(r["key"])
        lines.append(f"| {r['key']} | {r['batch_per_model']} | {r['groups']} | "
                     f"{_stats(f[r['key']])} | {len(f[r['key']])} |")
    return lines


def claim_table(study: dict[str, Any]) -> list[str]:
    """FSDP at 128 nodes (512 sequences per step) against FL+FSDP 128 x 4, K = 8, per lr."""
    f = finals(study)
    lrs = sorted({r["lr"] for r in study["runs"]
                  if r["key"].startswith(("fsdp/n128/", "fl_fsdp/n128/k8/"))})
    rows = []
    best: dict[str, tuple[float, float]] = {}
    for lr in lrs:
        fs, fl = f.get(f"fsdp/n128/k0/lr{lr:g}"), f.get(f"fl_fsdp/n128/k8/lr{lr:g}")
        if not fs or not fl:
            continue
        rows.append(f"| {lr:g} | {_stats(fs)} | {_stats(fl)} | "
                    f"{statistics.fmean(fl) - statistics.fmean(fs):+.3f} |")
        for name, v in (("fsdp", fs), ("fl", fl)):
            m = statistics.fmean(v)
            if name not in best or m < best[name][1]:
                best[name] = (lr, m)
    if not rows:
        return []
    out = [f"#### {study['experiment']}: FSDP (1 model x 512 sequences) vs FL+FSDP (128 x 4, "
           "K = 8), 64 steps, same tokens", "",
           "| lr | FSDP final eval loss | FL+FSDP final eval loss | FL - FSDP |",
           "|---|---|---|---|", *rows]
    if "fsdp" in best and "fl" in best:
        (lf, mf), (ll, ml) = best["fsdp"], best["fl"]
        out += ["", f"Each method at its best lr of the sweep: FSDP {mf:.3f} (lr {lf:g}), "
                    f"FL+FSDP {ml:.3f} (lr {ll:g}): FL - FSDP {ml - mf:+.3f} nats "
                    f"(perplexity ratio {math.exp(ml - mf):.3f})."]
    return out


def noise_table(study: dict[str, Any]) -> list[str]:
    """Gradient noise scale B_simple (tokens) against eval loss, from the FSDP batch sweep: at
    each evaluation step, the median over batch sizes and seeds."""
    by_step: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for r in study["runs"]:
        for n in r.get("noise", []):
            if n.get("b_simple_tokens") is not None:  # undefined where |G|^2 <= 0
                by_step[int(n["step"])].append((n["eval_loss"], n["b_simple_tokens"]))
    if not by_step:
        return []
    out = [f"#### {study['experiment']}: gradient noise scale (two-batch estimator, chunks of 4 "
           "sequences)", "", "| step | eval loss | B_simple (tokens) | B_simple (sequences) | "
           "runs |", "|---|---|---|---|---|"]
    seq = study["runs"][0]["seq_len"]
    for step in sorted(by_step):
        pts = by_step[step]
        loss = statistics.median(p[0] for p in pts)
        b = statistics.median(p[1] for p in pts)
        out.append(f"| {step} | {loss:.3f} | {b:,.0f} | {b / seq:,.1f} | {len(pts)} |")
    return out


def size_study(studies: list[dict[str, Any]]) -> list[str]:
    """The size study across its files: per size, the central comparison at lr 3e-3 after 128
    steps (FSDP on 128 sequences, FL+FSDP 32 x 4 with K = 8, one group of 4; mean and spread
    over seeds) and the share of the gap from one group to FSDP that averaging recovers,
    (L_one - L_FL) / (L_one - L_FSDP), with a 90% t-interval over seeds; and FL - FSDP per lr."""
    rows = ["| size (non-embedding params) | FSDP 128 seqs | FL+FSDP 32 x 4, K = 8 | one group "
            "of 4 | one group - FL (90% interval) | FL - FSDP (90% interval) | averaging "
            "recovers | seeds |", "|---|---|---|---|---|---|---|---|"]
    lr_rows = ["| size | " + " | ".join(f"lr {lr:g}: FL - FSDP" for lr in LRS) + " |",
               "|---|" + "---|" * len(LRS)]
    for st in sorted(studies, key=lambda s: s["model"]["non_embedding_params"]):
        f = finals(st)
        n = st["model"]["non_embedding_params"]
        fs, fl, one = (f.get(k, []) for k in ("fsdp/n32/k0/lr0.003", "fl_fsdp/n32/k8/lr0.003",
                                                "fsdp/n1/k0/lr0.003"))
        if not (fs or fl or one):  # a file without the 128-step comparison (longer runs only)
            continue
        rec = _recovered(st)
        gain = _paired(st, "fsdp/n1/k0/lr0.003", "fl_fsdp/n32/k8/lr0.003")
        gap = _paired(st, "fl_fsdp/n32/k8/lr0.003", "fsdp/n32/k0/lr0.003")
        rows.append(f"| {st['model']['name']} ({n / 1e6:.3g}M) | {_stats(fs) if fs else '-'} | "
                    f"{_stats(fl) if fl else '-'} | {_stats(one) if one else '-'} | {gain} | "
                    f"{gap} | {rec} | {min(len(fs), len(fl), len(one))} |")
    # the lr table merges the files of one size (an lr sweep's ends may sit in a file of their own)
    merged: dict[str, dict[str, list[float]]] = {}
    for st in sorted(studies, key=lambda s: s["model"]["non_embedding_params"]):
        for key, vals in finals(st).items():
            merged.setdefault(st["model"]["name"], {}).setdefault(key, []).extend(vals)
    for name, f in merged.items():
        cells = []
        for lr in LRS:
            a, b = f.get(f"fl_fsdp/n32/k8/lr{lr:g}"), f.get(f"fsdp/n32/k0/lr{lr:g}")
            cells.append(f"{statistics.fmean(a) - statistics.fmean(b):+.3f}" if a and b else "-")
        lr_rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return ["### The size study: what averaging recovers, by model size", "", *rows, "",
            "FL+FSDP (32 x 4, K = 8) minus FSDP (128 sequences), final eval loss after 128 "
            "steps (nats), mean over the seeds each has:", "", *lr_rows]


LRS = (3e-4, 1e-3, 3e-3, 1e-2)


def _paired(study: dict[str, Any], a: str, b: str) -> str:
    """Final loss of `a` minus `b`, paired by seed: mean and 90% t-interval."""
    d = [v[a] - v[b] for v in _finals_by_seed(study).values() if a in v and b in v]
    return _interval(d, "+.3f")


def _finals_by_seed(study: dict[str, Any]) -> dict[int, dict[str, float]]:
    by_seed: dict[int, dict[str, float]] = defaultdict(dict)
    for r in study["runs"]:
        by_seed[r["seed"]][r["key"]] = r["eval_loss"][-1]
    return by_seed


def _interval(vals: list[float], fmt: str) -> str:
    """Mean and 90% t-interval over seeds."""
    if not vals:
        return "-"
    m = statistics.fmean(vals)
    if len(vals) < 2:
        return f"{m:{fmt}} (one seed)"
    from scipy.stats import t

    half = t.ppf(0.95, len(vals) - 1) * statistics.stdev(vals) / math.sqrt(len(vals))
    return f"{m:{fmt}} [{m - half:{fmt}}, {m + half:{fmt}}]"


def _recovered(study: dict[str, Any]) -> str:
    keys = ("fsdp/n32/k0/lr0.003", "fl_fsdp/n32/k8/lr0.003", "fsdp/n1/k0/lr0.003")
    vals = [(d[keys[2]] - d[keys[1]]) / (d[keys[2]] - d[keys[0]])
            for d in _finals_by_seed(study).values()
            if all(k in d for k in keys) and abs(d[keys[2]] - d[keys[0]]) > 1e-3]
    return _interval(vals, ".2f")


def holdout_lines(study: dict[str, Any]) -> list[str]:
    try:
        h = holdout(study)
    except SpecError as exc:
        return [f"{study['experiment']}: not fitted ({exc})"]
    if h["median_abs_error"] is None:
        return [f"{study['experiment']}: no held-out point reaches a target"]
    c = critical_batch(study)
    out = [f"{study['experiment']}: fitted on {h['fit_runs']} runs (rms {h['fit_rms_error']:.4f} "
           f"nats); held out {h['check_runs']} runs, {h['points']} points at targets "
           f"{h['targets']}: median |steps-to-target error| {h['median_abs_error']:.1%}, worst "
           f"{h['worst_abs_error']:.1%}"]
    for t in c.get("targets", []):
        bc = t["b_crit_tokens"]
        out.append(f"  critical batch at loss {t['target_loss']}: S_min {t['s_min']:.1f} steps, "
                   f"E_min {t['e_min_tokens']:.0f} tokens, B_crit "
                   + (f"{bc:.0f}" if bc is not None else "-")
                   + f" tokens; measured B_simple {t['b_simple_tokens'] or float('nan'):.0f} "
                   "tokens")
    return out


def main(argv: list[str] | None = None) -> None:
    """The report, with the error contract of simfed's command lines: a damaged or missing
    study is one line and exit status 2; a fault of the report itself one line naming a log
    file with the traceback, exit status 3."""
    import sys

    from ..spec.messages import ending

    ap = argparse.ArgumentParser(prog="python -m simfed.convergence.report")
    ap.add_argument("studies", nargs="+")
    ap.add_argument("--holdout", action="store_true")
    args = ap.parse_args(argv)
    try:
        _report(args)
    except Exception as exc:  # SpecError, OSError; RecursionError and MemoryError included
        line, status = ending("simfed.convergence.report", exc,
                              sys.argv[1:] if argv is None else argv)
        print(line, file=sys.stderr)
        sys.exit(status)


def _report(args: argparse.Namespace) -> None:
    sizes = []
    for path in args.studies:
        study = read_study(path)
        if is_size_study(study):
            sizes.append(study)  # the size study: reported across its files below
        print("\n".join(grid_table(study)), end="\n\n")
        for extra in (claim_table(study), noise_table(study)):
            if extra:
                print("\n".join(extra), end="\n\n")
        if args.holdout and not is_size_study(study):
            print("\n".join(holdout_lines(study)), end="\n\n")
    if sizes:
        print("\n".join(size_study(sizes)), end="\n\n")
        if args.holdout:
            from .calibrate_scaling import fixed_params, floor_min, held_out_checks, study_runs
            from .profile import unreached_note

            # the point predictions only (no bootstrap band: `simfed calibrate --convergence`
            # reports the bands)
            for c in held_out_checks(study_runs(sizes), floor_min(sizes), draws=0,
                                     fixed=fixed_params(sizes)):
                how = "seen before the model was fixed" if c["seen"] else "held out"
                print(f"{how}, {c['what']} (fit {c['fit']}, check {c['check']}): "
                      f"{c['points']} points, median |steps-to-target error| "
                      + (f"{c['median_abs_error']:.1%}, worst {c['worst_abs_error']:.1%}"
                         if c["median_abs_error"] is not None else "-") + unreached_note(c))


if __name__ == "__main__":
    main()
