"""Fitting the scaling model (scaling.py) to measured runs, its uncertainty, and the held-out
checks of the size study (split.py): across model size and past the fitted horizon.

- `fit(runs)`: scipy least squares on every evaluation point after step 0, the covariance from
  the Jacobian, and which parameters sit on a bound of their physical range (reported, never
  shipped silently).
- `bootstrap(runs, n)`: refits on runs resampled with replacement (by configuration, every seed
  of a configuration together), deterministic.
- `progress_factors(x, runs)`, `progress_sd`: how much faster or slower than the model each
  run learns (a factor on its progress), and their spread: the band's run-to-run part.
- `check(fit_runs, check_runs)`: fit on one set, predict the other: steps-to-target errors and
  how often the measured steps fall inside the predicted [p10, p90].
"""

from __future__ import annotations

import functools
import math
import multiprocessing
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from statistics import median
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from ..spec import SpecError
from . import scaling
from .runs import Run, Shape, crossing

BAND = (0.1, 0.9)
ON_BOUND = 1e-3  # a parameter within this fraction of its range from a bound is "on" it


def _prepare(runs: list[Run]) -> tuple[list[Shape], list[np.ndarray], list[int],
                                        list[np.ndarray], np.ndarray]:
    """Distinct shapes, the steps each is evaluated at (every run's of that shape), and for
    every run its shape and the positions of its evaluation points among those steps."""
    shapes = list(dict.fromkeys(r.shape for r in runs))
    which = [shapes.index(r.shape) for r in runs]
    at = [np.unique(np.concatenate([np.array(r.eval_steps[1:], int) for r, w in
                                    zip(runs, which, strict=True) if w == j]))
          for j in range(len(shapes))]
    idx = [np.searchsorted(at[w], np.array(r.eval_steps[1:], int))
           for r, w in zip(runs, which, strict=True)]
    meas = np.concatenate([np.array(r.eval_loss[1:]) for r in runs])
    return shapes, at, which, idx, meas


# starting points besides the box's own (a multiplicative nudge of one parameter each, in the
# log-parametrised ones): the loss surface has local minima along the learning-rate scale and
# the progress scale
STARTS = ({}, {"log_lr_star": 1.2}, {"log_lr_star": -1.2},
          {"log_progress_scale": 2.3, "exponent": 0.5})


# parameters of the scaling model held at these values unless a fit names them in `extra`
OFF_UNLESS_ASKED = {"lr_damage": 0.0}


def fit(runs: list[Run], floor_min: float = 0.0, fixed: dict[str, float] | None = None,
        x0: np.ndarray | None = None, max_blocks: int = 128,
        starts: tuple[dict[str, float], ...] = STARTS, max_nfev: int = 300,
        extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """Least squares of the scaling model over every evaluation point after step 0 of `runs`,
    from the best of `starts` (or from `x0`); `fixed` pins parameters by name (they get zero
    variance), and so does OFF_UNLESS_ASKED those not in `extra`. Runs longer than `max_blocks`
    steps are integrated in that many blocks (scaling.loss_at)."""
    fixed = {**{k: v for k, v in OFF_UNLESS_ASKED.items() if k not in extra}, **(fixed or {})}
    unknown = [k for k in fixed if k not in scaling.IDX]
    if unknown:
        raise SpecError(f"convergence fit: unknown parameter {unknown[0]!r}; expected one of "
                        f"{', '.join(scaling.PARAMS)}")
    free = np.array([p not in fixed for p in scaling.PARAMS])
    pts = sum(len(r.eval_steps) - 1 for r in runs)
    if pts < 3 * int(free.sum()):
        raise SpecError(f"convergence fit: {pts} evaluation points for {int(free.sum())} "
                        f"parameters; need at least {3 * int(free.sum())}")
    shapes, at, which, idx, meas = _prepare(runs)
    best = float(min(min(r.eval_loss) for r in runs))
    bnd = scaling.bounds(floor_min, best, float(np.mean([r.eval_loss[0] for r in runs])))
    base = bnd.x0.copy()
    for k, v in fixed.items():
        base[scaling.IDX[k]] = v

    def full(xf: np.ndarray) -> np.ndarray:  # (n, free) -> (n, P)
        xs = np.repeat(base[None, :], xf.shape[0], axis=0)
        xs[:, free] = xf
        return xs

    def predict(xf: np.ndarray) -> np.ndarray:  # (n, free) -> (n, points)
        curves = scaling.loss_at(full(xf), shapes, at, max_blocks)
        return np.concatenate([curves[w][:, i] for w, i in zip(which, idx, strict=True)],
                              axis=1)

    lo, hi = bnd.lo[free], bnd.hi[free]

    def resid(xf: np.ndarray) -> np.ndarray:
        return predict(xf[None, :])[0] - meas

    def jac(xf: np.ndarray) -> np.ndarray:
        h = 1e-6 * np.maximum(1.0, np.abs(xf))
        h = np.where(xf + h > hi, -h, h)
        rows = predict(np.vstack([xf, xf + np.diag(h)]))
        return ((rows[1:] - rows[0]) / h[:, None]).T

    inits = []
    if x0 is not None:
        inits.append(np.clip(np.asarray(x0, float)[free], lo + 1e-9, hi - 1e-9))
    else:
        for nudge in starts:
            x = bnd.x0.copy()
            for k, v in nudge.items():
                x[scaling.IDX[k]] += v
            inits.append(np.clip(x[free], lo + 1e-9, hi - 1e-9))
    sol = None
    for start in inits:
        trial = least_squares(resid, start, jac=jac, bounds=(lo, hi), x_scale="jac",
                              max_nfev=max_nfev)
        if sol is None or trial.cost < sol.cost:
            sol = trial
    r = sol.fun
    dof = max(1, len(r) - int(free.sum()))
    s2 = float(r @ r) / dof
    cov_f = np.linalg.pinv(sol.jac.T @ sol.jac) * s2
    cov = np.zeros((len(scaling.PARAMS),) * 2)
    cov[np.ix_(free, free)] = cov_f
    x = full(sol.x[None, :])[0]
    span = bnd.hi - bnd.lo
    on_bound = [p for j, p in enumerate(scaling.PARAMS) if free[j] and (
        x[j] - bnd.lo[j] < ON_BOUND * span[j] or bnd.hi[j] - x[j] < ON_BOUND * span[j])]
    return {"x": x, "cov": cov, "free": free, "residual_sd": math.sqrt(s2),
            "rms": float(np.sqrt(np.mean(r**2))), "points": len(r), "on_bound": on_bound,
            "lo": bnd.lo, "hi": bnd.hi}


def configurations(runs: list[Run]) -> list[list[Run]]:
    """Runs grouped by configuration (every seed and both stages of one run's key together)."""
    by: dict[tuple[str, str], list[Run]] = defaultdict(list)
    for r in runs:
        by[(r.source, r.key.split("#")[0])].append(r)
    return list(by.values())


def bootstrap(runs: list[Run], n: int, *, floor_min: float = 0.0,
              fixed: dict[str, float] | None = None, seed: int = 0,
              x0: np.ndarray | None = None, jobs: int = 1, extra: tuple[str, ...] = ()
              ) -> np.ndarray:
    """Parameter vectors refitted on `n` resamples of the configurations (with replacement):
    the spread the same kind of measurements would have given. Deterministic (seeded, and the
    same for any number of `jobs`, the processes the refits run in); each refit starts from
    `x0` (the full fit's estimate) when given."""
    rng = np.random.default_rng(seed)
    groups = configurations(runs)
    picks = [[r for i in rng.integers(0, len(groups), size=len(groups)) for r in groups[i]]
             for _ in range(n)]
    refit = functools.partial(_refit, floor_min=floor_min, fixed=fixed, x0=x0, extra=extra)
    if jobs > 1 and n > 1:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(min(jobs, n), mp_context=ctx) as pool:
            out = list(pool.map(refit, picks))
    else:
        out = [refit(p) for p in picks]
    return np.array([x for x in out if x is not None])


def _refit(pick: list[Run], *, floor_min: float, fixed: dict[str, float] | None,
           x0: np.ndarray | None, extra: tuple[str, ...] = ()) -> np.ndarray | None:
    try:
        return fit(pick, floor_min, fixed, x0=x0, extra=extra)["x"]
    except SpecError:
        return None


# ln of a run's progress factor, searched on this grid (0.05 apart, refined between its
# points): wide enough for the study's slowest runs, far above their best learning rate
FACTOR_GRID = np.linspace(-3.0, 3.0, 121)


def progress_factors(x: np.ndarray, runs: list[Run], max_blocks: int = 128,
                     chunk: int = 32) -> np.ndarray:
    """Each run's own progress factor, ln f: the f by which its progress (every step's, both
    stages) is multiplied to fit its evaluation points best (least squares) with the other
    parameters at `x`. How much faster or slower than the model a run learns, in the units a
    steps-to-target answer is in (f = 1.25: the run reaches each loss in 1 / 1.25 of the
    steps)."""
    grid = FACTOR_GRID
    base = np.repeat(np.asarray(x, float)[None, :], len(grid), axis=0)
    thetas = scaling.shift_progress(base, grid)
    shapes, at, which, idx, _ = _prepare(runs)
    of_shape: dict[int, list[int]] = defaultdict(list)
    for i, w in enumerate(which):
        of_shape[w].append(i)
    sse = np.zeros((len(runs), len(grid)))
    for lo in range(0, len(shapes), chunk):
        js = list(range(lo, min(lo + chunk, len(shapes))))
        curves = scaling.loss_at(thetas, [shapes[j] for j in js], [at[j] for j in js],
                                 max_blocks)
        for c, j in zip(curves, js, strict=True):
            for i in of_shape[j]:
                sse[i] = np.sum((c[:, idx[i]] - np.array(runs[i].eval_loss[1:])) ** 2, axis=1)
    k = np.clip(np.argmin(sse, axis=1), 1, len(grid) - 2)
    rows = np.arange(len(runs))
    a, b, c = sse[rows, k - 1], sse[rows, k], sse[rows, k + 1]
    curv = a - 2.0 * b + c  # the parabola through the best grid point and its neighbours
    step = np.where(curv > 0, 0.5 * (a - c) / np.where(curv > 0, curv, 1.0), 0.0)
    return grid[k] + np.clip(step, -1.0, 1.0) * (grid[1] - grid[0])


def progress_sd(x: np.ndarray, runs: list[Run]) -> float:
    """The spread of the runs' progress factors (rms of ln f): the band's run-to-run spread."""
    f = progress_factors(x, runs)
    return float(np.sqrt(np.mean(f * f))) if len(f) else 0.0


def draws_with_noise(x: np.ndarray, draws: np.ndarray, residual_sd: float, n: int,
                     seed: int = 0, progress: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """n parameter vectors (the refits, cycled) and n loss shifts (the residual spread); with a
    `progress` spread (the sd of ln f, progress_sd) each vector's progress is scaled by a draw
    of it instead, and the loss shifts are 0."""
    rng = np.random.default_rng([seed, 0xC0])
    thetas = draws[np.arange(n) % len(draws)] if len(draws) else np.repeat(x[None, :], n, axis=0)
    shift = rng.normal(0.0, residual_sd, size=(n, 1))
    return scaling.spread_draws(thetas, shift, progress, [seed, 0xC1])


def check(fit_set: list[Run], check_set: list[Run], *, floor_min: float = 0.0,
          fixed: dict[str, float] | None = None,
          targets: list[float] | Callable[[Run], list[float]] | None = None,
          draws: int = 20, samples: int = 100, seed: int = 0, extra: tuple[str, ...] = (),
          band_sd: float | None = None) -> dict[str, Any]:
    """Fit on `fit_set`, predict every run of `check_set`: steps to each target it reaches
    (error = predicted / measured - 1) and whether the measured steps lie in [p10, p90].
    The band: the refits with each run's progress scaled by a draw of ln f ~ N(0, band_sd),
    as `simfed run` draws it; `band_sd` None: the fit runs' spread (progress_sd). With a
    `band_sd`, the fit runs' spread's band is reported beside it ("*_fit_spread"); the band of
    a constant loss shift (the residual spread, as profiles before the progress spread drew
    it) always is ("*_loss_shift"). The check runs' own progress factors under the fit
    (`check_factors`, their rms `check_progress_sd`) are the spread a held-out prediction
    meets.
    `extra`: parameters of OFF_UNLESS_ASKED that the fit frees.
    `targets`: the losses scored, the same for every check run or a function of the run."""
    from .split import targets as split_targets

    f = fit(fit_set, floor_min, fixed, extra=extra)
    boot = (bootstrap(fit_set, draws, floor_min=floor_min, fixed=fixed, seed=seed, x0=f["x"],
                      extra=extra)
            if draws else np.empty((0, len(scaling.PARAMS))))
    spread = progress_sd(f["x"], fit_set)
    thetas_ls, shift_ls = draws_with_noise(f["x"], boot, f["residual_sd"], samples, seed)
    # the bands a row is scored in, by key suffix: the judged one, the loss shift's, and the
    # fit runs' spread's beside a band of another spread (the same draws, another sd)
    spreads = {"": spread if band_sd is None else band_sd}
    if band_sd is not None:
        spreads["_fit_spread"] = spread
    if targets is None:
        loss_init = float(np.mean([r.eval_loss[0] for r in fit_set]))
        targets = split_targets(loss_init, min(r.final_loss for r in fit_set))
    shapes = list(dict.fromkeys(r.shape for r in check_set))
    point = scaling.loss_curves_many(f["x"], shapes)
    bands = {"_loss_shift": (scaling.loss_curves_many(thetas_ls, shapes), shift_ls)}
    for suffix, sd in spreads.items():
        thetas, shift = scaling.spread_draws(thetas_ls, shift_ls, sd, [seed, 0xC1])
        bands[suffix] = (scaling.loss_curves_many(thetas, shapes), shift)

    def quantiles(curves: np.ndarray, at: np.ndarray, tgt: float) -> tuple[float, float]:
        lo, hi = np.quantile([crossing(at, row, tgt) for row in curves[:, at]], BAND,
                             method="inverted_cdf")
        return float(lo), float(hi)

    def finite(v: float) -> float | None:
        return v if math.isfinite(v) else None
    rows, unreached = [], []
    for r in check_set:
        j = shapes.index(r.shape)
        at = np.array(r.eval_steps)
        for tgt in (targets(r) if callable(targets) else targets):
            meas = crossing(at, np.array(r.eval_loss), tgt)
            # predicted at the run's own evaluation steps, interpolated as the measurement is
            pred = crossing(at, point[j][0, at], tgt)
            if not math.isfinite(meas) and math.isfinite(pred) and pred > 0:
                # the model has the run reach a target it never reached: a miss the error
                # cannot score (the measured steps are beyond the run), at least 1 - pred / end
                unreached.append({"key": r.key, "source": r.source, "seed": r.seed,
                                  "target_loss": round(tgt, 4), "predicted_steps": round(pred, 2),
                                  "run_steps": int(at[-1]),
                                  "error_at_least": float(pred / at[-1] - 1)})
            if not math.isfinite(meas) or meas <= 0:
                continue
            pred_v = pred if math.isfinite(pred) else float(at[-1])  # at least this late
            row = {"key": r.key, "source": r.source, "seed": r.seed,
                   "target_loss": round(tgt, 4), "measured_steps": round(meas, 2),
                   "predicted_steps": round(pred, 2) if math.isfinite(pred) else None,
                   "error": pred_v / meas - 1}
            for suffix, (curves, shift) in bands.items():
                lo, hi = quantiles(curves[j] + shift, at, tgt)
                row |= {f"band{suffix}": [finite(lo), finite(hi)],
                        f"inside{suffix}": bool(lo <= meas <= hi)}
            rows.append(row)
    factors = progress_factors(f["x"], check_set) if check_set else np.empty(0)
    errs = [abs(row["error"]) for row in rows]
    with_unreached = errs + [abs(u["error_at_least"]) for u in unreached]
    shown = sorted({row["target_loss"] for row in rows}) if callable(targets) else targets
    return {"fit_runs": len(fit_set), "check_runs": len(check_set), "points": len(rows),
            "targets": [round(t, 4) for t in shown],
            "median_abs_error": median(errs) if errs else None,
            "worst_abs_error": max(errs) if errs else None,
            # per band: the share inside, and (closed) with a band open above (its p90 never
            # reaches the target) counted as outside
            **{f"inside{kind}band{suffix}": _share(rows, suffix, closed=kind == "_closed_")
               for suffix in bands for kind in ("_", "_closed_")},
            "progress_sd": spread,
            "band_sd": spreads[""],
            "check_factors": [{"key": r.key, "source": r.source, "seed": r.seed,
                               "ln_f": round(float(v), 4)} for r, v in zip(check_set, factors,
                                                                            strict=True)],
            "check_progress_sd": (float(np.sqrt(np.mean(factors ** 2))) if len(factors)
                                  else None),
            "unreached": len(unreached),
            # the median with each unreached target counted at its least error
            "median_abs_error_with_unreached": (median(with_unreached) if with_unreached
                                                else None),
            "fit_rms": f["rms"], "on_bound": f["on_bound"],
            "params": dict(zip(scaling.PARAMS, (float(v) for v in f["x"]), strict=True)),
            "rows": rows, "unreached_rows": unreached}


def _share(rows: list[dict[str, Any]], band: str, closed: bool) -> float | None:
    """The share of rows inside their band (`band`: the key suffix, "", "_loss_shift" or
    "_fit_spread"); `closed`: a band open above (p90 never reaches the target) counted as
    outside. None without rows."""
    if not rows:
        return None
    return sum(r["inside" + band] and (not closed or r["band" + band][1] is not None)
               for r in rows) / len(rows)
