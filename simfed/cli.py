"""The `simfed` command line."""

from __future__ import annotations

import sys

import click

from .spec import SpecError


class _Group(click.Group):
    """Turn every SpecError (bad input) into a one-line message and exit status 2."""

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except SpecError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)


@click.group(cls=_Group)
@click.version_option(package_name="simfed")
def main() -> None:
    """Simulate FSDP, HSDP, FL+FSDP and FL+HSDP training on GPU clusters."""


def parse_sets(items: tuple[str, ...]) -> dict[str, object]:
    """`--set cluster.nodes=64` -> {"cluster.nodes": 64} (values parsed as YAML scalars)."""
    import yaml

    out: dict[str, object] = {}
    for item in items:
        if "=" not in item:
            raise SpecError(f"--set {item!r}: expected KEY=VALUE, e.g. cluster.nodes=64")
        key, _, raw = item.partition("=")
        if raw.strip().lower() in ("on", "off", "yes", "no", "y", "n"):
            out[key.strip()] = raw.strip()  # YAML 1.1 would read these as booleans
            continue
        try:
            out[key.strip()] = yaml.safe_load(raw)
        except yaml.YAMLError:
            raise SpecError(f"--set {key}: cannot parse value {raw!r}") from None
    return out


_SET = click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                    help="Override a scenario value, e.g. --set cluster.nodes=64 "
                         "--set algorithms.fl_fsdp.aggregate_every=4")


@main.command()
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write results JSON.")
@click.option("--trace", "trace_dir", type=click.Path(file_okay=False),
              help="Write per-algorithm JSONL traces and Chrome/Perfetto traces here.")
@click.option("--trace-steps", type=int, default=None, help="Trace only the first N steps.")
@click.option("--algorithm", "-a", "algorithms", multiple=True,
              help="Simulate only these algorithms (names or labels).")
@click.option("--seed", type=int, default=None, help="Override the scenario seed.")
@click.option("--quiet", "-q", is_flag=True, help="No table on stdout.")
@_SET
def run(scenario: str, json_path: str | None, trace_dir: str | None, trace_steps: int | None,
        algorithms: tuple[str, ...], seed: int | None, quiet: bool,
        sets: tuple[str, ...]) -> None:
    """Simulate every algorithm of SCENARIO and compare them."""
    from .analysis.report import print_report, write_json, write_traces
    from .engine import simulate
    from .spec import load_scenario

    overrides = parse_sets(sets)
    if seed is not None:
        overrides["seed"] = seed
    scn = load_scenario(scenario, overrides)
    out, spans = simulate(scn, algorithms=list(algorithms) or None, trace=bool(trace_dir),
                          trace_steps=trace_steps)
    if not quiet:
        print_report(out)
    if json_path:
        write_json(json_path, out)
        click.echo(f"wrote {json_path}")
    if trace_dir:
        for p in write_traces(trace_dir, out, spans):
            click.echo(f"wrote {p}")


@main.command()
@click.option("--scenario", default="scenarios/512gpu.yaml", show_default=True,
              type=click.Path(dir_okay=False))
@click.option("--quick", is_flag=True, help="Only the 512-GPU cases.")
@click.option("--repeat", default=1, show_default=True, help="Best of N runs per case.")
def bench(scenario: str, quick: bool, repeat: int) -> None:
    """Measure the simulator: wall time and simulated events per second."""
    from pathlib import Path

    from rich.console import Console
    from rich.table import Table

    from .bench import cases, run_case

    table = Table(title="simfed benchmark (wall time of simulate(), this machine)")
    for col in ("case", "GPUs", "actors", "wall", "events", "events/s"):
        table.add_column(col, justify="left" if col == "case" else "right")
    console = Console()
    for case in cases(quick):
        r = run_case(Path(scenario), case, repeat)
        table.add_row(r["case"], f"{r['gpus']:,}", str(r["actors"]), f"{r['wall_s']:.2f} s",
                      f"{r['events']:,}", f"{r['events_per_s']:,.0f}")
        console.print(f"  {r['case']}: {r['wall_s']:.2f} s", highlight=False)
    console.print(table)


@main.command()
def schema() -> None:
    """Print every scenario key with its type, default and meaning."""
    from .spec.scenario import Scenario
    from .spec.schema import describe

    click.echo(describe(Scenario))


# --- sweeps, plots and figures (issue 6; owned by the sweeps/plots work, keep this block last) ---
from .figures import figures_command  # noqa: E402
from .plots.cli import plot_command  # noqa: E402
from .sweep import sweep_command  # noqa: E402

main.add_command(sweep_command)
main.add_command(plot_command)
main.add_command(figures_command)
# --- end of sweeps, plots and figures ---


if __name__ == "__main__":
    main()
