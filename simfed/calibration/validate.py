"""Validation: predict real runs from a profile calibrated only on micro-benchmarks, and report
the error of every prediction.

`simfed validate SCENARIO` (as root, on the `realrun testbed`):
1. runs `realrun bench SCENARIO --testbed` (collectives, per-unit compute, optimizer) for the
   scenario and each of its `validation.bench_sets` (e.g. other model sizes);
2. fits a profile on those benchmarks alone (`simfed calibrate`);
3. runs every validation shape end to end with `realrun testbed run ... realrun.train`;
4. predicts each shape and algorithm with simfed (scenario + shape overrides + profile) and
   compares step time, phase times and the FL-vs-FSDP speedup with the measurements.
Steps whose outputs already exist in the output folder are not re-run (`--reuse`), so the
measurements can be taken once and the prediction iterated, or read from another machine.
simfed never imports torch or realrun: it calls the `realrun` command.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..engine import simulate
from ..spec.limits import MAX_WORLD
from ..spec.loader import load_scenario
from ..spec.paths import write_text_atomic
from ..spec.scenario import REBENCH_PARTS, Scenario, ValidationShape
from ..spec.schema import SpecError, to_plain
from ..spec.trace import read_trace, wall_step_times
from . import Samples, calibrate, read_inputs, write_profile
from .extrapolation import (
    QUANTITIES,
    Z80,
    extrapolation,
    scenario_quantities,
    step_shares,
    widening,
)
from .fit import FitResult, fit_all, fit_units

PHASES = ("forward", "backward", "optimizer", "aggregation")
COMM = "collectives"
SPEEDUP_PAIRS = (("fl_fsdp", "fsdp"), ("fl_hsdp", "hsdp"), ("fl_hsdp", "fsdp"))


def default_shapes(scn: Scenario) -> tuple[ValidationShape, ...]:
    rate = scn.cluster.node.nics.bw_Gbps
    return (
        ValidationShape(name="base", set={}),
        ValidationShape(name="half-rate", set={"cluster.node.nics.bw_Gbps": rate / 2}),
    )


def shape_sets(scn: Scenario) -> tuple[tuple[str, ValidationShape], ...]:
    """The scenario's shapes with their set, "fit" or "check" (the fit set first); a scenario
    without shapes gets `default_shapes` as its fit set."""
    return scn.validation.sets() or tuple(("fit", s) for s in default_shapes(scn))


def _fmt_sets(sets: dict[str, Any]) -> list[str]:
    out = []
    for k, v in sorted(sets.items()):
        out += ["--set", f"{k}={json.dumps(v) if isinstance(v, (list, dict)) else v}"]
    return out


@dataclass
class Runner:
    """Runs realrun commands (a subprocess per step), each logging to its own file."""

    echo: Callable[[str], None]
    timeout_s: float = 1800.0

    def realrun(self, args: list[str], log: Path) -> None:
        exe = shutil.which("realrun", path=str(Path(sys.executable).parent)) or \
            shutil.which("realrun")
        cmd = [exe] if exe else [sys.executable, "-m", "realrun.cli"]
        cmd += args
        if os.geteuid() != 0:
            raise SpecError(f"validate: the testbed needs root (euid is {os.geteuid()}); run as "
                            f"root, or give measurements already in the output folder (--reuse)")
        log.parent.mkdir(parents=True, exist_ok=True)
        self.echo("  $ realrun " + " ".join(args))
        env = dict(os.environ, OMP_NUM_THREADS="1")
        with open(log, "w", encoding="utf-8") as fh:
            try:
                proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                      timeout=self.timeout_s, check=False)
            except subprocess.TimeoutExpired:
                raise SpecError(f"validate: `realrun {args[0]}` ran past {self.timeout_s:.0f} s; "
                                f"see {log}") from None
        if proc.returncode != 0:
            tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()
            last = next((ln for ln in reversed(tail) if ln.strip()), "")
            raise SpecError(f"validate: `realrun {args[0]}` failed (exit {proc.returncode}): "
                            f"{last[:200]} (log: {log})")


WARMUP_STEPS = 2  # the first optimizer step allocates its state; the first steps are outliers


def _measured(run_dir: Path) -> dict[str, Any]:
    """Steady-state step and phase times of a realrun output folder: the mean over the steps after
    the first WARMUP_STEPS of the job's wall time per step (`wall_step_times`, from the ranks'
    step spans; a mean, not a median: with FedAvg every K steps the step times are multi-modal,
    and the simulator's step time is its wall time over all steps; a step's phases: the mean
    over ranks). The simulator predicts the steady state (no allocation, no warm-up)."""
    per_step: dict[tuple[str, int], list[float]] = {}
    bounds: list[dict[int, tuple[float, float]]] = []  # per rank: step -> (start, end)
    traces = sorted(run_dir.glob("trace_rank*.jsonl"))
    worlds: set[Any] = set()
    for trace in traces:
        meta, spans = read_trace(trace)
        worlds.add(meta.get("world_size"))
        mine: dict[tuple[str, int], float] = {}
        bounds.append({s.step: (s.start_s, s.end_s) for s in spans if s.cat == "step"})
        for s in spans:
            if s.step < WARMUP_STEPS:
                continue
            if s.cat == "phase" and s.name in PHASES:
                mine[(s.name, s.step)] = mine.get((s.name, s.step), 0.0) + s.dur_s
            elif s.cat == "comm" and s.attrs.get("phase") in PHASES:
                # time inside collectives (gloo blocks the rank: none of it overlaps compute)
                mine[(COMM, s.step)] = mine.get((COMM, s.step), 0.0) + s.dur_s
        for key, v in mine.items():
            per_step.setdefault(key, []).append(v)
    steps = sorted({st for _n, st in per_step})
    phases = {p: statistics.fmean([statistics.fmean(per_step.get((p, st), [0.0]))
                                   for st in steps]) if steps else 0.0 for p in (*PHASES, COMM)}
    comm = phases.pop(COMM)
    # the job's wall time per step, from the traces (also for runs whose summary has the slowest
    # rank's step times, as realrun's did before): FL groups out of phase count once
    if not bounds or not all(bounds):
        raise SpecError(f"validate: {run_dir}: no step spans in its rank traces "
                        f"({len(bounds)} trace_rank*.jsonl)")
    # every rank of the job, each through the same steps: a missing trace or one cut short (a
    # rank that died, a copy interrupted) would leave the slowest rank out of the wall time
    world = next(iter(worlds)) if len(worlds) == 1 else None
    ok = isinstance(world, int) and not isinstance(world, bool) and 0 < world <= MAX_WORLD
    names = {t.name for t in traces}
    want = {f"trace_rank{r}.jsonl" for r in range(world)} if ok else set()
    if worlds != {None} and (not ok or names != want):  # (None: traces that do not say)
        odd = (f"missing {', '.join(sorted(want - names))}" if want - names
               else f"{', '.join(sorted(names - want))} beside them")
        raise SpecError(f"validate: {run_dir}: {len(traces)} rank traces for meta.world_size "
                        f"{' / '.join(sorted(map(repr, worlds)))}: "
                        + (f"{odd} (a rank that died?)" if ok else "expected one world size"))
    last = [max(b) for b in bounds]
    if len(set(last)) > 1:
        short = min(range(len(last)), key=last.__getitem__)
        raise SpecError(f"validate: {traces[short]}: its steps end at {last[short]}, the other "
                        f"ranks' at {max(last)}: a rank that died or a trace cut short")
    times = wall_step_times(bounds)
    steady = times[WARMUP_STEPS:] if len(times) > WARMUP_STEPS else times[-1:]
    return {"step_time_s": statistics.fmean(steady), "phases_s": phases, "comm_s": comm}


def _median_of(ms: list[dict[str, Any]]) -> dict[str, Any]:
    """Median over repeated launches of the steady-state step and phase times."""
    return {
        "step_time_s": statistics.median(m["step_time_s"] for m in ms),
        "phases_s": {p: statistics.median(m["phases_s"][p] for m in ms) for p in PHASES},
        "comm_s": statistics.median(m["comm_s"] for m in ms),
        "launches": [m["step_time_s"] for m in ms],
    }


def _calibrate(scn: Scenario, samples: Samples, out: Path, shape: str, source: str,
               force: tuple[str, ...] = (), tag: str = ""
               ) -> tuple[Path, dict[str, Any], list[FitResult]]:
    """Fit a profile on benchmarks alone; write it (profile[-SHAPE][-TAG].yaml) and its report
    (calibration[-SHAPE][-TAG].json); return them with the fits (for draws)."""
    fits = fit_all(scn, samples, force)
    profile, report = calibrate(scn, samples, fits)
    suffix = (f"-{shape}" if shape else "") + (f"-{tag}" if tag else "")
    what = f"{len(set(samples.sources))} bench summaries of {source}" + (
        f", compute: the median of the re-benchmarks of shapes with shape {shape}'s compute "
        f"configuration" if shape else "")
    path = write_profile(out / f"profile{suffix}.yaml", profile,
                         header=f"simfed calibrate: fitted on realrun micro-benchmarks only "
                                f"({what}); never on end-to-end runs")
    write_text_atomic(out / f"calibration{suffix}.json",
                      json.dumps(_finite(report), indent=2, sort_keys=True) + "\n")
    return path, report, fits


def _finite(obj: Any) -> Any:
    """NaN and infinities as null (strict JSON)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


DRAWS = 40  # parameter draws per shape for the prediction intervals
# the shared-core mechanisms (simfed.contention): the switch under runtime.shared_cores and the
# fitted parameters that make it (name prefixes in the calibration's fits)
MECHANISMS = {
    "slowdown": ("out_of_step_slowdown",),
    "spread": ("out_of_step_cv",),
    "group_drift": ("group_drift_ms_per_sqrt_s",),
    "host_work": ("host_us_per_MB_",),
    "core_stack": ("core_stack_Gbps",),
}


@dataclass
class _Shape:
    split: str
    shape: ValidationShape
    sets: dict[str, Any]
    algs: list[str]
    samples: Samples
    fresh: Samples | None = None  # its own re-benchmark alone (None: no re-bench)


def _simulate(scenario: Path, sets: dict[str, Any], profile: Path, algs: list[str]
              ) -> tuple[Scenario, dict[str, dict[str, Any]]]:
    pscn = load_scenario(scenario, sets, profile=profile)
    pred, _ = simulate(pscn, algorithms=algs)
    by_name = {r["name"]: r for r in pred["algorithms"]}
    return pscn, {a: by_name[pscn.algorithm(a).name] for a in algs}


def _intervals(scenario: Path, scn: Scenario, sh: _Shape, fits: list[FitResult], out: Path,
               draws: int, seed: int) -> dict[str, list[float]]:
    """Step times of each algorithm over `draws` profiles whose fitted parameters are drawn
    from the fits' uncertainty (seeded: the same every time)."""
    rng = np.random.default_rng(seed)
    folder = out / "draws" / sh.shape.name
    folder.mkdir(parents=True, exist_ok=True)
    got: dict[str, list[float]] = {a: [] for a in sh.algs}
    for k in range(draws):
        drawn = [f.draw(rng) for f in fits]
        profile, _ = calibrate(scn, sh.samples, drawn)
        path = write_profile(folder / f"profile-{k}.yaml", profile, header=f"draw {k}")
        _, pred = _simulate(scenario, sh.sets, path, sh.algs)
        for a in sh.algs:
            got[a].append(pred[a]["step_time_s"])
    return got


def _compute_key(scenario: Path, sets: dict[str, Any]) -> str:
    """What a compute benchmark's speed depends on besides the host: layout, model,
    micro-batch and sequence length."""
    v = load_scenario(scenario, sets)
    return json.dumps([v.cluster.nodes, v.cluster.node.gpus, to_plain(v.model),
                       v.training.micro_batch, v.training.seq_len], sort_keys=True)


POOL_PARTS = ("units", "optimizer", "fedavg")


def _pool_rebenches(scenario: Path, samples: Samples, shapes: list[_Shape]) -> None:
    """Each shape's compute samples (units, optimizer, FedAvg local work) become the median,
    sample by sample, over the re-benchmarks of every shape with its compute configuration
    (`_compute_key`). The host's speed moves within a minute (run 24, quiet host: one
    configuration's units re-benchmarked at 260-406 ms forward + backward across six shapes,
    uncorrelated with its launches' 268-350 ms outside collectives), so one re-benchmark is one
    noisy draw of the speed the launches meet; their median is a steadier one (runs 23-24: the
    scatter of ln(predicted / measured time outside collectives) 0.17 -> 0.14 and 0.37 -> 0.30,
    sd over runs). A configuration re-benchmarked once keeps its own."""
    groups: dict[str, list[_Shape]] = {}
    for sh in shapes:
        if sh.fresh is not None:
            groups.setdefault(_compute_key(scenario, sh.sets), []).append(sh)
    for group in groups.values():
        pooled: dict[str, list[Any]] = {}
        for f in POOL_PARTS:
            lists = [getattr(sh.fresh, f) for sh in group]
            if len({len(x) for x in lists}) != 1 or not lists[0]:
                continue  # different benchmark parts: nothing to pair sample by sample
            pooled[f] = [replace(rows[0], time_s=statistics.median(r.time_s for r in rows))
                         for rows in zip(*lists, strict=True)]
        for sh in group:
            fresh = Samples(**{f: pooled.get(f, getattr(sh.fresh, f)) for f in POOL_PARTS},
                            **{k: getattr(sh.fresh, k) for k in Samples.POOLED})
            sh.samples = samples.refreshed(fresh)


# the standard deviation of a normal distribution per median absolute deviation
MAD_TO_SD = 1.4826


def _host_drift(scenario: Path, scn: Scenario, shapes: list[_Shape]) -> float:
    """How much the host's compute speed moves between benchmarks minutes apart, as a standard
    deviation of ln(speed). Each re-benchmark's speed is that of a forward and a backward whose
    FLOPs are twice the forward's (the units' two fitted rates, harmonically weighted, as a
    step spends them); its residual is its ln distance from the median of the re-benchmarks of
    its layout, model and micro-batch (the speed a shape is predicted at, see _pool_rebenches;
    other configurations' speeds differ for reasons of their own). The estimate is the median
    absolute residual x 1.4826 (a normal's standard deviation), not the residuals' standard
    deviation: one re-bench caught in a slow minute moves the pooled median that predictions
    use very little, and should not widen every interval (run 25, docs/validation.md). 0 with
    fewer than 2 re-benchmarks more than groups. A run is predicted at its configuration's
    median speed; it runs at the speed of its own minutes, which the benchmarks say is this
    uncertain (micro-benchmarks only)."""
    groups: dict[str, list[float]] = {}
    for sh in shapes:
        fit = fit_units(sh.fresh or sh.samples, scn)
        rates = {p.name: p.value for p in fit.params}
        fwd, bwd = rates.get("forward_flops_per_s"), rates.get("backward_flops_per_s")
        if not fwd or fwd <= 0 or not bwd or bwd <= 0:
            continue
        groups.setdefault(_compute_key(scenario, sh.sets), []).append(
            math.log(3.0 / (1.0 / fwd + 2.0 / bwd)))
    n = sum(len(g) for g in groups.values())
    if n - len(groups) < 2:
        return 0.0
    residuals = [x - statistics.median(g) for g in groups.values() if len(g) > 1 for x in g]
    return MAD_TO_SD * statistics.median(abs(r) for r in residuals)


def validate(scenario: Path, out: Path, *, echo: Callable[[str], None] = print,
             reuse: bool = True, skip_runs: bool = False, draws: int = DRAWS,
             mechanisms: bool = True) -> dict[str, Any]:
    if skip_runs and not reuse:
        raise SpecError("validate: --measured-only reads the measurements in --out, --fresh "
                        "re-runs them: give one of them")
    scn = load_scenario(scenario)
    splits = shape_sets(scn)
    shapes = [s for _split, s in splits]
    runner = Runner(echo)
    if skip_runs and not out.is_dir():  # nothing to read, and nothing is to be written there
        raise SpecError(f"validate --measured-only: {out} is not a folder of measurements "
                        "(it does not exist)")
    out.mkdir(parents=True, exist_ok=True)
    # ---- 1. benchmarks
    bench_sets = [{}] + [dict(s) for s in scn.validation.bench_sets]
    bench_dirs = []
    for i, sets in enumerate(bench_sets):
        d = out / "bench" / f"set{i}"
        bench_dirs.append(d)
        if reuse and (d / "bench-summary.json").exists():
            echo(f"bench {i}: reusing {d}")
            continue
        if skip_runs:  # --measured-only runs nothing (before: it launched the benchmark)
            raise SpecError(f"validate --measured-only: no bench summary for bench set {i} "
                            f"({sets or 'scenario as is'}) at {d / 'bench-summary.json'}")
        echo(f"bench {i}: {sets or 'scenario as is'}")
        skip = sets.pop("skip", "")  # parts of `realrun bench` this set leaves out
        runner.realrun(["bench", str(scenario), "--testbed", "--out", str(d), *_fmt_sets(sets),
                        *(["--skip", str(skip)] if skip else [])],
                       out / "logs" / f"bench{i}.log")
    # ---- 2. calibration on the benchmarks only
    samples = read_inputs(bench_dirs, scn.cluster.node.gpus)
    profile_path, report, _fits = _calibrate(scn, samples, out, "", scenario.name)
    echo(f"profile: {profile_path}")
    # ---- 3. end-to-end runs
    repeats = scn.validation.repeats
    rebench = scn.validation.rebench
    todo_shapes: list[_Shape] = []
    for split, shape in splits:
        sets = dict(shape.set or {})
        algs = list(shape.algorithms) or [a.label or a.name for a in scn.algorithms]
        shape_samples = samples
        fresh = None
        todo = [rep for rep in range(repeats) if any(
            not reuse or not (out / "runs" / shape.name / f"rep{rep}" / a / "summary.json")
            .exists() for a in algs)]
        if todo and skip_runs:
            raise SpecError(f"validate: no measurements for shape {shape.name!r} in "
                            f"{out / 'runs' / shape.name} (launches {todo})")
        if rebench:
            # the host's compute again, right before this shape's launches, in its layout
            d = out / "bench" / f"shape-{shape.name}"
            if todo or not (reuse and (d / "bench-summary.json").exists()):
                if skip_runs:
                    raise SpecError(f"validate: no re-benchmark for shape {shape.name!r} in {d}")
                echo(f"re-bench {shape.name}: {', '.join(rebench)}")
                skip = [p for p in REBENCH_PARTS if p not in rebench] + ["comm", "checks"]
                runner.realrun(["bench", str(scenario), "--testbed", "--out", str(d),
                                *_fmt_sets(sets), "--skip", ",".join(skip)],
                               out / "logs" / f"bench-{shape.name}.log")
            fresh = read_inputs([d], scn.cluster.node.gpus)
        for rep in todo:
            run_dir = out / "runs" / shape.name / f"rep{rep}"
            missing = [a for a in algs
                       if not reuse or not (run_dir / a / "summary.json").exists()]
            echo(f"shape {shape.name} (launch {rep + 1}/{repeats}): {', '.join(missing)} "
                 f"{sets or ''}")
            runner.realrun(["testbed", "run", str(scenario), *_fmt_sets(sets), "--",
                            str(scenario), *_fmt_sets(sets), "--algorithm", ",".join(missing),
                            "--out", str(run_dir)],
                           out / "logs" / f"run-{shape.name}-rep{rep}.log")
        todo_shapes.append(_Shape(split, shape, sets, algs, shape_samples,
                                  fresh if rebench else None))
    # ---- 4. predictions: calibrated on the benchmarks only (re-benchmarked compute in place),
    # with [p10, p90] from draws of the fitted parameters, widened where a shape extrapolates
    rows = []
    measured = {}
    host_sd = _host_drift(scenario, scn, todo_shapes) if rebench else 0.0
    if rebench:
        _pool_rebenches(scenario, samples, todo_shapes)
    spreads: dict[str, dict[str, list[float]]] = {}
    for n, sh in enumerate(todo_shapes):
        shape = sh.shape
        measured[shape.name] = {a: _median_of([_measured(out / "runs" / shape.name / f"rep{rep}"
                                                         / a) for rep in range(repeats)])
                                for a in sh.algs}
        if rebench:
            shape_profile, shape_report, fits = _calibrate(scn, sh.samples, out, shape.name,
                                                           scenario.name)
        else:
            shape_profile, shape_report, fits = profile_path, report, _fits
        pscn, pred = _simulate(scenario, sh.sets, shape_profile, sh.algs)
        spread = _intervals(scenario, scn, sh, fits, out, draws, scn.seed * 1000 + n) \
            if draws else {a: [] for a in sh.algs}
        spreads[shape.name] = spread
        flags = extrapolation(shape_report["ranges"], scenario_quantities(pscn, sh.algs))
        rms = {k: v["rms_rel_error"] for k, v in shape_report["fits"].items()}
        for a in sh.algs:
            m, p = measured[shape.name][a], pred[a]
            step = p["step_time_s"]
            shares = step_shares(p)
            extra = widening(flags, rms, shares)
            drift = host_sd * shares.get("compute", 0.0)
            ts = spread[a]
            lo, hi = (float(np.percentile(ts, 10)), float(np.percentile(ts, 90))) if ts \
                else (step, step)
            lo, hi = min(lo, step), max(hi, step)
            both = math.hypot(extra, drift)  # independent sources
            wide = [lo * max(0.0, 1 - Z80 * both), hi * (1 + Z80 * both)]
            err = (step - m["step_time_s"]) / m["step_time_s"]
            rows.append({
                "name": f"{shape.name}/{a}", "shape": shape.name, "split": sh.split,
                "baseline": a in shape.baselines, "set": sh.sets, "algorithm": a,
                "profile": str(shape_profile),
                "predicted_step_time_s": step,
                "measured_step_time_s": m["step_time_s"], "error": err,
                "measured_launches_s": m["launches"],
                # [p10, p90] over the draws of the fitted parameters, and widened for the
                # quantities this shape takes outside the calibration's samples
                "predicted_p10_p90_s": [lo, hi],
                "predicted_interval_s": wide,
                "inside_interval": wide[0] <= m["step_time_s"] <= wide[1],
                "extrapolating": [{**f, "widening_sd": f["doublings"] * (
                    rms.get(QUANTITIES[f["quantity"]][1]) or 0.0)} for f in flags],
                "widening_rel_sd": extra,
                # the host's speed between benchmarks (its compute share), see _host_drift
                "host_drift_rel_sd": drift,
                "predicted_phases_s": {k: p["phases_s"][k] for k in PHASES},
                "measured_phases_s": m["phases_s"],
                "phase_errors_s": {k: p["phases_s"][k] - m["phases_s"][k] for k in PHASES},
                # why: the time in collectives per step and the rest (compute, host work)
                "measured_comm_s": m["comm_s"],
                "predicted_comm_s": p["exposed_comm_s"],
                "measured_rest_s": m["step_time_s"] - m["comm_s"],
                "predicted_rest_s": step - p["exposed_comm_s"],
            })
    split_of = {s.name: split for split, s in splits}
    speedups = []
    for shape in shapes:
        got = {r["algorithm"]: r for r in rows if r["shape"] == shape.name}
        for fast, slow in SPEEDUP_PAIRS:
            if fast in got and slow in got:
                # paired: both algorithms ran in the same launch, a minute apart, so the
                # machine's drift between launches cancels in each launch's ratio
                per_launch = [a / b for a, b in zip(got[slow]["measured_launches_s"],
                                                    got[fast]["measured_launches_s"],
                                                    strict=True)]
                ms = statistics.median(per_launch)
                ps = got[slow]["predicted_step_time_s"] / got[fast]["predicted_step_time_s"]
                # the same draws for both algorithms: the ratio's [p10, p90]
                dr = [x / y for x, y in zip(spreads[shape.name][slow], spreads[shape.name][fast],
                                            strict=True)]
                band = ([min(ps, float(np.percentile(dr, 10))),
                         max(ps, float(np.percentile(dr, 90)))] if dr else [ps, ps])
                speedups.append({"name": f"{shape.name}: {fast}/{slow}", "shape": shape.name,
                                 "predicted_p10_p90": band,
                                 "inside_interval": band[0] <= ms <= band[1],
                                 "split": split_of[shape.name],
                                 "pair": f"{fast}/{slow}", "measured": ms, "predicted": ps,
                                 "error": (ps - ms) / ms, "measured_launches": per_launch,
                                 "measured_of_medians": got[slow]["measured_step_time_s"]
                                 / got[fast]["measured_step_time_s"]})
    result = {
        "scenario": scn.name,
        "profile": str(profile_path),
        "calibration": {k: {"n": v["n"], "rms_rel_error": v["rms_rel_error"],
                            "used": sorted(v["params"]),
                            "not_used": {n: u["reason"] for n, u in v["not_used"].items()}}
                        for k, v in report["fits"].items()},
        "ranges": report["ranges"],
        "draws": draws,
        "host_drift_sd": host_sd,
        "runs": rows,
        "speedups": speedups,
        "check_shapes": [{"name": s.name, "set": dict(s.set or {}),
                          "algorithms": list(s.algorithms), "baselines": list(s.baselines)}
                         for split, s in splits if split == "check"],
        "summary": {split: summarize([r for r in rows if r["split"] == split],
                                     [s for s in speedups if s["split"] == split])
                    for split in ("fit", "check") if any(r["split"] == split for r in rows)},
    }
    if mechanisms:
        result["mechanisms"] = _mechanisms(scenario, scn, todo_shapes, measured, out, echo)
    return result


def _errors(scenario: Path, todo: list[_Shape], measured: dict[str, Any],
            profile_for: Callable[[_Shape], Path], sets_extra: dict[str, Any]
            ) -> dict[str, Any]:
    """Step-time and FL+FSDP/FSDP speedup errors of each set, re-predicted from the same
    measured runs with these profiles and overrides."""
    rows, speedups = [], []
    for sh in todo:
        _, pred = _simulate(scenario, {**sh.sets, **sets_extra}, profile_for(sh), sh.algs)
        m = measured[sh.shape.name]
        for a in sh.algs:
            rows.append({"split": sh.split, "baseline": a in sh.shape.baselines,
                         "name": f"{sh.shape.name}/{a}",
                         "error": (pred[a]["step_time_s"] - m[a]["step_time_s"])
                         / m[a]["step_time_s"]})
        if "fl_fsdp" in pred and "fsdp" in pred:
            ms = statistics.median(x / y for x, y in zip(m["fsdp"]["launches"],
                                                          m["fl_fsdp"]["launches"], strict=True))
            ps = pred["fsdp"]["step_time_s"] / pred["fl_fsdp"]["step_time_s"]
            speedups.append({"split": sh.split, "pair": "fl_fsdp/fsdp", "error": (ps - ms) / ms})
    return {split: summarize([r for r in rows if r["split"] == split],
                             [s for s in speedups if s["split"] == split])
            for split in ("fit", "check") if any(r["split"] == split for r in rows)}


def _mechanisms(scenario: Path, scn: Scenario, todo: list[_Shape], measured: dict[str, Any],
                out: Path, echo: Callable[[str], None]) -> dict[str, Any]:
    """Each shared-core mechanism on and off, from the same measured runs and benchmarks: off
    is the calibrated profile with the mechanism's switch off; on is a calibration that uses
    its coefficients whatever their intervals (as fitted), switch on."""
    out_m = out / "mechanisms"
    out_m.mkdir(parents=True, exist_ok=True)
    base: dict[str, Path] = {}
    for sh in todo:
        p = out / f"profile-{sh.shape.name}.yaml"
        base[sh.shape.name] = p if p.exists() else out / "profile.yaml"
    table = {}
    for mech, prefixes in MECHANISMS.items():
        echo(f"mechanism {mech}: on and off")
        forced: dict[str, Path] = {}
        for sh in todo:
            forced[sh.shape.name], _, _ = _calibrate(scn, sh.samples, out_m, sh.shape.name,
                                                     scenario.name, force=prefixes, tag=mech)
        on = _errors(scenario, todo, measured, lambda sh, f=forced: f[sh.shape.name],
                     {f"runtime.shared_cores.{mech}": True})
        off = _errors(scenario, todo, measured, lambda sh: base[sh.shape.name],
                      {f"runtime.shared_cores.{mech}": False})
        table[mech] = {"on": on, "off": off}
    return table


def summarize(rows: list[dict[str, Any]], speedups: list[dict[str, Any]]) -> dict[str, Any]:
    """Step-time errors (baseline rows left out: their configuration is another shape's) and
    the FL+FSDP / FSDP speedups' errors of one set of runs."""
    scored = [r for r in rows if not r.get("baseline")]
    abs_err = [abs(r["error"]) for r in scored]
    worst = max(scored, key=lambda r: abs(r["error"])) if scored else None
    main_pairs = [s for s in speedups if s["pair"] == "fl_fsdp/fsdp"]
    return {
        "runs": len(scored),
        "median_abs_error": statistics.median(abs_err) if abs_err else None,
        "mean_abs_error": statistics.fmean(abs_err) if abs_err else None,
        "worst": {"name": worst["name"], "error": worst["error"]} if worst else None,
        "fl_fsdp_over_fsdp_max_abs_error":
            max((abs(s["error"]) for s in main_pairs), default=None),
        "fl_fsdp_over_fsdp_within_15pct":
            sum(abs(s["error"]) <= 0.15 for s in main_pairs) if main_pairs else None,
        "fl_fsdp_over_fsdp_pairs": len(main_pairs),
        # the share of measured step times inside the predicted interval (target ~80%)
        "inside_interval": (sum(bool(r["inside_interval"]) for r in scored) / len(scored))
        if scored and all("inside_interval" in r for r in scored) else None,
    }
