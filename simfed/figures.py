"""`simfed figures`: regenerate every figure in figures/ from the scenarios (and from
results/validate.json and results/realrun/*/summary.json when they exist).

Each file name says what made it: `<scenario>_<what>.png`. The sweeps behind the figures are
written next to them as CSV (`<scenario>_<sweep>_sweep.csv`) so every number in a figure can be
looked up."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from .spec import SpecError
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

    def data(self, rows: list[dict[str, Any]], name: str) -> None:
        p = self.out_dir / name
        p.parent.mkdir(parents=True, exist_ok=True)
        slim = [{k: v for k, v in r.items() if k not in ("step_times_s", "summary")}
                for r in rows]
        p.write_text(to_csv(slim), encoding="utf-8")
        self.written.append(p)
        self.echo(f"wrote {p}")


def make_figures(scenario: str | Path = "scenarios/512gpu.yaml", out_dir: str | Path = "figures",
                 *, results_dir: str | Path = "results", jobs: int | None = None,
                 dpi: int = 100, svg: bool = False, progress: bool = True,
                 echo: Callable[[str], Any] = print) -> list[Path]:
    """Every figure for `scenario` (the 512-GPU paper scenario by default)."""
    from .engine import simulate
    from .plots import (
        load_summaries,
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
    stem = scenario.stem
    m = _Maker(Path(out_dir), stem, dpi, svg, echo)

    # 1. GPU count (x group size of FL+FSDP, x TORCH_DISTRIBUTED_DEBUG checks on/off)
    spec = SweepSpec(
        scenario=str(scenario), name=f"{stem}_gpus", sets={"training.steps": GPU_STEPS},
        axes=(_axis("cluster.nodes", GPU_NODES),
              _axis("algorithms.fl_fsdp.group_nodes", ",".join(map(str, GROUP_SIZES_NODES))),
              Axis(keys=("runtime.host.debug_checks",), values=(("detail",), ("off",)))),
    )
    res = run_sweep(spec, jobs=jobs, progress=progress)
    echo(f"sweep {spec.name}: {res.meta['points']} points, {len(res.rows)} rows in "
         f"{res.wall_s:.1f} s")
    m.data(res.rows, f"{stem}_gpus_sweep.csv")
    paper = GROUP_SIZES_NODES[0]
    checks_on = res.rows[0]["params"]["runtime.host.debug_checks"]

    def pick(group: int | None, checks: str) -> Callable[[dict[str, Any]], bool]:
        def keep(r: dict[str, Any]) -> bool:
            p = r["params"]
            return (p["runtime.host.debug_checks"] == checks
                    and (group is None or p["algorithms.fl_fsdp.group_nodes"] == group))
        return keep

    ctx = scenario_title(res.rows)
    m.save(plot_scaling(res.rows, where=pick(paper, checks_on),
                        title=f"{ctx}\nthroughput and speedup vs GPU count, the scenario as "
                              f"given (debug checks: {checks_on})"),
           f"{stem}_speedup_vs_gpus")
    m.save(plot_scaling(res.rows, where=pick(paper, "off"),
                        title=f"{ctx}\nthe same without TORCH_DISTRIBUTED_DEBUG checks "
                              "(runtime.host.debug_checks=off)"),
           f"{stem}_speedup_vs_gpus_no_debug_checks")
    fl = [r for r in res.rows if r["name"] in ("fsdp", "hsdp", "fl_fsdp")]
    m.save(plot_scaling(fl, where=pick(None, checks_on),
                        title=f"{ctx}\nFL+FSDP by federation group size (group = nodes per "
                              f"group; debug checks: {checks_on})"),
           f"{stem}_fl_fsdp_group_size_vs_gpus")

    # 2. group size x K at the scenario's own size
    spec = SweepSpec(
        scenario=str(scenario), name=f"{stem}_group_k", algorithms=("fsdp", "hsdp", "fl_fsdp"),
        axes=(_axis("algorithms.fl_fsdp.group_nodes", HEATMAP_GROUPS),
              _axis("algorithms.fl_fsdp.aggregate_every", HEATMAP_K)),
    )
    res = run_sweep(spec, jobs=jobs, progress=progress)
    echo(f"sweep {spec.name}: {res.meta['points']} points, {len(res.rows)} rows in "
         f"{res.wall_s:.1f} s")
    m.data(res.rows, f"{stem}_group_k_sweep.csv")
    for base in ("fsdp", "hsdp"):
        m.save(plot_heatmap(res.rows, x="algorithms.fl_fsdp.aggregate_every",
                            y="algorithms.fl_fsdp.group_nodes", algorithm="fl_fsdp",
                            baseline=base),
               f"{stem}_fl_fsdp_speedup_over_{base}_group_size_x_k")

    # 3. phases and one-step timelines of the scenario as given
    t0 = time.perf_counter()
    out, _ = simulate(load_scenario(scenario))
    m.save(plot_phases(out), f"{stem}_phases")
    out, spans = simulate(load_scenario(scenario, {"training.steps": GANTT_STEPS}), trace=True,
                          trace_steps=GANTT_STEPS)
    m.save(plot_gantt(spans, results=out["algorithms"],
                      title=f"{stem}: step {GANTT_STEPS} (with FedAvg for K={GANTT_STEPS}) of "
                            "rank 0, per algorithm"),
           f"{stem}_gantt_step{GANTT_STEPS}")
    echo(f"phases and timelines in {time.perf_counter() - t0:.1f} s")

    # 4. measured data, when there is some
    results_dir = Path(results_dir)
    validate = results_dir / "validate.json"
    if validate.exists():
        import json

        m.save(plot_validation(json.loads(validate.read_text(encoding="utf-8"))),
               "validate_predicted_vs_measured")
    else:
        echo(f"note: {validate} not found: skipping predicted-vs-measured "
             "(run simfed validate first)")
    summaries = sorted((results_dir / "realrun").glob("*/summary.json"))
    if summaries:
        m.save(plot_perplexity(load_summaries(summaries)), "realrun_perplexity_vs_time")
    else:
        echo(f"note: no {results_dir / 'realrun'}/*/summary.json: skipping perplexity-vs-time "
             "(run realrun run first)")
    return m.written


@click.command("figures")
@click.option("--scenario", default="scenarios/512gpu.yaml", show_default=True,
              type=click.Path(dir_okay=False), help="The scenario the figures are about.")
@click.option("--out", "out_dir", default="figures", show_default=True,
              type=click.Path(file_okay=False))
@click.option("--results", "results_dir", default="results", show_default=True,
              type=click.Path(file_okay=False),
              help="Where validate.json and realrun/*/summary.json are looked for.")
@click.option("--jobs", "-j", type=int, default=None, help="Sweep worker processes.")
@click.option("--dpi", type=int, default=100, show_default=True)
@click.option("--svg", is_flag=True, help="Also write SVG next to every PNG.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars.")
def figures_command(scenario: str, out_dir: str, results_dir: str, jobs: int | None, dpi: int,
                    svg: bool, quiet: bool) -> None:
    """Regenerate every figure in figures/ (sweeps, heatmaps, phases, timelines, validation)."""
    t0 = time.perf_counter()
    written = make_figures(scenario, out_dir, results_dir=results_dir, jobs=jobs, dpi=dpi,
                           svg=svg, progress=not quiet, echo=click.echo)
    click.echo(f"{len(written)} files in {out_dir}/ in {time.perf_counter() - t0:.1f} s")
