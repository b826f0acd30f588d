"""Fitting the convergence model to `realrun converge-study` measurements, the critical batch,
and the held-out check.

- `read_study(path)`: one study file (results/convergence/NAME.json) -> runs.
- `fit_profile(study)`: least squares (scipy) of the noise-limited progress model to every
  evaluation point of the fit runs (the paper's learning rate; the held-out configurations
  left out), with the parameters' covariance from the Jacobian; returns a profile (plain data)
  that a scenario's `convergence.profile` holds.
- `critical_batch(study)`: steps S and tokens E to a target loss at each batch size of the
  FSDP batch sweep, fitted to (S/S_min - 1)(E/E_min - 1) = 1, i.e. S = S_min + E_min / B
  (McCandlish et al. 2018, eq. 2.11), against the measured gradient noise scale B_simple.
- `holdout(study)`: fit without the held-out configurations, predict their steps to target.

The held-out split is fixed here, before any fit was looked at: FL+FSDP with G = 32 groups
(every K) and with K = 2 (every G), and FSDP at 16 and 64 sequences per step.
"""

from __future__ import annotations

import math
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from ..spec import SpecError
from .model import PARAMS, RunShape, loss_curves, loss_curves_many
from .runs import crossing

STUDY_SCHEMA = "realrun.convergence_study/1"
PROFILE_SCHEMA = "simfed.convergence_profile/1"
HELD_OUT_GROUPS, HELD_OUT_K, HELD_OUT_FSDP_BATCH = 32, 2, (16, 64)
TARGET_FRACTIONS = (0.25, 0.5, 0.75)  # of the drop from the untrained loss to the best final


def read_study(path: str | Path) -> dict[str, Any]:
    """One study file, checked (simfed.spec.study: every key known, numbers finite and in
    range, evaluation steps increasing from 0; one line naming the file and field otherwise)."""
    from ..spec.study import read_study_file

    data = read_study_file(path)
    data["path"] = str(path)
    return data


def shape_of(run: dict[str, Any]) -> RunShape:
    return RunShape(batch_tokens=run["batch_per_model"] * run["seq_len"], groups=run["groups"],
                    aggregate_every=run["aggregate_every"] or 0, steps=run["steps"],
                    warmup_steps=run["warmup_steps"], schedule=run["lr_schedule"])


def is_held_out(run: dict[str, Any]) -> bool:
    if run["algorithm"] == "fl_fsdp":
        return run["groups"] == HELD_OUT_GROUPS or run["aggregate_every"] == HELD_OUT_K
    return run["batch_per_model"] in HELD_OUT_FSDP_BATCH


def paper_runs(study: dict[str, Any]) -> list[dict[str, Any]]:
    lr = study["recipe"]["paper_lr"]
    return [r for r in study["runs"] if math.isclose(r["lr"], lr)]


def _x0(loss_init: float, floor_min: float, best: float) -> tuple[np.ndarray, np.ndarray,
                                                                  np.ndarray]:
    lo = np.array([-5.0, 0.05, math.log(1.0), 0.0, 0.0, math.log(1e-3), floor_min])
    hi = np.array([12.0, 4.0, math.log(1e9), 4.0, 1.0, math.log(1e3), best - 1e-3])
    x0 = np.array([math.log(20.0), 0.6, math.log(2000.0), 0.5, 0.5, 0.0,
                   floor_min + 0.5 * (best - floor_min)])
    return np.clip(x0, lo + 1e-6, hi - 1e-6), lo, hi


def bootstrap(runs: list[dict[str, Any]], loss_init: float, floor_min: float, n: int,
              seed: int = 0) -> list[list[float]]:
    """Parameter vectors refitted on `n` resamples of the runs (with replacement, by run): the
    spread of what the same kind of measurements would have given. Deterministic (seeded)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        pick = [runs[i] for i in rng.integers(0, len(runs), size=len(runs))]
        try:
            out.append([float(v) for v in fit_runs(pick, loss_init, floor_min)["x"]])
        except SpecError:  # too few points in this resample
            continue
    return out


def fit_runs(runs: list[dict[str, Any]], loss_init: float, floor_min: float
             ) -> dict[str, Any]:
    """Least squares over every evaluation point after step 0 of `runs`."""
    pts = sum(len(r["eval_steps"]) - 1 for r in runs)
    if pts < 3 * len(PARAMS):
        raise SpecError(f"convergence fit: {pts} evaluation points for {len(PARAMS)} "
                        f"parameters; need at least {3 * len(PARAMS)} (more runs or "
                        "--eval-every smaller)")
    run_shapes = [shape_of(r) for r in runs]
    shapes = list(dict.fromkeys(run_shapes))  # each distinct shape integrated once
    which = [shapes.index(s) for s in run_shapes]
    idx = [np.array(r["eval_steps"][1:]) for r in runs]
    meas = np.concatenate([np.array(r["eval_loss"][1:]) for r in runs])
    best = float(min(min(r["eval_loss"]) for r in runs))

    def predict(xs: np.ndarray) -> np.ndarray:  # (n, P) -> (n, points)
        curves = loss_curves_many(xs, loss_init, shapes)
        return np.concatenate([curves[w][:, i] for w, i in zip(which, idx, strict=True)],
                              axis=1)

    def resid(x: np.ndarray) -> np.ndarray:
        return predict(x[None, :])[0] - meas

    x0, lo, hi = _x0(loss_init, floor_min, best)

    def jac(x: np.ndarray) -> np.ndarray:
        """Forward differences, all parameters in one batched integration (the model is
        vectorised over parameter vectors); steps away from the nearer bound."""
        h = 1e-6 * np.maximum(1.0, np.abs(x))
        h = np.where(x + h > hi, -h, h)
        rows = predict(np.vstack([x, x + np.diag(h)]))
        return ((rows[1:] - rows[0]) / h[:, None]).T

    sol = least_squares(resid, x0, jac=jac, bounds=(lo, hi), x_scale="jac")
    r = sol.fun
    dof = max(1, len(r) - len(x0))
    s2 = float(r @ r) / dof
    jtj = sol.jac.T @ sol.jac
    cov = np.linalg.pinv(jtj) * s2
    return {"x": sol.x, "cov": cov, "residual_sd": math.sqrt(s2), "points": len(r),
            "rms": float(np.sqrt(np.mean(r**2)))}


def study_floor(study: dict[str, Any]) -> float:
    """The lowest loss the fit may put the floor at: the data's entropy where it is known."""
    return float(study["data"].get("entropy_floor_nats") or 0.0)


def loss_init_of(runs: list[dict[str, Any]]) -> float:
    return float(np.mean([r["eval_loss"][0] for r in runs]))


def fit_profile(study: dict[str, Any], *, hold_out: bool = True, draws: int = 0
                ) -> dict[str, Any]:
    """The profile a scenario's `convergence.profile` takes (plain data)."""
    runs = [r for r in paper_runs(study) if not (hold_out and is_held_out(r))]
    if not runs:
        raise SpecError(f"{study['path']}: no runs at the paper's learning rate to fit")
    loss_init = loss_init_of(runs)
    fit = fit_runs(runs, loss_init, study_floor(study))
    shapes = [shape_of(r) for r in runs]
    ks = [s.aggregate_every for s in shapes if s.groups > 1]
    first = runs[0]
    return {
        "schema": PROFILE_SCHEMA,
        "model": "noise_progress",
        "source": f"{study['path']} ({study['experiment']}: {study['what']}); "
                  f"{len(runs)} runs, {fit['points']} evaluation points"
                  + ("; held-out configurations excluded" if hold_out else ""),
        "loss_init": round(loss_init, 6),
        "params": dict(zip(PARAMS, (float(v) for v in fit["x"]), strict=True)),
        "covariance": [[float(v) for v in row] for row in fit["cov"]],
        "draws": bootstrap(runs, loss_init, study_floor(study), draws) if draws else [],
        "residual_sd": fit["residual_sd"],
        "rms_error": fit["rms"],
        "fitted_range": {
            "model": study["model"]["name"], "model_params": study["model"]["params"],
            "vocab": study["model"]["vocab"], "data": study["data"]["source"],
            "seq_len": first["seq_len"], "lr": first["lr"], "optimizer": first["optimizer"],
            "batch_tokens": [min(s.batch_tokens for s in shapes),
                             max(s.batch_tokens * s.groups for s in shapes)],
            "groups": [1, max(s.groups for s in shapes)],
            "aggregate_every": [min(ks), max(ks)] if ks else [1, 1],
            "steps": [min(s.steps for s in shapes), max(s.steps for s in shapes)],
        },
    }


def targets_for(runs: list[dict[str, Any]], loss_init: float) -> list[float]:
    best = min(r["eval_loss"][-1] for r in runs)
    return [loss_init - f * (loss_init - best) for f in TARGET_FRACTIONS]


def holdout(study: dict[str, Any]) -> dict[str, Any]:
    """Fit without the held-out configurations; predict their steps to each target."""
    runs = paper_runs(study)
    fit_set = [r for r in runs if not is_held_out(r)]
    check = [r for r in runs if is_held_out(r)]
    prof = fit_profile(study, hold_out=True)
    x = np.array([prof["params"][p] for p in PARAMS])
    targets = targets_for(fit_set, prof["loss_init"])
    rows = []
    for r in check:
        shape = shape_of(r)
        pred_curve = loss_curves(x, prof["loss_init"], shape)[0]
        for tgt in targets:
            meas = crossing(np.array(r["eval_steps"]), np.array(r["eval_loss"]), tgt)
            if not math.isfinite(meas):
                continue
            pred = crossing(np.arange(shape.steps + 1), pred_curve, tgt)
            pred_v = pred if math.isfinite(pred) else float(shape.steps)
            rows.append({"key": r["key"], "seed": r["seed"], "target_loss": round(tgt, 4),
                         "measured_steps": round(meas, 2),
                         "predicted_steps": round(pred_v, 2) if math.isfinite(pred) else None,
                         "error": pred_v / meas - 1})
    errs = [abs(row["error"]) for row in rows]
    return {
        "experiment": study["experiment"], "fit_runs": len(fit_set), "check_runs": len(check),
        "targets": [round(t, 4) for t in targets], "points": len(rows),
        "median_abs_error": median(errs) if errs else None,
        "worst_abs_error": max(errs) if errs else None, "rows": rows,
        "fit_rms_error": prof["rms_error"],
    }


def critical_batch(study: dict[str, Any], targets: list[float] | None = None
                   ) -> dict[str, Any]:
    """(S/S_min - 1)(E/E_min - 1) = 1 on the FSDP batch sweep, per target loss (default: 50%,
    80% and 100% of the drop that every batch size makes)."""
    runs = [r for r in paper_runs(study) if r["algorithm"] == "fsdp"]
    if len(runs) < 3:
        return {"note": "fewer than 3 batch sizes", "targets": []}
    if targets is None:
        loss_init = loss_init_of(runs)
        worst_best = max(r["eval_loss"][-1] for r in runs)  # every batch size reaches it
        targets = [loss_init - f * (loss_init - worst_best) for f in (0.5, 0.8)]
        targets.append(worst_best + 1e-4)
    out = []
    for tgt in targets:
        pts = []
        for r in runs:
            s = crossing(np.array(r["eval_steps"]), np.array(r["eval_loss"]), tgt)
            if math.isfinite(s) and s > 0:
                pts.append((r["batch_per_model"] * r["seq_len"], s, r["seed"]))
        if len(pts) < 3:
            continue
        b = np.array([p[0] for p in pts], float)
        s = np.array([p[1] for p in pts])
        a = np.vstack([np.ones_like(b), 1.0 / b]).T  # S = S_min + E_min / B
        (s_min, e_min), *_ = np.linalg.lstsq(a, s, rcond=None)
        noise = [n for r in runs for n in r.get("noise", [])
                 if n.get("b_simple_tokens") is not None]
        b_simple = None
        if noise:
            near = sorted(noise, key=lambda n: abs(n["eval_loss"] - tgt))[:4]
            b_simple = float(np.median([n["b_simple_tokens"] for n in near]))
        out.append({"target_loss": round(tgt, 4), "points": len(pts),
                    "s_min": float(s_min), "e_min_tokens": float(e_min),
                    "b_crit_tokens": float(e_min / s_min) if s_min > 0 else None,
                    "b_simple_tokens": b_simple,
                    "measured": [{"batch_tokens": int(p[0]), "steps": round(p[1], 2),
                                  "seed": p[2]} for p in pts]})
    return {"targets": out}
