"""`simfed figures`: regenerate every figure in figures/ from the scenarios (and from
results/validate.json and results/realrun/*/summary.json when they exist).

Each file name says what made it: `<scenario>_<what>.png`. The sweeps behind the figures are
written next to them as CSV (`<scenario>_<sweep>_sweep.csv`) so every number in a figure can be
looked up."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from .spec import SpecError
from .spec.cli_types import NonEmptyPath
from .spec.paths import write_text_atomic
from .sweep import Axis, SweepSpec, parse_values, run_sweep, to_csv

# the GPU-count sweep: 64 -> 4,096 GPUs (16 -> 1,024 four-GPU nodes); steps kept small, since the
# per-step numbers converge after the first K steps
GPU_STEPS = 16
GPU_NODES = "16:1024:x2"
GROUP_SIZES_NODES = (1, 4, 16)
# the group size x K grid at the paper's 128 nodes, over the paper's 64 steps
HEATMAP_GROUPS = "1:128:x2"
HEATMAP_K = "1:64:x2"
GANTT_STEPS = 8  # K = 8 in the paper: step 8 ends with a FedAvg round
# the straggler study: the paper's 128 nodes and 8x that; one node 0-100% slower,
# per-GPU jitter sigma 0-10%; the FL variants' budget is an unslowed group's K local steps and
# the deadline 5% more (so that without stragglers every variant runs K steps, all groups in)
STRAGGLER_NODES = (128, 1024)
STRAGGLER_SLOW_NODE_PCT = tuple(range(0, 101, 10))
STRAGGLER_JITTER_PCT = (0, 2, 4, 6, 8, 10)
STRAGGLER_SLOW_NODE = 5
STRAGGLER_DEADLINE_SLACK = 1.05


# the columns of the sweep CSVs kept next to the figures (the full rows: simfed sweep)
DATA_FIELDS = ("point", "params", "status", "error", "cluster", "name", "label", "plan",
               "global_batch_sequences", "aggregate_every", "aggregations", "step_time_s",
               "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "speedup", "phases_s",
               "compute_s", "exposed_comm_s", "debug_checks_s", "peak_memory_bytes", "fits")


def _axis(key: str, values: str) -> Axis:
    return Axis(keys=(key,), values=tuple((v,) for v in parse_values(values, key)))


class _Maker:
    """Writes figures (and their data) into one folder, printing a line per file."""

    def __init__(self, out_dir: Path, stem: str, dpi: int, svg: bool, echo: Callable[[str], Any]):
        self.out_dir, self.stem, self.dpi, self.svg, self.echo = out_dir, stem, dpi, svg, echo
        self.written: list[Path] = []

    def save(self, fig, name: str) -> None:
        from .plots import save_figure

        formats = ("png", "svg") if self.svg else ("png",)
        for p in save_figure(fig, self.out_dir / name, formats=formats, dpi=self.dpi):
            self.written.append(p)
            self.echo(f"wrote {p} ({p.stat().st_size / 1024:.0f} KB)")

    def data(self, rows: list[dict[str, Any]], name: str, drop: tuple[str, ...] = ()) -> None:
        p = self.out_dir / name
        slim = [{k: v for k, v in r.items() if k in DATA_FIELDS and k not in drop}
                for r in rows]
        write_text_atomic(p, to_csv(slim))
        self.written.append(p)
        self.echo(f"wrote {p}")


FIGURE_GROUPS = ("gpus", "heatmap", "phases", "gantt", "stragglers", "validation",
                 "perplexity", "convergence")


def straggler_rows(scenario: Path, *, nodes: tuple[int, ...] = STRAGGLER_NODES,
                   steps: int = GPU_STEPS, slow_pct: tuple[int, ...] = STRAGGLER_SLOW_NODE_PCT,
                   jitter_pct: tuple[int, ...] = STRAGGLER_JITTER_PCT) -> list[dict[str, Any]]:
    """Throughput of every algorithm and FL variant against straggler severity (the
    order-statistics method: a few seconds per cluster size)."""
    from dataclasses import replace

    from .engine import simulate_algorithm
    from .spec import load_scenario

    rows: list[dict[str, Any]] = []
    for n in nodes:
        base = load_scenario(scenario, {"cluster.nodes": n, "training.steps": steps})
        algs = []
        for alg in base.algorithms:
            algs.append((alg, "sync"))
            if alg.name not in ("fl_fsdp", "fl_hsdp"):
                continue
            # an unslowed group's K local steps: the homogeneous run less its FedAvg rounds
            free = simulate_algorithm(base, alg).result
            local = ((free["total_time_s"] - free["aggregations"]
                      * free["aggregation_per_event_s"]) / free["aggregations"])
            algs.append((replace(alg, label=f"{alg.display}, time budget",
                                 round_budget_s=local * 1.0001), "budget"))
            if alg.name == "fl_fsdp":
                algs.append((replace(alg, label=f"{alg.display}, deadline",
                                     round_deadline_s=local * STRAGGLER_DEADLINE_SLACK),
                             "deadline"))
                algs.append((replace(alg, label=f"{alg.display}, outer Nesterov",
                                     outer_optimizer="nesterov"), "nesterov"))
        slow = min(STRAGGLER_SLOW_NODE, n - 1)
        cases = [("slow_node", p, {"slow_nodes": [{"node": slow,
                                                   "factor": 1 + p / 100}]} if p else {})
                 for p in slow_pct]
        cases += [("gpu_jitter", p, {"jitter": {"sigma": p / 100, "level": "gpu"}} if p else {})
                  for p in jitter_pct]
        for kind, pct, strag in cases:
            scn = load_scenario(scenario, {"cluster.nodes": n, "training.steps": steps,
                                           "stragglers": strag})
            for alg, variant in algs:
                r = simulate_algorithm(scn, alg).result
                rounds = r.get("fl_rounds") or {}
                rows.append({
                    "gpus": scn.cluster.world, "kind": kind, "severity_pct": pct,
                    "name": alg.name, "label": alg.display, "variant": variant,
                    "step_time_s": r["step_time_s"], "tokens_per_s": r["tokens_per_s"],
                    "tokens_per_s_per_gpu": r["tokens_per_s_per_gpu"],
                    "participation": rounds.get("participation", ""),
                    "local_steps_per_round": rounds.get("local_steps_per_round", ""),
                })
    return rows


def make_figures(scenario: str | Path = "scenarios/512gpu.yaml", out_dir: str | Path = "figures",
                 *, results_dir: str | Path = "results", jobs: int | None = None,
                 dpi: int = 100, svg: bool = False, progress: bool = True,
                 echo: Callable[[str], Any] = print, only: Collection[str] | None = None,
                 gpu_nodes: str = GPU_NODES, gpu_steps: int = GPU_STEPS,
                 group_sizes: tuple[int, ...] = GROUP_SIZES_NODES,
                 heatmap_groups: str = HEATMAP_GROUPS, heatmap_k: str = HEATMAP_K,
                 gantt_steps: int = GANTT_STEPS,
                 straggler_nodes: tuple[int, ...] = STRAGGLER_NODES,
                 straggler_slow_pct: tuple[int, ...] = STRAGGLER_SLOW_NODE_PCT,
                 straggler_jitter_pct: tuple[int, ...] = STRAGGLER_JITTER_PCT) -> list[Path]:
    """Every figure for `scenario` (the 512-GPU paper scenario by default), or the groups in
    `only` (FIGURE_GROUPS); the grid settings default to the module constants."""
    from .engine import simulate
    from .plots import (
        plot_gantt,
        plot_heatmap,
        plot_perplexity,
        plot_phases,
        plot_scaling,
        plot_validation,
    )
    from .plots.common import scenario_title
    from .spec import load_scenario

    scenario = Path(scenario)
    if not scenario.exists():
        raise SpecError(f"scenario not found: {scenario}")
    unknown = sorted(set(only or ()) - set(FIGURE_GROUPS))
    if unknown:
        raise SpecError(f"figures: unknown group {unknown[0]!r}; valid: {', '.join(FIGURE_GROUPS)}")
    todo = set(only or FIGURE_GROUPS)
    inputs = _read_inputs(Path(results_dir), todo)  # all of them, before anything is written
    stem = scenario.stem
    m = _Maker(Path(out_dir), stem, dpi, svg, echo)
    given = load_scenario(scenario).runtime.host.debug_checks

    if "gpus" in todo:  # GPU count x FL+FSDP group size x debug checks as given / the other way
        other = "off" if given == "detail" else "detail"
        spec = SweepSpec(
            scenario=str(scenario), name=f"{stem}_gpus", sets={"training.steps": gpu_steps},
            axes=(_axis("cluster.nodes", gpu_nodes),
                  _axis("algorithms.fl_fsdp.group_nodes", ",".join(map(str, group_sizes))),
                  Axis(keys=("runtime.host.debug_checks",), values=((given,), (other,)))),
        )
        res = run_sweep(spec, jobs=jobs, progress=progress)
        echo(f"sweep {spec.name}: {res.meta['points']} points, {len(res.rows)} rows in "
             f"{res.wall_s:.1f} s")
        m.data(res.rows, f"{stem}_gpus_sweep.csv")
        first = group_sizes[0]

        def pick(group: int | None, checks: str) -> Callable[[dict[str, Any]], bool]:
            def keep(r: dict[str, Any]) -> bool:
                p = r["params"]
                return (p["runtime.host.debug_checks"] == checks
                        and (group is None or p["algorithms.fl_fsdp.group_nodes"] == group))
            return keep

        ctx = scenario_title(res.rows)
        m.save(plot_scaling(res.rows, where=pick(first, given),
                            title=f"{ctx}\nthroughput and speedup vs GPU count, the scenario as "
                                  f"given (TORCH_DISTRIBUTED_DEBUG checks: {given})"),
               f"{stem}_speedup_vs_gpus")
        what = "without" if other == "off" else "with"
        m.save(plot_scaling(res.rows, where=pick(first, other),
                            title=f"{ctx}\nthe same {what} TORCH_DISTRIBUTED_DEBUG=DETAIL checks "
                                  f"(runtime.host.debug_checks={other})"),
               f"{stem}_speedup_vs_gpus_{what}_debug_checks")
        fl = [r for r in res.rows if r["name"] in ("fsdp", "hsdp", "fl_fsdp")]
        m.save(plot_scaling(fl, where=pick(None, given),
                            title=f"{ctx}\nFL+FSDP by federation group size (group = nodes per "
                                  f"group; debug checks: {given})"),
               f"{stem}_fl_fsdp_group_size_vs_gpus")

    if "heatmap" in todo:  # group size x K at the scenario's own size
        spec = SweepSpec(
            scenario=str(scenario), name=f"{stem}_group_k", algorithms=("fl_fsdp",),
            axes=(_axis("algorithms.fl_fsdp.group_nodes", heatmap_groups),
                  _axis("algorithms.fl_fsdp.aggregate_every", heatmap_k)),
        )
        res = run_sweep(spec, jobs=jobs, progress=progress)
        echo(f"sweep {spec.name}: {res.meta['points']} points, {len(res.rows)} rows in "
             f"{res.wall_s:.1f} s")
        # the baselines do not depend on FL+FSDP's settings: simulate them once
        base_out, _ = simulate(load_scenario(scenario), algorithms=["fsdp", "hsdp"])
        rows = list(res.rows)
        for b in base_out["algorithms"]:
            for r in res.rows:
                if r["name"] == "fl_fsdp" and r.get("step_time_s"):
                    rows.append({**r, "name": b["name"], "label": b["label"],
                                 "step_time_s": b["step_time_s"]})
        m.data(res.rows, f"{stem}_group_k_sweep.csv", drop=("speedup",))  # only fl_fsdp ran
        for base in ("fsdp", "hsdp"):
            m.save(plot_heatmap(rows, x="algorithms.fl_fsdp.aggregate_every",
                                y="algorithms.fl_fsdp.group_nodes", algorithm="fl_fsdp",
                                baseline=base),
                   f"{stem}_fl_fsdp_speedup_over_{base}_group_size_x_k")

    if "phases" in todo:  # the scenario as given
        out, _ = simulate(load_scenario(scenario))
        m.save(plot_phases(out), f"{stem}_phases")

    if "gantt" in todo:
        out, spans = simulate(load_scenario(scenario, {"training.steps": gantt_steps}),
                              trace=True, trace_steps=gantt_steps)
        m.save(plot_gantt(spans, results=out["algorithms"],
                          title=f"{scenario_title([out])}\nstep {gantt_steps} of rank 0, per "
                                f"algorithm (the last of {gantt_steps}: it ends with FedAvg "
                                f"when K divides {gantt_steps})"),
               f"{stem}_gantt_step{gantt_steps}")

    if "stragglers" in todo:  # throughput against straggler severity, with the FL variants
        from .plots import plot_stragglers
        from .sweep import to_csv

        rows = straggler_rows(scenario, nodes=straggler_nodes, steps=gpu_steps,
                              slow_pct=straggler_slow_pct, jitter_pct=straggler_jitter_pct)
        path = m.out_dir / f"{stem}_stragglers_sweep.csv"
        write_text_atomic(path, to_csv(rows))
        m.written.append(path)
        echo(f"wrote {path}")
        scn = load_scenario(scenario)
        m.save(plot_stragglers(rows, title=f"{scn.name}: {scn.model.name} on "
                               f"{scn.cluster.node.gpu.name}\n"
                               f"throughput vs straggler severity ({gpu_steps} steps)"),
               f"{stem}_stragglers")

    results_dir = Path(results_dir)
    validate = results_dir / "validate.json"
    if inputs.validate is not None:
        try:
            fig = plot_validation(inputs.validate)
        except ValueError as exc:  # nothing in it to compare
            raise SpecError(f"{validate}: {exc}") from None
        m.save(fig, "validate_predicted_vs_measured")
    elif "validation" in todo:
        echo(f"note: {validate} not found: skipping predicted-vs-measured "
             "(run simfed validate --json first)")
    if inputs.summaries:
        try:
            fig = plot_perplexity(inputs.summaries)
        except ValueError as exc:  # no summary with a series to draw
            if isinstance(exc, SpecError):
                raise
            raise SpecError(f"{results_dir / 'realrun'}/*/summary.json: {exc}") from None
        m.save(fig, "realrun_perplexity_vs_time")
    elif "perplexity" in todo:
        echo(f"note: no {results_dir / 'realrun'}/*/summary.json: skipping perplexity-vs-time "
             "(run realrun run first)")
    if "convergence" in todo:
        _convergence_figures(m, scenario, inputs.studies, echo)
    return m.written


@dataclass
class _Inputs:
    """The result files the figures draw from, read and checked before any figure is made
    (a damaged one is refused before anything is written)."""

    validate: dict[str, Any] | None = None
    summaries: list[dict[str, Any]] = field(default_factory=list)
    studies: list[tuple[Path, dict[str, Any]]] = field(default_factory=list)


def _read_inputs(results_dir: Path, todo: Collection[str]) -> _Inputs:
    from .plots import load_summaries
    from .plots.inputs import study_for_grid
    from .spec.jsonio import read_json

    out = _Inputs()
    validate = results_dir / "validate.json"
    if "validation" in todo and validate.exists():
        data = read_json(validate, "figures")  # as `simfed plot validation` reads it
        if not isinstance(data, dict):
            raise SpecError(f"{validate}: expected simfed validate JSON (runs, speedups)")
        out.validate = data
    summaries = sorted((results_dir / "realrun").glob("*/summary.json"))
    if "perplexity" in todo and summaries:
        out.summaries = load_summaries(summaries)
    if "convergence" in todo:
        out.studies = [(p, study_for_grid(p)) for p in
                       sorted((results_dir / "convergence").glob("*.json"))]
    return out


def _convergence_figures(m: _Maker, scenario: Path, studies: list[tuple[Path, dict[str, Any]]],
                         echo: Callable[[str], Any]) -> None:
    """Predicted perplexity vs time for SCENARIO-time-to-target.yaml (next to the scenario),
    and the measured FL grid of every convergence study in RESULTS/convergence (`studies`:
    read and checked already)."""
    from .engine import simulate
    from .plots import plot_fl_grid, plot_size_study, plot_time_to_target
    from .spec import load_scenario
    from .spec.study import is_size_study

    ttt = scenario.with_name(f"{scenario.stem}-time-to-target.yaml")
    if ttt.exists():
        out, _ = simulate(load_scenario(ttt))
        m.save(plot_time_to_target(out), f"{scenario.stem}_perplexity_vs_time_to_target")
    else:
        echo(f"note: {ttt} not found: skipping the time-to-target figure")
    sizes = [data for _, data in studies if is_size_study(data)]
    if sizes:  # the size study: its files side by side
        m.save(plot_size_study(sizes), "convergence_size_study")
    for study, data in studies:
        if is_size_study(data):
            continue
        lr = data["recipe"]["paper_lr"]  # the FL-grid figure is of the runs at this lr
        sweep = {r["batch_per_model"] for r in data.get("runs", [])
                 if r["algorithm"] == "fsdp" and math.isclose(r["lr"], lr)}
        if len(sweep) >= 2:  # a study with a batch sweep and an FL grid to set beside it
            m.save(plot_fl_grid(data), f"convergence_{study.stem}_fl_grid")
        elif not any(math.isclose(r["lr"], lr) for r in data.get("runs", [])):
            echo(f"note: {study}: no run at its paper lr {lr:g}: no FL-grid figure")


@click.command("figures")
@click.option("--scenario", default="scenarios/512gpu.yaml", show_default=True,
              type=NonEmptyPath(dir_okay=False), help="The scenario the figures are about.")
@click.option("--out", "out_dir", default="figures", show_default=True,
              type=NonEmptyPath(file_okay=False))
@click.option("--results", "results_dir", default="results", show_default=True,
              type=NonEmptyPath(file_okay=False),
              help="Where validate.json and realrun/*/summary.json are looked for.")
@click.option("--jobs", "-j", type=int, default=None, help="Sweep worker processes.")
@click.option("--dpi", type=int, default=100, show_default=True)
@click.option("--svg", is_flag=True, help="Also write SVG next to every PNG.")
@click.option("--only", multiple=True, type=click.Choice(FIGURE_GROUPS),
              help="Only these figure groups (repeat); default: all.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars.")
def figures_command(scenario: str, out_dir: str, results_dir: str, jobs: int | None, dpi: int,
                    svg: bool, only: tuple[str, ...], quiet: bool) -> None:
    """Regenerate every figure in figures/ (sweeps, heatmaps, phases, timelines, validation)."""
    from .spec.paths import check_output

    check_output(out_dir, "--out", folder=True)
    t0 = time.perf_counter()
    written = make_figures(scenario, out_dir, results_dir=results_dir, jobs=jobs, dpi=dpi,
                           svg=svg, progress=not quiet, echo=click.echo, only=only or None)
    click.echo(f"{len(written)} files in {out_dir}/ in {time.perf_counter() - t0:.1f} s")
