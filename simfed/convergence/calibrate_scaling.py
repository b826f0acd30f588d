"""`simfed calibrate --convergence kjv-h48.json kjv-h64.json ... --out PROFILE.yaml`: the scaling
model (scaling.py) fitted on size-study files, with the held-out checks of split.py (across
model size; past the fitted horizon) reported and kept in the profile, the parameters on a bound
of their range named, and bootstrap refits for the band."""

from __future__ import annotations

import datetime as _dt
import functools
import json
import math
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ..spec import SpecError
from ..spec.paths import write_text_atomic
from ..spec.yamlio import dump_yaml
from . import fitting, scaling, split
from .profile import PROFILE_V2, closed_note, parse, unreached_note
from .runs import Run, runs_of_study, segments


def modelled(runs: list[Run]) -> list[Run]:
    """The runs the scaling model describes: plain FedAvg or one model, exact reductions."""
    return [r for r in runs if r.shape.outer == "average" and not r.tags.get("ring_dtype")]


def study_runs(studies: list[dict[str, Any]]) -> list[Run]:
    """The runs of size-study files the model describes, as its two stages (runs.segments)
    where the study records the data's unigram loss."""
    runs = [r for s in studies for r in runs_of_study(s)]
    data = {s["data"]["source"] for s in studies}
    if len(data) > 1:
        raise SpecError(f"--convergence: the studies are on {len(data)} data sets "
                        f"({', '.join(sorted(data))}); a profile is fitted on one")
    u = unigram_loss(studies)
    runs = modelled(runs)
    return [seg for r in runs for seg in segments(r, u)] if u is not None else runs


def unigram_loss(studies: list[dict[str, Any]]) -> float | None:
    vals = {s["data"].get("unigram_loss_nats") for s in studies}
    if None in vals or len(vals) != 1:
        return None
    return float(vals.pop())


def fixed_params(studies: list[dict[str, Any]]) -> dict[str, float]:
    """The data's unigram loss is measured (the study header), not fitted."""
    u = unigram_loss(studies)
    return {"unigram_loss": u} if u is not None else {}


def floor_min(studies: list[dict[str, Any]]) -> float:
    return float(min(s["data"].get("entropy_floor_nats") or 0.0 for s in studies))


def _range(vals: list[float]) -> list[float]:
    return [float(min(vals)), float(max(vals))]


def fitted_range(studies: list[dict[str, Any]], runs: list[Run]) -> dict[str, Any]:
    sh = [r.shape for r in runs]
    fed = [s for s in sh if s.federated]
    return {
        "data": studies[0]["data"]["source"], "vocab": int(studies[0]["model"]["vocab"]),
        "seq_len": _range([r.tags["seq_len"] for r in runs]),
        "non_embedding_params": _range([s.params for s in sh]),
        "lr": _range([s.lr for s in sh]),
        "batch_tokens": _range([s.batch_tokens for s in sh]),
        "groups": _range([s.groups for s in fed] or [1]),
        "aggregate_every": _range([s.aggregate_every for s in fed] or [1]),
        "steps": _range([s.steps for s in sh]),
        "loss": _range([v for r in runs for v in r.eval_loss]),
        "optimizer": "adamw", "outer": ["average"],
    }


def _hidden(r: Run) -> int:
    return int(r.tags["model"]["hidden"])


def _scored(rs: list[Run]) -> list[Run]:
    """The runs a check scores: every segment but stage 1's ("pre")."""
    return [r for r in rs if r.shape.segment != "pre"]


# the seventh check also scores, as a second report fixed before its runs were made, the
# model with the learning rate's lasting damage fitted (the size target is judged on the
# model as shipped)
VARIANT_FREE = ("lr_damage",)
VARIANT = "lr damage fitted"


def check_plans(runs: list[Run], whole: list[Run] | tuple[Run, ...] = ()
                ) -> list[dict[str, Any]]:
    """The checks of split.py that these runs allow (each needs both of its sets): what is
    fitted, what is predicted, and the losses scored. Scored on the stage after the unigram
    plateau ("post" segments of runs.segments, steps counted from where the loss leaves it;
    whole runs where the study has no unigram loss). `whole`: the same runs unsegmented; with
    them the sixth to ninth checks are also scored from step 0 ("sixth size, from
    step 0": the same fit and targets, the check runs' steps counted from their first step, as
    a scenario's prediction counts them; the eighth and ninth size targets are judged on this
    score)."""
    # the fifth check's fit additions are read by no earlier check, the data made after the
    # sixth by none up to the sixth (the seventh fits it)
    runs_all = list(runs)
    every = [r for r in runs if r.source not in split.AFTER_SIXTH]
    whole = [r for r in whole if r.source not in split.AFTER_SIXTH]
    runs = [r for r in every if r.source not in split.FIFTH_FIT_ONLY]

    def targets(fit_set: list[Run]) -> list[float]:
        start = float(np.mean([r.eval_loss[0] for r in _scored(fit_set)]))
        return split.targets(start, min(r.final_loss for r in _scored(fit_set)))

    plans = []
    first = [r for r in runs if _hidden(r) in split.FRESH_FIT_HIDDEN
             and int(r.tags["steps"]) <= split.HORIZON_CHECK_STEPS]
    size_fit = [r for r in first if not split.is_size_check(r.tags)]
    size_check = [r for r in _scored(first) if split.is_size_check(r.tags)]
    if size_fit and size_check:
        hidden = sorted({_hidden(r) for r in size_fit})
        plans.append({"what": "across size", "fit": f"hidden {', '.join(map(str, hidden))}",
                      "check": f"hidden {split.SIZE_CHECK_HIDDEN}", "seen": True,
                      "fit_set": size_fit,
                      "check_set": size_check, "targets": targets(size_fit)})
    hz_fit = [r for r in first if split.is_horizon_fit(r.tags)]
    hz_check = [r for r in _scored(first) if split.is_horizon_check(r.tags)]
    if hz_fit and hz_check:
        plans.append({"what": "past the horizon", "fit": f"{split.HORIZON_FIT_STEPS}-step runs",
                      "check": f"{split.HORIZON_CHECK_STEPS}-step runs", "seen": True,
                      "fit_set": hz_fit,
                      "check_set": hz_check, "targets": targets(hz_fit)})
    # the second and third checks (fresh runs), each fitted on every run the checks before it
    # had, up to a size and a run length
    plans += _fresh_plans(runs, ("fresh size", "fresh horizon"), split.FRESH_FIT_HIDDEN,
                          split.LONG_FIT_MAX_STEPS, split.FRESH_SIZE_HIDDEN,
                          split.LONG_CHECK_STEPS)
    plans += _fresh_plans(runs, ("third size", "third horizon"),
                          (*split.FRESH_FIT_HIDDEN, split.FRESH_SIZE_HIDDEN),
                          split.LONG_CHECK_STEPS, split.THIRD_SIZE_HIDDEN,
                          split.LONGER_CHECK_STEPS)
    plans += _fresh_plans(runs, ("fourth size", "fourth horizon"),
                          split.FOURTH_FIT_HIDDEN, split.FOURTH_FIT_MAX_STEPS,
                          split.FOURTH_SIZE_HIDDEN, split.LONGEST_CHECK_STEPS)
    plans += _fresh_plans(every, ("fifth size", ""), split.FIFTH_FIT_HIDDEN,
                          split.FIFTH_FIT_MAX_STEPS, split.FIFTH_SIZE_HIDDEN, 0)
    plans += _fresh_plans(every, ("sixth size", ""), split.SIXTH_FIT_HIDDEN,
                          split.FIFTH_FIT_MAX_STEPS, split.SIXTH_SIZE_HIDDEN, 0)
    plans += _fresh_plans(runs_all, ("seventh size", ""), split.SEVENTH_FIT_HIDDEN,
                          split.FIFTH_FIT_MAX_STEPS, split.SEVENTH_SIZE_HIDDEN, 0)
    plans += _fresh_plans(runs_all, ("eighth size", ""), split.EIGHTH_FIT_HIDDEN,
                          split.FIFTH_FIT_MAX_STEPS, split.EIGHTH_SIZE_HIDDEN, 0)
    plans += _fresh_plans(runs_all, ("ninth size", ""), split.NINTH_FIT_HIDDEN,
                          split.FIFTH_FIT_MAX_STEPS, split.NINTH_SIZE_HIDDEN, 0)
    # the tenth: its own targets (judged), the fresh size's as a second report; banded with
    # the held-out checks' spread where split.HELD_OUT_BAND says so
    tenth = [{**p, "held_out_band": split.HELD_OUT_BAND} for p in (
        *_fresh_plans(runs_all, ("tenth size", ""), split.TENTH_FIT_HIDDEN,
                      split.FIFTH_FIT_MAX_STEPS, split.TENTH_SIZE_HIDDEN, 0,
                      split.TENTH_FRACTIONS),
        *_fresh_plans(runs_all, ("tenth size, fresh-size targets", ""), split.TENTH_FIT_HIDDEN,
                      split.FIFTH_FIT_MAX_STEPS, split.TENTH_SIZE_HIDDEN, 0))]
    plans += tenth
    for name, hidden in (("sixth size", split.SIXTH_SIZE_HIDDEN),
                         ("seventh size", split.SEVENTH_SIZE_HIDDEN),
                         ("eighth size", split.EIGHTH_SIZE_HIDDEN),
                         ("ninth size", split.NINTH_SIZE_HIDDEN),
                         ("tenth size", split.TENTH_SIZE_HIDDEN),
                         ("tenth size, fresh-size targets", split.TENTH_SIZE_HIDDEN)):
        size = [p for p in plans if p["what"] == name]
        from_zero = [r for r in whole if _hidden(r) == hidden]
        if size and from_zero:
            plans.append({**size[0], "what": f"{name}, from step 0", "check_set": from_zero,
                          "seen": f"{name}, from step 0" in split.SEEN_CHECKS})
    plans += [{**p, "what": f"{p['what']} ({VARIANT})", "free": VARIANT_FREE} for p in plans
              if p["what"].startswith("seventh size")]
    return plans


def _fresh_plans(runs: list[Run], names: tuple[str, str],
                 fit_hidden: tuple[int, ...], fit_max_steps: int, size_hidden: int,
                 long_steps: int, fractions: tuple[float, ...] = split.TARGET_FRACTIONS
                 ) -> list[dict[str, Any]]:
    """One held-out check of split.py past the first: a fresh size (targets: split.targets of
    the drop to the best final loss of the fit set's 128-step runs, at `fractions`) and a fresh
    horizon
    (targets per run: _long_targets), both fitted on the runs of `fit_hidden` of at most
    `fit_max_steps` steps; the check runs are the scored segments of `runs`."""
    fit_set = [r for r in runs if _hidden(r) in fit_hidden
               and int(r.tags["steps"]) <= fit_max_steps]
    post, scored = _scored(fit_set), _scored(runs)
    size_check = [r for r in scored if _hidden(r) == size_hidden]
    long_check = [r for r in scored if int(r.tags["steps"]) == long_steps]
    plans: list[dict[str, Any]] = []
    common = {"fit_set": fit_set}
    if fit_set and size_check:
        start = float(np.mean([r.eval_loss[0] for r in post]))
        best = min(r.final_loss for r in post if int(r.tags["steps"]) == split.HORIZON_FIT_STEPS)
        plans.append({"what": names[0], "fit": "hidden " + ", ".join(map(str, fit_hidden)),
                      "check": f"hidden {size_hidden}", "check_set": size_check,
                      "targets": split.targets(start, best, fractions),
                      "seen": names[0] in split.SEEN_CHECKS, **common})
    if fit_set and long_check:
        best_of = {h: min((r.final_loss for r in post if _hidden(r) == h), default=math.nan)
                   for h in {_hidden(r) for r in long_check}}
        plans.append({"what": names[1], "fit": f"runs of at most {fit_max_steps} steps",
                      "check": f"{long_steps}-step runs", "check_set": long_check,
                      "targets": functools.partial(_long_targets, best_of),
                      "seen": names[1] in split.SEEN_CHECKS, **common})
    return plans


def _long_targets(best: dict[int, float], r: Run) -> list[float]:
    """split.LONG_FRACTIONS of the drop from a check run's start to the best final loss of
    the fit runs of its size."""
    drop = r.eval_loss[0] - best[_hidden(r)]
    return [r.eval_loss[0] - f * drop for f in split.LONG_FRACTIONS] if math.isfinite(drop) else []


def _run_check(plan: dict[str, Any], fmin: float, draws: int,
               fixed: dict[str, float] | None, band_sd: float | None = None
               ) -> dict[str, Any]:
    """One check: fit, bootstrap refits for the band (none for a check whose runs were seen
    before the model was fixed: its band is the fit's residual spread alone), predict;
    `band_sd`: the band's progress spread in place of the fit runs'."""
    c = fitting.check(plan["fit_set"], plan["check_set"], floor_min=fmin,
                      draws=0 if plan["seen"] else draws, fixed=fixed,
                      extra=plan.get("free", ()),
                      targets=plan["targets"], band_sd=band_sd)
    return {"what": plan["what"], "fit": plan["fit"], "check": plan["check"],
            "seen": plan["seen"], "free": list(plan.get("free", ())), **c}


def held_out_spread(checks: list[dict[str, Any]],
                    names: tuple[str, ...] = split.BAND_FROM_CHECKS) -> dict[str, Any] | None:
    """The progress spread held-out predictions met: the rms of ln f over the check runs of
    the checks `names` (each run's factor under its own check's profile), or None where
    none of them was scored."""
    used = [c for c in checks if c["what"] in names and not c["free"]]
    factors = [f["ln_f"] for c in used for f in c["check_factors"]]
    if not factors:
        return None
    return {"sd": float(np.sqrt(np.mean(np.square(factors)))), "runs": len(factors),
            "checks": [c["what"] for c in used]}


def _map(fn: Any, plans: list[dict[str, Any]], jobs: int) -> list[dict[str, Any]]:
    jobs = max(1, min(len(plans), jobs))
    if jobs == 1:
        return [fn(p) for p in plans]
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(fn, plans))


def held_out_checks(runs: list[Run], fmin: float, draws: int = 20,
                    fixed: dict[str, float] | None = None, jobs: int | None = None,
                    only: tuple[str, ...] = (), whole: list[Run] | tuple[Run, ...] = ()
                    ) -> list[dict[str, Any]]:
    """The checks of split.py that these runs allow (check_plans; `only`: those named), each
    fitted and scored, in parallel processes (`jobs`, default one per CPU core); the results
    do not depend on how many. A plan marked `held_out_band` is banded with the spread of the
    checks of split.BAND_FROM_CHECKS (held_out_spread), scored first."""
    every = check_plans(runs, whole)
    plans = [p for p in every if not only or p["what"] in only]
    jobs = jobs or os.cpu_count() or 1
    banded = [p for p in plans if p.get("held_out_band")]
    first = [p for p in plans if not p.get("held_out_band")]
    if banded:  # the checks their band comes from, scored even where not asked for
        asked = {p["what"] for p in first}
        first += [p for p in every if p["what"] in split.BAND_FROM_CHECKS
                  and p["what"] not in asked]
    run = functools.partial(_run_check, fmin=fmin, draws=draws, fixed=fixed)
    done = _map(run, first, jobs)
    spread = held_out_spread(done) if banded else None
    if banded and spread is not None:
        later = _map(functools.partial(run, band_sd=spread["sd"]), banded, jobs)
        for c in later:
            c["band_from"] = spread
    else:
        later = _map(run, banded, jobs)
    by = {c["what"]: c for c in done + later}
    return [by[p["what"]] for p in plans]


def calibrate_scaling(studies: list[dict[str, Any]], out: Path, report: Path,
                      draws: int = 40) -> list[str]:
    runs = study_runs(studies)
    if not runs:
        raise SpecError("--convergence: no runs the scaling model describes in these files")
    fmin = floor_min(studies)
    fixed = fixed_params(studies)
    whole = modelled([r for s in studies for r in runs_of_study(s)])
    checks = held_out_checks(runs, fmin, draws=min(draws, 20), fixed=fixed, whole=whole)
    f = fitting.fit(runs, fmin, fixed)
    boot = (fitting.bootstrap(runs, draws, floor_min=fmin, x0=f["x"], fixed=fixed,
                              jobs=os.cpu_count() or 1) if draws else np.empty((0, 0)))
    names = ", ".join(sorted({s["experiment"] for s in studies}))
    fit_sd = fitting.progress_sd(f["x"], runs)
    held = held_out_spread(checks, split.PROFILE_BAND_FROM) if split.HELD_OUT_BAND else None
    profile: dict[str, Any] = {
        "schema": PROFILE_V2, "model": "scaling",
        "source": f"{names}: {len(runs)} runs, {f['points']} evaluation points",
        "params": dict(zip(scaling.PARAMS, (float(v) for v in f["x"]), strict=True)),
        "covariance": [[float(v) for v in row] for row in f["cov"]],
        "draws": [[float(v) for v in row] for row in boot],
        "residual_sd": f["residual_sd"],
        "progress_sd": held["sd"] if held else fit_sd,
        **({"fit_progress_sd": fit_sd,
            "progress_sd_from": f"held-out checks: {', '.join(held['checks'])} "
                                f"({held['runs']} runs)"} if held else {}),
        "rms_error": f["rms"],
        "on_bound": f["on_bound"],
        "fitted_range": fitted_range(studies, runs),
        "checks": [{k: c[k] for k in ("what", "fit", "check", "points", "median_abs_error",
                                      "worst_abs_error", "inside_band", "inside_closed_band",
                                      "unreached",
                                      "median_abs_error_with_unreached", "seen")}
                   for c in checks if not c["free"]],  # the profile's own model's checks
    }
    parse(profile, "scaling", str(out))  # what is written is what a scenario accepts
    header = (f"# simfed calibrate --convergence {names} ({_dt.date.today().isoformat()})\n"
              "# the scaling model (simfed/convergence/scaling.py); include it as a scenario's "
              "convergence.profile\n")
    write_text_atomic(out, header + dump_yaml(profile, sort_keys=False, width=100))
    rep = {"profile": profile, "checks": checks, "intervals": intervals(f)}
    write_text_atomic(report, json.dumps(rep, indent=2, sort_keys=True, allow_nan=False) + "\n")
    return [*summary_lines(profile, f, checks), f"wrote {out} and {report}"]


def intervals(f: dict[str, Any]) -> dict[str, list[float]]:
    """95% intervals of the free parameters from the fit's covariance."""
    out = {}
    for j, p in enumerate(scaling.PARAMS):
        if f["free"][j]:
            sd = math.sqrt(max(0.0, float(f["cov"][j, j])))
            out[p] = [float(f["x"][j] - 1.96 * sd), float(f["x"][j] + 1.96 * sd)]
    return out


def summary_lines(profile: dict[str, Any], f: dict[str, Any], checks: list[dict[str, Any]]
                  ) -> list[str]:
    p = profile["params"]
    iv = intervals(f)
    k = iv.get("log_fl_kappa")
    lines = [
        f"convergence fit (scaling): {profile['source']}",
        f"  rms error {profile['rms_error']:.4f} nats; eta*(1e6 params) "
        f"{math.exp(p['log_lr_star']):.3g}, c {p['lr_size_exponent']:.3g}; B_noise(L) "
        f"{math.exp(p['log_noise_star']):.4g} L^-{p['noise_loss_exponent']:.3g} tokens; "
        f"P_c {math.exp(p['log_progress_scale']):.3g}, alpha {p['exponent']:.3g}, d "
        f"{p['progress_size_exponent']:.3g}; floor {p['loss_floor']:.3f} + "
        f"{math.exp(p['log_floor_coef']):.3g} (N/1e6)^-{p['floor_size_exponent']:.3g}",
        f"  learning rate: progress above the optimum falls as x^{1 - 2 * p['lr_tail']:.2f} "
        f"at 1e6 params (lr tail gamma {p['lr_tail']:.3g}"
        + (f", 95% interval {iv['lr_tail'][0]:.3g}..{iv['lr_tail'][1]:.3g}"
           if iv.get("lr_tail") else "") + "), gamma(N) = gamma (N/1e6)^-t with t "
        + f"{p['lr_tail_size_exponent']:.3g}"
        + (f" (95% interval {iv['lr_tail_size_exponent'][0]:.3g}.."
           f"{iv['lr_tail_size_exponent'][1]:.3g})" if iv.get("lr_tail_size_exponent") else ""),
        f"  band: each run's progress x f, ln f ~ N(0, {profile['progress_sd']:.3g}) ("
        + (f"the spread the {profile['progress_sd_from']} met; the fit runs' "
           f"{profile['fit_progress_sd']:.3g}" if profile.get("progress_sd_from") else
           "the fit runs' spread")
        + f"; residual spread {profile['residual_sd']:.3g} nats)",
        f"  FedAvg: kappa {math.exp(p['log_fl_kappa']):.3g}"
        + (f" (95% interval of ln kappa {k[0]:.3g}..{k[1]:.3g})" if k else ""),
    ]
    if profile["on_bound"]:
        lines.append(f"  ON A BOUND of its range: {', '.join(profile['on_bound'])}")
    for c in checks:
        how = "seen before the model was fixed" if c.get("seen") else "held out"
        if c.get("free"):
            how += f", second report (not the profile's model: {', '.join(c['free'])} fitted)"
        if c["median_abs_error"] is None:
            lines.append(f"  {how}, {c['what']}: no check run reaches a target")
            continue
        lines.append(f"  {how}, {c['what']} (fit {c['fit']}, check {c['check']}): median "
                     f"|steps-to-target error| {c['median_abs_error']:.1%}, worst "
                     f"{c['worst_abs_error']:.1%}, {c['inside_band']:.0%} inside [p10, p90] "
                     + closed_note(c) + f" over {c['points']} points{unreached_note(c)}"
                     + loss_shift_note(c))
    return lines


def loss_shift_note(c: dict[str, Any]) -> str:
    """The inside share of the band drawn as profiles before the progress spread drew it (a
    constant loss shift), where the check reports it."""
    ls = c.get("inside_band_loss_shift")
    if ls is None:
        return ""
    closed = c.get("inside_closed_band_loss_shift")
    return (f"; with a loss-shift band {ls:.0%} inside"
            + (f" ({closed:.0%} closed)" if closed is not None and closed != ls else ""))
