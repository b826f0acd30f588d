"""The `simfed` command line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from .spec import SpecError
from .spec.cli_types import NonEmptyPath
from .spec.messages import INTERNAL_ERROR, ending  # noqa: F401 - re-exported
from .spec.overrides import parse_sets
from .spec.paths import check_output, write_text_atomic

# exit statuses: 2 bad input (a SpecError, a usage error, a file that cannot be read or
# written); INTERNAL_ERROR a fault of simfed itself (a bug: the traceback goes to a log file)


def _ended(exc: BaseException) -> None:
    """The contract's one line on stderr and its exit status (spec.messages.ending)."""
    line, status = ending("simfed", exc, sys.argv[1:])
    click.echo(line, err=True)
    sys.exit(status)


def _finite_or_null(obj: object) -> object:
    """A report for strict JSON: a number that is not finite (a fit's error with no samples:
    NaN) becomes null, "not available"."""
    import math

    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_or_null(v) for v in obj]
    return obj


class _Group(click.Group):
    """The error contract: a SpecError (bad input) or a file that cannot be read or written is
    one line and exit status 2; anything else is an internal error: one line naming a log file
    with the traceback, exit status 3 (`INTERNAL_ERROR`), never a raw traceback."""

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit,
                click.exceptions.Abort, SystemExit):
            raise
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)
        except Exception as exc:  # SpecError, OSError; RecursionError and MemoryError included
            _ended(exc)


@click.group(cls=_Group)
@click.version_option(package_name="simfed")
def main() -> None:
    """Simulate FSDP, HSDP, FL+FSDP and FL+HSDP training on GPU clusters."""


_SET = click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                    help="Override a scenario value, e.g. --set cluster.nodes=64 "
                         "--set algorithms.fl_fsdp.aggregate_every=4")


@main.command()
@click.argument("scenario", type=NonEmptyPath(dir_okay=False))
@click.option("--json", "json_path", type=NonEmptyPath(dir_okay=False), help="Write results JSON.")
@click.option("--trace", "trace_dir", type=NonEmptyPath(file_okay=False),
              help="Write per-algorithm JSONL traces and Chrome/Perfetto traces here.")
@click.option("--trace-steps", type=click.IntRange(min=1), default=None,
              help="Trace only the first N steps.")
@click.option("--algorithm", "-a", "algorithms", multiple=True,
              help="Simulate only these algorithms (names or labels; repeat the option or give "
                   "a comma list, as realrun takes them).")
@click.option("--seed", type=int, default=None, help="Override the scenario seed.")
@click.option("--profile", type=NonEmptyPath(dir_okay=False),
              help="A calibrated profile (simfed calibrate) merged over the scenario.")
@click.option("--quiet", "-q", is_flag=True, help="No table on stdout.")
@click.option("--robustness", is_flag=True,
              help="Also simulate the scenario under each of the model's known errors "
                   "(compute, NVLink and network collectives, GPU variation, HYBRID_SHARD's "
                   "ratio to FULL_SHARD, debug checks, a trainer's metric sync; "
                   "sizes from the published validation) and say whether the winner holds.")
@_SET
def run(scenario: str, json_path: str | None, trace_dir: str | None, trace_steps: int | None,
        algorithms: tuple[str, ...], seed: int | None, profile: str | None, quiet: bool,
        robustness: bool, sets: tuple[str, ...]) -> None:
    """Simulate every algorithm of SCENARIO and compare them."""
    from .analysis.report import print_report
    from .api import load, simulate

    check_output(json_path, "--json")
    check_output(trace_dir, "--trace", folder=True)
    overrides = parse_sets(sets)
    if seed is not None:
        overrides["seed"] = seed
    scn = load(scenario, overrides, profile=profile)
    algorithms = tuple(a.strip() for given in algorithms for a in given.split(","))
    res = simulate(scn, list(algorithms) or None, robustness=robustness,
                   trace=bool(trace_dir), trace_steps=trace_steps)
    out = res.to_dict()
    if not quiet:
        print_report(out)
        if not profile:  # how sure: the published validation's claim and envelope
            from .calibration.envelope import for_run as envelope_lines

            how_sure = envelope_lines(scn, out=out)
            for line in how_sure:
                click.echo(line)
            if how_sure and not robustness:
                click.echo("  --robustness: does the winner hold under the model's known errors?")
    if profile:  # where the scenario leaves the calibration's samples
        from .calibration.extrapolation import for_run

        for line in for_run(scn, profile, out, list(algorithms) or None):
            click.echo(line)
    if robustness and not quiet:
        from rich.console import Console

        from .analysis.robustness import print_robustness

        print_robustness(out["robustness"], Console())
    if json_path:
        res.write_json(json_path)
        click.echo(f"wrote {json_path}")
    if trace_dir:
        for p in res.write_traces(trace_dir):
            click.echo(f"wrote {p}")


@main.command()
@click.option("--scenario", default="scenarios/512gpu.yaml", show_default=True,
              type=NonEmptyPath(dir_okay=False))
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
@click.option("--json", "as_json", is_flag=True,
              help="The JSON Schema of a scenario file (types, bounds, choices, defaults, docs) "
                   "for editors: `simfed schema --json > scenario.schema.json`.")
@click.option("--resolved", is_flag=True,
              help="With --json: of a scenario with its includes resolved (required keys "
                   "required; a file as written may take them from an include).")
def schema(as_json: bool, resolved: bool) -> None:
    """Print every scenario key with its type, default and meaning."""
    from .spec.scenario import Scenario
    from .spec.schema import describe, json_schema

    if as_json:
        import json

        doc = json_schema(Scenario, "simfed scenario", resolved=resolved)
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(describe(Scenario))


@main.command()
@click.argument("inputs", nargs=-1, required=True, type=NonEmptyPath(path_type=Path))
@click.option("--scenario", "scenario", default=None, type=NonEmptyPath(dir_okay=False),
              help="The scenario whose cluster was measured (geometry, nominal figures); "
                   "not needed with --convergence.")
@click.option("--convergence", is_flag=True,
              help="INPUTS is a `realrun converge-study` file (results/convergence/NAME.json): "
                   "fit the convergence model and write its profile (YAML) for a scenario's "
                   "`convergence.profile`; the report holds the held-out check and the "
                   "critical-batch fit.")
@click.option("--draws", type=click.IntRange(min=0, max=1000), default=40, show_default=True,
              help="--convergence: bootstrap refits kept in the profile for its uncertainty "
                   "band (0: the fit's covariance instead).")
@click.option("--out", "out", required=True, type=NonEmptyPath(dir_okay=False, path_type=Path),
              help="Profile to write (YAML); a scenario uses it via `--profile`.")
@click.option("--report", type=NonEmptyPath(dir_okay=False, path_type=Path),
              help="Fit report (JSON: parameters, 95% intervals, residuals); default OUT.json.")
def calibrate(inputs: tuple[Path, ...], scenario: str | None, convergence: bool, draws: int,
              out: Path, report: Path | None) -> None:
    """Fit a cluster profile to measurements: realrun bench folders, realrun traces (.jsonl),
    PyTorch profiler Chrome traces (.json, .json.gz: NCCL kernels, and with record_shapes the
    operators' times for the kernel model's efficiencies; a realrun run folder's
    profile_rank*.json are read too), nccl-tests outputs (all_reduce_perf & co.'s stdout as
    text: the NCCL model's bandwidth curves, runtime.comm.nccl_bw_curve); or, with
    --convergence, a convergence profile to `realrun converge-study` measurements."""
    import json

    from .calibration import calibrate as fit
    from .calibration import read_inputs, write_profile
    from .spec import load_scenario

    check_output(out, "--out")
    if report is None:
        if out.exists() and not out.is_file():  # a device: no file "beside" it
            raise SpecError(f"--report: --out {out} is not a regular file, so the report has "
                            "no default path (OUT.json); name it with --report")
        report = out.with_suffix(".json")
    check_output(report, "--report")
    if convergence:
        from .convergence.calibrate import calibrate_convergence

        for line in calibrate_convergence(inputs, out, report, draws=draws):
            click.echo(line)
        return
    if scenario is None:
        raise SpecError("--scenario: required to calibrate a cluster profile (the scenario "
                        "whose cluster was measured)")
    scn = load_scenario(scenario)
    samples = read_inputs(list(inputs), scn.cluster.node.gpus)
    from .calibration.samples import device_note

    note = device_note(samples, scn.cluster.node.gpu.name)
    if note:
        click.echo(note)
    profile, rep = fit(scn, samples)
    write_profile(out, profile, header=f"simfed calibrate for {scn.name} from "
                  + ", ".join(str(i) for i in inputs))
    write_text_atomic(report, json.dumps(_finite_or_null(rep), indent=2, sort_keys=True,
                                         allow_nan=False) + "\n")
    for kind, f in rep["fits"].items():
        if not f["n"]:
            click.echo(f"{kind}: {f['note']}")
            continue
        params = ", ".join(f"{k} {v['value']:.4g} {v['unit']} [{v['ci95'][0]:.3g}, "
                           f"{v['ci95'][1]:.3g}]" for k, v in f["params"].items())
        click.echo(f"{kind}: n={f['n']}, rms rel error {f['rms_rel_error']:.1%}: {params}")
        for k, v in f.get("not_used", {}).items():  # the scenario's value stands
            click.echo(f"  not used: {k} ({v['reason']}); kept: {v['kept']}")
    for k, g in rep.get("nccl_tests", {}).get("groups", {}).items():  # nccl-tests outputs
        click.echo(f"nccl-tests {k}: n={g['n']}, median |busbw error| "
                   f"{g['median_abs_error_before']:.1%} (NCCL model) -> "
                   f"{g['median_abs_error_after']:.1%} (calibrated), worst "
                   f"{g['worst_error_after']:+.1%}" + (
                       f"; AT BOUND at {g['at_bound']} B (far from the model: check the "
                       "cluster file)" if g.get("at_bound") else ""))
    click.echo(f"wrote {out} and {report}")


@main.command()
@click.argument("scenario", required=False, type=NonEmptyPath(dir_okay=False, path_type=Path))
@click.option("--published", "published", is_flag=False, flag_value="validation/published",
              default=None, type=NonEmptyPath(file_okay=False, path_type=Path),
              help="Instead: predict the published measurements in this folder (default "
                   "validation/published) and print predicted vs published tokens/s/GPU.")
@click.option("--only", "only_set", type=click.Choice(["fit", "check"]), default=None,
              help="--published: only the fit or the check set.")
@click.option("--out", "out", default="runs/validate", show_default=True,
              type=NonEmptyPath(file_okay=False, path_type=Path),
              help="Folder for benchmarks, the profile, runs and logs.")
@click.option("--json", "json_path", type=NonEmptyPath(dir_okay=False, path_type=Path))
@click.option("--fresh", is_flag=True, help="Re-run benchmarks and runs found in --out.")
@click.option("--measured-only", is_flag=True,
              help="Do not run anything: read measurements already in --out.")
@click.option("--draws", type=click.IntRange(min=0, max=1000), default=40, show_default=True,
              help="Draws of the fitted parameters per shape for the [p10, p90] intervals.")
@click.option("--show", "show", type=NonEmptyPath(dir_okay=False, path_type=Path), default=None,
              help="Instead: print a validation saved with --json (results/validate*.json) as "
                   "validate prints it; runs nothing.")
def validate(scenario: Path | None, published: Path | None, only_set: str | None, out: Path,
             json_path: Path | None, fresh: bool, measured_only: bool, draws: int,
             show: Path | None) -> None:
    """Calibrate on micro-benchmarks, run the validation shapes for real on the testbed and
    report predicted against measured step time, phases and speedups; or, with --published,
    predict published cluster measurements (a benchmark of the model's accuracy)."""
    from rich.console import Console

    from .analysis.report import write_json
    from .calibration.validate import validate as run_validation

    if show is not None:
        console = Console(width=150) if not Console().is_terminal else Console()
        _show_validation(show, console)
        return
    check_output(json_path, "--json")
    if published is None:
        check_output(out, "--out", folder=True)
    console = Console()
    if not console.is_terminal:  # a log file: room for the whole table
        console = Console(width=150)
    if published is not None:
        from .calibration.published import print_published, validate_published

        res = validate_published(published, only_set=only_set)
        print_published(res, console)
        if json_path:
            write_json(json_path, res)
            click.echo(f"wrote {json_path}")
        return
    if scenario is None:
        raise SpecError("validate: give a SCENARIO, or --published")
    res = run_validation(scenario, out, echo=lambda m: console.print(m, highlight=False),
                         reuse=not fresh, skip_runs=measured_only, draws=draws)
    _print_validation(res, console)
    if json_path:
        write_json(json_path, res)
        click.echo(f"wrote {json_path}")


def _show_validation(path: Path, console: Any) -> None:
    """A validation saved with --json, printed as validate prints it; a file that is not one
    is a SpecError (one line)."""
    import json

    what = "expected the output of simfed validate --json"
    try:
        res = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError(f"file not found: {path}") from None
    except (UnicodeDecodeError, ValueError):
        raise SpecError(f"{path}: not JSON ({what})") from None
    if not isinstance(res, dict) or not {"runs", "speedups", "summary"} <= set(res):
        raise SpecError(f"{path}: not a validation (no runs, speedups and summary: {what})")
    try:
        _print_validation(res, console)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise SpecError(f"{path}: a damaged validation ({type(exc).__name__}: {exc}; "
                        f"{what})") from None


def _print_validation(res: dict, console: Any) -> None:
    """validate's table and summary lines (predicted against measured, per run and set)."""
    from rich.table import Table

    t = Table(title=f"validation of {res['scenario']}: predicted (calibrated on micro-benchmarks "
                    "only) vs measured, ms per step (rest: compute and host work)")
    for col in ("run", "set", "measured step", "predicted step", "interval", "error",
                "fwd m/p", "bwd m/p", "opt m/p", "agg m/p", "collectives m/p", "rest m/p"):
        t.add_column(col, justify="left" if col in ("run", "set") else "right")
    for r in res["runs"]:
        mp, pp = r["measured_phases_s"], r["predicted_phases_s"]
        lo, hi = r["predicted_interval_s"]
        t.add_row(r["name"], r["split"] + (" (baseline)" if r["baseline"] else ""),
                  f"{r['measured_step_time_s'] * 1e3:.1f} ms",
                  f"{r['predicted_step_time_s'] * 1e3:.1f} ms",
                  f"{lo * 1e3:.0f}-{hi * 1e3:.0f}" + ("" if r["inside_interval"] else " !"),
                  f"{100 * r['error']:+.1f}%",
                  *[f"{mp[k] * 1e3:.0f}/{pp[k] * 1e3:.0f}" for k in
                    ("forward", "backward", "optimizer", "aggregation")],
                  *[f"{r['measured_' + k] * 1e3:.0f}/{r['predicted_' + k] * 1e3:.0f}"
                    for k in ("comm_s", "rest_s")])
    console.print(t)
    for s in res["speedups"]:
        spread = s.get("measured_launches") or [s["measured"]]
        console.print(f"  speedup {s['name']}: measured {s['measured']:.2f}x (launches "
                      f"{min(spread):.2f}-{max(spread):.2f}x), predicted "
                      f"{s['predicted']:.2f}x ({100 * s['error']:+.1f}%)", highlight=False)
    for r in res["runs"]:
        for f in r["extrapolating"]:
            console.print(f"  {r['name']}: extrapolating {f['what']} {f['value']:.4g} (samples "
                          f"{f['range'][0]:.4g}..{f['range'][1]:.4g}): interval widened "
                          f"+-{100 * f['widening_sd']:.0f}% of its share", highlight=False)
    for split, sm in res["summary"].items():  # the fit set, then the held-out check set
        if sm["median_abs_error"] is None:
            continue
        inside = sm.get("inside_interval")
        console.print(f"  {split} set: median |error| {100 * sm['median_abs_error']:.1f}% over "
                      f"{sm['runs']} runs; worst {sm['worst']['name']} "
                      f"{100 * sm['worst']['error']:+.1f}%; FL+FSDP/FSDP within 15%: "
                      f"{sm['fl_fsdp_over_fsdp_within_15pct']}/{sm['fl_fsdp_over_fsdp_pairs']}"
                      + (f"; measured inside the p10-p90 interval: {100 * inside:.0f}%"
                         if inside is not None else ""), highlight=False)
    for mech, got in res.get("mechanisms", {}).items():
        on, off = got["on"].get("check"), got["off"].get("check")
        if on and off:
            console.print(f"  mechanism {mech}: check-set median |error| on "
                          f"{100 * on['median_abs_error']:.1f}% / off "
                          f"{100 * off['median_abs_error']:.1f}%; worst FL+FSDP/FSDP on "
                          f"{100 * (on['fl_fsdp_over_fsdp_max_abs_error'] or 0):.1f}% / off "
                          f"{100 * (off['fl_fsdp_over_fsdp_max_abs_error'] or 0):.1f}%",
                          highlight=False)


@main.command()
@click.argument("scenario", type=NonEmptyPath(dir_okay=False))
@click.option("--op", type=click.Choice(["all_reduce", "all_gather", "reduce_scatter"]),
              default="all_reduce", show_default=True)
@click.option("--nodes", type=click.IntRange(min=1), default=None,
              help="Nodes (default: all of the cluster's).")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=None,
              help="GPUs per node taking part.")
@click.option("--min-bytes", default="1M", show_default=True, help="Smallest size (K/M/G).")
@click.option("--max-bytes", default="8G", show_default=True, help="Largest size (K/M/G).")
@click.option("--profile", type=NonEmptyPath(dir_okay=False), help="A profile merged over it.")
@_SET
def collective(scenario: str, op: str, nodes: int | None, gpus_per_node: int | None,
               min_bytes: str, max_bytes: str, profile: str | None,
               sets: tuple[str, ...]) -> None:
    """Print an nccl-tests-style table (size, time, algbw, busbw, NCCL's algorithm/protocol)
    from NCCL's own tuning model for the scenario's cluster."""
    from .api import byte_range, load
    from .api import collective as collective_table

    byte_range(min_bytes, max_bytes)  # a malformed size is refused before the scenario loads
    table = collective_table(load(scenario, parse_sets(sets), profile=profile), op,
                             nodes=nodes, gpus_per_node=gpus_per_node, min_bytes=min_bytes,
                             max_bytes=max_bytes)
    click.echo(f"# {op} over {table.ranks} GPUs ({table.nodes} nodes x {table.gpus_per_node}), "
               f"NCCL {table.nccl_version} model, {table.cluster}")
    click.echo(f"#{'size':>14} {'time':>10} {'algbw':>8} {'busbw':>8}  algorithm")
    click.echo(f"#{'(B)':>14} {'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8}")
    for r in table.rows:
        click.echo(f"{r.size_bytes:>15} {r.time_us:>10.1f} {r.algbw_GBps:>8.2f} "
                   f"{r.busbw_GBps:>8.2f}  {r.algorithm}/{r.protocol}")


# --- sweeps, plots and figures: commands of their own modules (keep this block last) ---
from .commands.sweep import sweep_command  # noqa: E402
from .figures import figures_command  # noqa: E402
from .plots.cli import plot_command  # noqa: E402

main.add_command(sweep_command)
main.add_command(plot_command)
main.add_command(figures_command)
# --- end of sweeps, plots and figures ---


if __name__ == "__main__":
    main()
