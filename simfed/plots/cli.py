"""`simfed plot KIND INPUT...`: one figure from sweep, run, trace, validate or realrun files."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from ..spec import SpecError
from ..spec.cli_types import NonEmptyPath

KINDS = ("scaling", "heatmap", "phases", "gantt", "validation", "perplexity")
_YAML = (".yaml", ".yml")


def _read_json(path: str) -> Any:
    """A JSON input of `simfed plot` (regular, bounded, strict, nested at most 64 deep)."""
    from ..spec.jsonio import read_json

    return read_json(path, "plot")


def _rows(inputs: tuple[str, ...], where: tuple[str, ...]) -> list[dict[str, Any]]:
    from ..spec.overrides import parse_sets
    from .common import param
    from .inputs import sweep_rows

    rows = [r for p in inputs for r in sweep_rows(p)]  # read and checked
    for key, value in parse_sets(where).items():
        rows = [r for r in rows if param(r, key) == value]
        if not rows:
            raise SpecError(f"--where {key}={value}: no row matches")
    return rows


def _simulate(scenario: str, sets: tuple[str, ...], trace_steps: int | None = None):
    from ..engine import simulate
    from ..spec import load_scenario
    from ..spec.overrides import parse_sets

    overrides = parse_sets(sets)
    if trace_steps is not None:
        overrides.setdefault("training.steps", trace_steps)
    scn = load_scenario(scenario, overrides)
    return simulate(scn, trace=trace_steps is not None, trace_steps=trace_steps)


def _first_keys(rows: list[dict[str, Any]]) -> list[str]:
    keys: list[str] = []
    for r in rows:
        for k in r.get("params") or {}:
            if k not in keys:
                keys.append(k)
    return keys


def make_figure(kind: str, inputs: tuple[str, ...], *, x: str | None = None,
                y: str | None = None, algorithm: str | None = None, value: str = "speedup",
                baseline: str | None = None, where: tuple[str, ...] = (),
                sets: tuple[str, ...] = (), step: int | None = None, trace_steps: int = 8,
                title: str | None = None):
    from . import (
        plot_gantt,
        plot_heatmap,
        plot_perplexity,
        plot_phases,
        plot_scaling,
        plot_validation,
    )
    from .perplexity import load_summaries

    if kind == "scaling":
        return plot_scaling(_rows(inputs, where), x=x or "gpus", title=title)
    if kind == "heatmap":
        rows = _rows(inputs, where)
        keys = _first_keys(rows)
        if not (x and y) and len(keys) < 2:
            raise SpecError("heatmap: give --x KEY --y KEY (the sweep varies fewer than 2 keys)")
        return plot_heatmap(rows, x=x or keys[1], y=y or keys[0], algorithm=algorithm,
                            value=value, baseline=baseline, title=title)
    if kind == "phases":
        src = inputs[0]
        from .inputs import run_results

        out = _simulate(src, sets)[0] if src.endswith(_YAML) else run_results(src)
        return plot_phases(out, title=title)
    if kind == "gantt":
        if len(inputs) == 1 and inputs[0].endswith(_YAML):
            out, spans = _simulate(inputs[0], sets, trace_steps)
            results = out["algorithms"]
            if algorithm:
                spans = {k: v for k, v in spans.items() if algorithm in
                         {k, *(str(a[f]) for a in results if k in (a["name"], a["label"])
                               for f in ("name", "label"))}}
                if not spans:
                    raise SpecError(f"gantt: no algorithm {algorithm!r} in {inputs[0]}")
            return plot_gantt(spans, step=step, results=results, title=title)
        from ..spec import read_trace

        by_label = {}
        for p in inputs:
            meta, sp = read_trace(p)
            by_label[str(meta.get("label") or meta.get("algorithm") or Path(p).stem)] = sp
        return plot_gantt(by_label, step=step, title=title)
    if kind == "validation":
        data = _read_json(inputs[0])
        if not isinstance(data, Mapping):
            raise SpecError(f"{inputs[0]}: expected simfed validate JSON (runs, speedups)")
        return plot_validation(data, title=title)
    if kind == "perplexity":
        return plot_perplexity(load_summaries(inputs), title=title)
    raise SpecError(f"unknown plot kind {kind!r}; valid kinds: {', '.join(KINDS)}")


@click.command("plot")
@click.argument("kind", type=click.Choice(KINDS))
@click.argument("inputs", nargs=-1, required=True)
@click.option("--out", "-o", type=NonEmptyPath(dir_okay=False),
              help="Output file: x.png or x.svg writes that format, no suffix writes both "
                   "[default: <input>_<kind> in the current folder].")
@click.option("--x", "x", default=None, help="scaling: x axis (default gpus); heatmap: x key.")
@click.option("--y", "y", default=None, help="heatmap: y key.")
@click.option("--algorithm", "-a", default=None, help="heatmap/gantt: the algorithm to show.")
@click.option("--value", default="speedup", show_default=True,
              help="heatmap: the result field to colour by (speedup, tokens_per_s, ...).")
@click.option("--baseline", default=None,
              help="heatmap: speedup over this algorithm of the sweep [default: its first].")
@click.option("--where", multiple=True, metavar="KEY=VALUE",
              help="scaling/heatmap: keep only rows where a swept key has this value.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="phases/gantt from a scenario: override a value.")
@click.option("--step", type=int, default=None,
              help="gantt: the step to draw (0-based; default: the last traced step).")
@click.option("--trace-steps", type=int, default=8, show_default=True,
              help="gantt from a scenario: simulate and trace this many steps.")
@click.option("--title", default=None, help="Replace the figure title.")
def plot_command(kind: str, inputs: tuple[str, ...], out: str | None, x: str | None,
                 y: str | None, algorithm: str | None, value: str, baseline: str | None,
                 where: tuple[str, ...],
                 sets: tuple[str, ...], step: int | None, trace_steps: int,
                 title: str | None) -> None:
    """Draw a KIND figure from INPUT files.

    \b
    scaling     sweep JSON/CSV over GPU count (or --x KEY): throughput and speedup
    heatmap     sweep JSON/CSV over two keys: speedup of --algorithm per cell
    phases      simfed run --json output, or a scenario YAML: stacked phases per algorithm
    gantt       a scenario YAML (simulated) or trace JSONL files: one step's streams
    validation  simfed validate JSON: predicted against measured
    perplexity  realrun summary.json files or run folders: perplexity against wall time
    """
    from ..spec.paths import check_output
    from .common import save_figure

    for p in inputs:
        if not Path(p).exists():
            raise SpecError(f"file not found: {p}")
    # an empty --out is refused by check_output, not taken as 'not given'
    target = out if out is not None else f"{Path(inputs[0]).with_suffix('').name}_{kind}"
    check_output(target, "--out")  # before the figure is drawn (a simulation, maybe)
    try:
        fig = make_figure(kind, inputs, x=x, y=y, algorithm=algorithm, value=value,
                          baseline=baseline, where=where, sets=sets, step=step,
                          trace_steps=trace_steps, title=title)
    except ValueError as exc:
        if isinstance(exc, SpecError):
            raise
        raise SpecError(f"plot {kind}: {exc}") from None
    for p in save_figure(fig, target):
        click.echo(f"wrote {p}")
