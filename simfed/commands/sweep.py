"""`simfed sweep`: the command and its summary table, over `simfed.api.sweep`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ..api import sweep
from ..spec import SpecError
from ..spec.cli_types import NonEmptyPath
from ..spec.overrides import parse_sets
from ..spec.paths import check_output
from ..spec.yamlio import read_yaml
from ..sweep.executors import EXECUTORS
from ..sweep.grid import parse_vary
from ..sweep.runner import SweepResult
from ..sweep.sweepfile import is_sweep_file, load_sweep_file


def _fmt_s(t: float) -> str:
    return f"{t:.2f} s" if t >= 1 else f"{t * 1e3:.0f} ms"


def print_summary(result: SweepResult, max_rows: int = 40) -> None:
    """A pivot table: one line per point, one column per algorithm (step time, speedup)."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:  # a pipe or a log file: do not squeeze the table into 80 columns
        console = Console(width=160)
    algs = result.meta["algorithms"]
    labels = {r["name"]: r["label"] for r in reversed(result.rows) if r.get("label")}
    labels.update({r["label"]: r["label"] for r in result.rows if r.get("label")})
    keys = [k for ax in result.meta["axes"] for k in ax["keys"]]
    base = labels.get(algs[0], algs[0])
    target = any("time_to_target_s" in r for r in result.rows)
    t = Table(title=f"sweep {result.meta['name']}: step time (speedup vs {base})"
              + (", time to the convergence target" if target else ""), header_style="bold")
    for k in keys:
        t.add_column(k.split(".")[-1] if len(k) > 16 else k, justify="right", no_wrap=True)
    for a in algs:
        t.add_column(labels.get(a, a), justify="right", no_wrap=True)
    by_point: dict[int, list[dict[str, Any]]] = {}
    for r in result.rows:
        by_point.setdefault(r["point"], []).append(r)
    for n, (_, rs) in enumerate(sorted(by_point.items())):
        if n >= max_rows:
            break
        cells = [str(rs[0]["params"][k]) for k in keys]
        for r in rs:
            if r["status"] in ("invalid", "error"):
                cells.append(f"[dim]{r['status']}[/dim]")
                continue
            sp = f" ({r['speedup']:.2f}x)" if r.get("speedup") is not None else ""
            oom = " [red]OOM[/red]" if r["status"] == "does_not_fit" else ""
            ttt = ""  # time to the scenario's convergence target, when it has one
            if "time_to_target_s" in r:
                v = r["time_to_target_s"]
                ttt = f", target {_fmt_s(v)}" if v is not None else ", target not reached"
            cells.append(f"{_fmt_s(r['step_time_s'])}{sp}{ttt}{oom}")
        t.add_row(*cells)
    console.print(t)
    if len(by_point) > max_rows:
        console.print(f"  ... {len(by_point) - max_rows} more points in the CSV/JSON")
    errors = sorted({r["error"] for r in result.rows if r["status"] in ("invalid", "error")})
    for e in errors[:5]:
        console.print(f"  [dim]not run:[/dim] {e}", highlight=False)
    if len(errors) > 5:
        console.print(f"  ... {len(errors) - 5} more distinct errors in the CSV/JSON")


@click.command("sweep")
@click.argument("scenario", type=NonEmptyPath(dir_okay=False))
@click.option("--vary", "varies", multiple=True, metavar="KEY=VALUES",
              help="A grid axis: KEY=V1,V2,... or KEY=START:STOP[:STEP] or KEY=START:STOP:xF; "
                   "KEY1+KEY2=... varies keys together. Repeat for more axes.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="A fixed override at every point, e.g. --set training.steps=16")
@click.option("--algorithm", "-a", "algorithms", multiple=True,
              help="Only these algorithms (names or labels); the first is the speedup baseline.")
@click.option("--out", "out_dir", type=NonEmptyPath(file_okay=False),
              help="Write OUT/<name>.csv and OUT/<name>.json [default: results/sweeps].")
@click.option("--csv", "csv_path", type=NonEmptyPath(dir_okay=False), help="Write the CSV here.")
@click.option("--json", "json_path", type=NonEmptyPath(dir_okay=False), help="Write the JSON here.")
@click.option("--name", default=None, help="Name of the sweep (file names, titles).")
@click.option("--jobs", "-j", type=int, default=None,
              help="Worker processes [default: the CPUs of this machine].")
@click.option("--executor", type=click.Choice(list(EXECUTORS)), default="local",
              show_default=True, help="local process pool, Dask (extra 'distributed') or Ray.")
@click.option("--address", default=None,
              help="Scheduler of an existing Dask cluster (tcp://host:8786) or Ray cluster; "
                   "without it a local one is started.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no table.")
def sweep_command(scenario: str, varies: tuple[str, ...], sets: tuple[str, ...],
                  algorithms: tuple[str, ...], out_dir: str | None, csv_path: str | None,
                  json_path: str | None, name: str | None, jobs: int | None, executor: str,
                  address: str | None, quiet: bool) -> None:
    """Simulate SCENARIO (a scenario or a sweep file) over a grid of values, in parallel.

    Writes one row per point and algorithm (CSV and JSON, byte-identical for the same sweep);
    impossible points are rows with status `invalid` or `does_not_fit`, never a crash.

    \b
    A sweep file is YAML with one top-level `sweep:` mapping:
      sweep:
        scenario: ../scenarios/512gpu.yaml     # relative to the sweep file
        set: {training.steps: 16}
        vary: {cluster.nodes: "16:1024:x2", algorithms.fl_fsdp.group_nodes: [1, 4]}
        linked: [{algorithms.fl_fsdp.aggregate_every: [4, 8],
                  algorithms.fl_hsdp.aggregate_every: [8, 16]}]
        algorithms: [fsdp, fl_fsdp]
    """
    if jobs is not None and jobs < 1:
        raise SpecError(f"--jobs: must be >= 1, got {jobs}")
    if not Path(scenario).exists():
        raise SpecError(f"file not found: {scenario}")
    file = load_sweep_file(scenario) if is_sweep_file(scenario) else None
    axes = [parse_vary(v) for v in varies]
    if not axes and not (file and file.axes):
        if file is None:  # a file that does not parse says so, not "nothing to vary"
            read_yaml(scenario, "sweep")
        raise SpecError("nothing to vary: give --vary KEY=V1,V2,... (or a sweep file)")
    if not (csv_path or json_path):
        base = Path(out_dir or "results/sweeps") / (name or (file.name if file else
                                                             Path(scenario).stem))
        csv_path, json_path = f"{base}.csv", f"{base}.json"
    elif out_dir:
        raise SpecError("give either --out DIR or --csv/--json files, not both")
    check_output(out_dir, "--out", folder=True)  # before the sweep runs
    check_output(csv_path, "--csv")
    check_output(json_path, "--json")
    result = sweep(scenario, axes, parse_sets(sets), algorithms=tuple(algorithms), name=name,
                   executor=executor, jobs=jobs, address=address, progress=not quiet)
    written = result.write(csv=csv_path, json=json_path)
    if not quiet:
        print_summary(result)
    c = result.counts()
    click.echo(f"{result.meta['points']} points x {len(result.meta['algorithms'])} algorithms "
               f"= {len(result.rows)} rows: {c['ok']} ok, {c['does_not_fit']} do not fit, "
               f"{c['invalid']} invalid, {c['error']} errors ({result.wall_s:.1f} s)")
    for p in written:
        click.echo(f"wrote {p}")

