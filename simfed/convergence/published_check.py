"""The scaling model against published convergence results (validation/convergence/): per pool
(one paper on one data set), the model is fitted on the pool's fit runs and predicts its check
runs, which were marked before any prediction (published.assign_split).

    python -m simfed.convergence.published_check [validation/convergence] [--json OUT]

What is predicted:
- a run with a loss curve (three or more points): the steps to the losses at 50%, 75% and 90%
  of its drop from its first to its last recorded point, at its own recorded steps
  (interpolated as the measurement is);
- a run with its final loss only: the length a run of the same recipe (schedule stretched,
  warm-up in proportion) needs to end at that loss, against its length: the tokens to target of
  that recipe.
Error = predicted / measured steps - 1.

Runs that diverged (`diverged`: a final loss over a nat above the best of the pool's runs of
the same size and token budget) are neither fitted nor predicted: the model has no instability.

What the model cannot take, and so is not predicted (counted in the report): runs with an outer
optimizer (DiLoCo's Nesterov step; the model has plain averaging only), without a peak learning
rate or a step count, with a warm start, or a schedule other than cosine/constant without its
published trace. Where a pool does not publish the batch, steps are taken as noise-free (the
noise scale's constants are not fitted); where it does not publish the vocabulary, the untrained
loss is taken as ln(50,257) (only the first steps depend on it)."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np

from ..spec.paths import write_text_atomic
from . import fitting, scaling
from .published import ConvergenceSource, load_published_convergence
from .published import Run as PubRun
from .runs import Run, Shape, crossing

DEFAULT_VOCAB = 50257
NOISE_FREE_BATCH = 1e12  # tokens: s = 1 at any noise scale the fit could reach
FOLDER = Path(__file__).resolve().parents[2] / "validation" / "convergence"
CURVE_FRACTIONS = (0.5, 0.75, 0.9)
# the FL term is not fitted on published runs (no averaged run is predicted)
FIXED = {"log_fl_kappa": 0.0}
NOISE_FIXED = {"log_noise_star": 0.0, "noise_loss_exponent": 0.0}
DIVERGED_NATS = 1.0
DIVERGED = "diverged (final loss over 1 nat above its cell's best; the model has no instability)"


def _loss(value: float, metric: str) -> float | None:
    if metric == "loss":
        return value
    if metric == "perplexity":
        return math.log(value)
    return None


def to_run(r: PubRun, src: ConvergenceSource) -> tuple[Run | None, str]:
    """A published run as the model sees it, or None and why not."""
    if r.replicas > 1 or r.outer_optimizer not in ("none", "average"):
        return None, "outer optimizer or replicas (not in the model)"
    if r.warm_start is not None:
        return None, "warm start"
    if r.lr is None:
        return None, "no peak learning rate"
    batch = r.batch_tokens or NOISE_FREE_BATCH
    steps = r.steps or (int(r.tokens / r.batch_tokens) if r.tokens and r.batch_tokens else None)
    if not steps:
        return None, "no step count"
    n = r.non_embedding_params or r.params
    vocab = src.data.vocab or DEFAULT_VOCAB
    knots: tuple[tuple[int, float], ...] = ()
    sched = r.schedule or "cosine"
    if r.lr_trace:
        knots = tuple((int(s), float(v)) for s, v in r.lr_trace)
    elif sched not in ("cosine", "constant"):
        return None, f"schedule {sched} without its trace"
    frac = r.final_lr_fraction
    if frac is None and r.final_lr is not None:
        frac = r.final_lr / r.lr
    shape = Shape(params=float(n), batch_tokens=float(batch), steps=int(steps), lr=float(r.lr),
                  warmup_steps=int(r.warmup_steps or 0), schedule=sched,
                  loss_init=math.log(vocab), final_lr_fraction=float(frac or 0.0),
                  lr_knots=knots)
    pts = []
    for step, value in r.eval:
        loss = _loss(value, r.eval_metric)
        if loss is None:
            return None, f"metric {r.eval_metric}"
        pts.append((int(steps if step is None else step), loss))
    pts = [p for p in pts if 0 < p[0] <= steps]
    if not pts:
        return None, "no evaluation point"
    return Run(key=r.name, shape=shape, eval_steps=(0, *(p[0] for p in pts)),
               eval_loss=(shape.loss_init, *(p[1] for p in pts)), source=src.pool,
               tags={"split": r.split, "batch_published": r.batch_tokens is not None,
                     "cell": (float(n), float(r.tokens or steps * batch))}), ""


def diverged(runs: list[Run]) -> set[str]:
    """Runs that diverged: a final loss more than DIVERGED_NATS above the best final loss of
    its cell (the pool's runs of the same model size and token budget). The model has no
    instability, so it neither fits nor predicts them. The rule reads measured losses only,
    fit and check alike; the Step Law grid's fit runs end either within 0.35 nats of their
    cell's best or 3.8 to 4.6 nats above it (a learning rate past the stable range)."""
    best: dict[tuple[float, float], float] = {}
    for r in runs:
        best[r.tags["cell"]] = min(best.get(r.tags["cell"], math.inf), r.final_loss)
    return {r.key for r in runs if r.final_loss > best[r.tags["cell"]] + DIVERGED_NATS}


def _stretch(shape: Shape, steps: int) -> Shape:
    frac = shape.warmup_steps / shape.steps
    return replace(shape, steps=int(steps), warmup_steps=round(frac * steps))


def steps_to_final(x: np.ndarray, run: Run, max_blocks: int) -> float:
    """The length a run of this recipe (stretched) needs to end at the run's final loss."""
    target = run.final_loss

    def final(steps: float) -> float:
        s = _stretch(run.shape, max(1, round(steps)))
        return float(scaling.loss_at(x, [s], [np.array([s.steps])], max_blocks)[0][0, 0])

    lo, hi = run.shape.steps / 30.0, run.shape.steps * 30.0
    if final(hi) > target:
        return math.inf
    if final(lo) <= target:
        return lo
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        if final(mid) > target:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1.001:
            break
    return math.sqrt(lo * hi)


def check_pool(pool: str, runs: list[Run], max_blocks: int = 256, fit_only: bool = False
               ) -> dict[str, Any]:
    """Fit on the pool's fit runs; predict its check runs (with fit_only: the fit set's own
    runs, in sample, so that the harness can be tried without looking at the check set)."""
    fit_set = [r for r in runs if r.tags["split"] == "fit"]
    check_set = [r for r in runs if r.tags["split"] == "check"]
    if fit_only:
        check_set = fit_set
    fixed = dict(FIXED)
    if not any(r.tags["batch_published"] for r in runs):
        fixed.update(NOISE_FIXED)
    out: dict[str, Any] = {"pool": pool, "fit_runs": len(fit_set), "check_runs": len(check_set),
                           "rows": []}
    if not fit_set or not check_set:
        out["note"] = "no fit or no check runs the model can take"
        return out
    f = fitting.fit(fit_set, fixed=fixed, max_blocks=max_blocks, starts=fitting.STARTS[:3])
    out.update({"fit_rms": f["rms"], "on_bound": f["on_bound"],
                "params": dict(zip(scaling.PARAMS, (float(v) for v in f["x"]), strict=True))})
    for r in check_set:
        at = np.array(r.eval_steps[1:], int)
        pred_curve = scaling.loss_at(f["x"], [r.shape], [at], max_blocks)[0][0]
        if len(at) >= 3:  # a curve: steps to losses along it
            meas_l = np.array(r.eval_loss[1:])
            first, last = meas_l[0], meas_l[-1]
            for frac in CURVE_FRACTIONS:
                tgt = first - frac * (first - last)
                meas = crossing(at, meas_l, tgt)
                pred = crossing(at, pred_curve, tgt)
                if not math.isfinite(meas) or meas <= at[0]:
                    continue
                err = (pred if math.isfinite(pred) else float(at[-1])) / meas - 1
                out["rows"].append({"run": r.key, "kind": "curve", "target_loss": tgt,
                                    "measured_steps": meas, "predicted_steps": pred,
                                    "error": err})
        else:
            pred = steps_to_final(f["x"], r, max_blocks)
            err = pred / r.shape.steps - 1 if math.isfinite(pred) else math.inf
            out["rows"].append({"run": r.key, "kind": "final", "target_loss": r.final_loss,
                                "measured_steps": r.shape.steps, "predicted_steps": pred,
                                "predicted_final_loss": float(pred_curve[-1]),
                                "error": err})
    errs = [abs(row["error"]) for row in out["rows"]]
    out["median_abs_error"] = median(errs) if errs else None
    out["points"] = len(errs)
    return out


def check_all(folder: Path = FOLDER, max_blocks: int = 256, fit_only: bool = False
              ) -> dict[str, Any]:
    sources = load_published_convergence(folder)
    by_pool: dict[str, list[Run]] = {}
    skipped: dict[str, int] = {}
    for src in sources:
        if src.kind != "runs":
            continue
        for r in src.runs or []:
            run, why = to_run(r, src)
            if run is None:
                skipped[why] = skipped.get(why, 0) + 1
                continue
            by_pool.setdefault(src.pool, []).append(run)
    for pool, rs in by_pool.items():
        gone = diverged(rs)
        if gone:
            skipped[DIVERGED] = skipped.get(DIVERGED, 0) + len(gone)
            by_pool[pool] = [r for r in rs if r.key not in gone]
    pools = [check_pool(p, rs, max_blocks, fit_only) for p, rs in sorted(by_pool.items())]
    errs = [abs(row["error"]) for p in pools for row in p["rows"]]
    finite = [e for e in errs if math.isfinite(e)]
    return {"pools": pools, "skipped": skipped, "points": len(errs),
            "median_abs_error": median(errs) if errs else None,
            "never_reached": len(errs) - len(finite), "fit_only": fit_only}


def lines(res: dict[str, Any]) -> list[str]:
    out = []
    for p in res["pools"]:
        if p.get("median_abs_error") is None:
            out.append(f"{p['pool']}: {p.get('note', 'nothing predicted')}")
            continue
        out.append(f"{p['pool']}: fitted on {p['fit_runs']} runs (rms {p['fit_rms']:.4f} nats), "
                   f"{p['check_runs']} check runs, {p['points']} points: median |steps-to-"
                   f"target error| {p['median_abs_error']:.1%}"
                   + (f"; on a bound: {', '.join(p['on_bound'])}" if p["on_bound"] else ""))
    if res["median_abs_error"] is not None:
        out.append(("IN SAMPLE (--fit-only): " if res.get("fit_only") else "")
                   + f"all pools: {res['points']} points, median |error| "
                   f"{res['median_abs_error']:.1%} ({res['never_reached']} never reached)")
    for why, n in sorted(res["skipped"].items()):
        out.append(f"not predicted: {n} runs ({why})")
    return out


def _json_safe(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_json_safe(x) for x in v]
    return v


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m simfed.convergence.published_check",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", default=str(FOLDER))
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--fit-only", action="store_true",
                    help="predict the fit runs themselves (in sample): try the harness without "
                         "looking at the check set")
    a = ap.parse_args(argv)
    res = check_all(Path(a.folder), fit_only=a.fit_only)
    for line in lines(res):
        print(line)
    if a.json:
        write_text_atomic(a.json, json.dumps(_json_safe(res), indent=1, allow_nan=False) + "\n")


if __name__ == "__main__":
    main()
