"""The `realrun` command line: `run` (one host, torchrun for you), plus `bench` and `testbed`
when those modules are installed."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from simfed.spec import SpecError
from simfed.spec.messages import internal_error_line, one_line, shown
from simfed.spec.overrides import parse_sets
from simfed.spec.paths import check_output

from .emulator_cost import check_converge_cost
from .errors import EXIT_BAD_INPUT, EXIT_INTERNAL, RealrunError


class _Group(click.Group):
    """simfed's error contract: bad input (SpecError, RealrunError) or a file that cannot be
    read or written is one line and exit status 2 (long values cut); anything else is a fault
    of realrun: one line naming a log file with the traceback, exit status EXIT_INTERNAL (4:
    realrun's 3 is a rank that lost its peers), never a raw traceback."""

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except (SpecError, RealrunError) as exc:
            click.echo(f"error: {one_line(str(exc))}", err=True)
            sys.exit(EXIT_BAD_INPUT)
        except (click.exceptions.ClickException, click.exceptions.Exit,
                click.exceptions.Abort, SystemExit):
            raise
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)
        except OSError as exc:  # the file system: a full disk, a path that went away
            name = f" {exc.filename}" if exc.filename else ""
            click.echo(one_line(f"error: cannot access{name}: {exc.strerror or exc}"), err=True)
            sys.exit(EXIT_BAD_INPUT)
        except Exception as exc:  # RecursionError and MemoryError included
            click.echo(internal_error_line("realrun", exc, sys.argv[1:]), err=True)
            sys.exit(EXIT_INTERNAL)


def parse_seeds(text: str) -> list[int]:
    """`--seeds A,B,...`: integers 0 .. 2^63 - 1 (torch's seed range)."""
    try:
        seeds = [int(s) for s in text.split(",")]
    except ValueError:
        raise RealrunError(f"--seeds {shown(text)}: expected integers separated by commas") \
            from None
    for s in seeds:
        if not 0 <= s < 2**63:
            raise RealrunError(f"--seeds: {s} is not a seed (0 to 2^63 - 1)")
    return seeds


@click.group(cls=_Group)
@click.version_option(package_name="simfed")
def main() -> None:
    """Run FSDP, HSDP, FL+FSDP and FL+HSDP for real with PyTorch and trace them."""


@main.command("run")
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--algorithm", "-a", required=True,
              help="fsdp, hsdp, fl_fsdp, fl_hsdp (or a label); a comma list or `all` runs "
              "several in one launch, each into OUT/NAME")
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="output directory: trace_rank{r}.jsonl, trace.json, summary.json")
@click.option("--nproc", type=int, default=None,
              help="processes on this host (default and only valid value: the scenario's ranks)")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="override a scenario key, e.g. --set training.steps=8 (repeatable)")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
              show_default=True, help="auto: cuda + NCCL if available, else cpu + gloo")
@click.option("--timeout-s", type=float, default=120.0, show_default=True,
              help="collective timeout: a dead or hung rank ends the run after this")
@click.option("--profile-steps", default="", metavar="A:B",
              help="torch.profiler over steps A..B-1 -> OUT/profile_rank{r}.json")
@click.option("--dump-fedavg", is_flag=True,
              help="save every rank's shards before and after each FedAvg round (checks)")
@click.option("--kill-rank", type=int, default=-1, help="fault injection: this rank ...")
@click.option("--kill-at-step", type=int, default=-1, help="... at this step")
@click.option("--kill-signal", type=click.Choice(["KILL", "STOP"]), default="KILL",
              show_default=True, help="... with SIGKILL (dies) or SIGSTOP (hangs)")
@click.option("--kill-in", type=click.Choice(["step", "aggregation"]), default="step",
              show_default=True,
              help="... at the step's start, or inside its FedAvg round (peers in the all-reduce)")
@click.option("--quiet", "-q", is_flag=True, help="no progress lines")
def run_command(scenario: str, algorithm: str, out: Path, nproc: int | None,
                overrides: tuple[str, ...], device: str, timeout_s: float, profile_steps: str,
                dump_fedavg: bool, kill_rank: int, kill_at_step: int, kill_signal: str,
                kill_in: str, quiet: bool) -> None:
    """Train SCENARIO's ALGORITHM on this host with torchrun (one process per rank)."""
    from .launch import RunRequest, run

    check_output(out, "--out", folder=True)  # before any process starts
    code = run(RunRequest(
        scenario=scenario, algorithm=algorithm, out=out, nproc=nproc, overrides=overrides,
        device=device, timeout_s=timeout_s, profile_steps=profile_steps,
        dump_fedavg=dump_fedavg, kill_rank=kill_rank, kill_at_step=kill_at_step,
        kill_signal=kill_signal, kill_in=kill_in, echo=not quiet,
    ))
    sys.exit(code)


@main.command("converge")
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("--algorithm", "-a", default="all", show_default=True,
              help="fsdp, hsdp, fl_fsdp, fl_hsdp (or a label), a comma list, or `all`")
@click.option("--seeds", default="", metavar="A,B,...",
              help="model-initialisation seeds (default: the scenario's seed)")
@click.option("--eval-every", type=int, default=0,
              help="evaluate the groups' mean model every N steps (default: at the end only)")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="override a scenario key, e.g. --set training.steps=8 (repeatable)")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="write every curve (per-step and evaluation losses) as JSON")
def converge_command(scenario: str, algorithm: str, seeds: str, eval_every: int,
                     overrides: tuple[str, ...], json_out: Path | None) -> None:
    """Emulate the optimizer math of SCENARIO's algorithms, every federation group in this one
    process (no torchrun): the losses `realrun run` would give, at any number of groups."""

    from simfed.spec import load_scenario

    from .config import select_algorithms
    from .converge import emulate, perplexity
    from .data import load_corpus

    if eval_every < 0:
        raise RealrunError(f"--eval-every: must be >= 0, got {eval_every}")
    seed_list: list[int | None] = list(parse_seeds(seeds)) if seeds else [None]
    check_output(json_out, "--json")  # before any training
    sc = load_scenario(scenario, parse_sets(overrides))
    algos = select_algorithms(sc, algorithm)
    check_converge_cost(sc, algos)  # before anything is allocated
    corpus = load_corpus(sc, Path(scenario))
    curves = []
    for algo in algos:
        for seed in seed_list:
            c = emulate(sc, algo, corpus, seed=seed, eval_every=eval_every)
            curves.append(c)
            click.echo(f"{c.label:10s} seed {c.seed}: {c.groups} x {c.batch_per_model} seqs/step"
                       f", K {c.aggregate_every or '-'}: train loss {c.train_loss[0]:.4f} -> "
                       f"{c.train_loss[-1]:.4f}, eval ppl {perplexity(c.eval_loss[0]):.2f} -> "
                       f"{perplexity(c.eval_loss[-1]):.2f} ({c.wall_s:.1f} s)")
    if json_out is not None:
        from .convergence_study import write_json_atomic

        write_json_atomic(json_out, {"scenario": sc.name, "curves": [c.to_json()
                                                                     for c in curves]})


@main.command("converge-study")
@click.option("--out", "-o", type=click.Path(file_okay=False, path_type=Path),
              default=Path("results/convergence"), show_default=True)
@click.option("--only", multiple=True, help="run only this experiment (repeatable)")
@click.option("--seeds", default="0,1,2", show_default=True, metavar="A,B,...")
@click.option("--quick", is_flag=True, help="8 steps and a small evaluation set (tests)")
def converge_study_command(out: Path, only: tuple[str, ...], seeds: str, quick: bool) -> None:
    """Regenerate the convergence measurements (results/convergence/*.json) that `simfed
    calibrate --convergence` fits; an interrupted study resumes where it stopped."""
    from .convergence_study import experiment, run_study

    seed_list = tuple(parse_seeds(seeds))
    check_output(out, "--out", folder=True)
    for name in only:  # before anything runs; an unknown name is bad input (exit 2)
        try:
            experiment(name)
        except SystemExit as exc:
            raise RealrunError(str(exc.code).removeprefix("error: ")) from None
    for path in run_study(out, only, seed_list, quick):
        click.echo(f"wrote {path}")


@main.command("converge-bench")
@click.option("--groups", type=int, default=128, show_default=True,
              help="federation groups of the FL+FSDP case (one node of 4 ranks each)")
@click.option("--steps", type=int, default=8, show_default=True)
def converge_bench_command(groups: int, steps: int) -> None:
    """How fast the emulator runs G federation groups: FL+FSDP with G groups of 4 sequences
    against one FSDP model on the same 4 x G sequences per step (the same FLOPs), best of 2."""
    import time

    from simfed.spec import load_scenario

    from .converge import emulate
    from .convergence_study import BASE
    from .data import load_corpus

    if groups < 2 or steps < 1:
        raise RealrunError(f"--groups must be >= 2 and --steps >= 1, got {groups}, {steps}")
    sc = load_scenario(BASE, {"cluster.nodes": groups, "training.steps": steps,
                              "training.eval_sequences": 8})
    check_converge_cost(sc, [sc.algorithm("fsdp"), sc.algorithm("fl_fsdp")])
    corpus = load_corpus(sc, BASE)
    best = {}
    for name in ("fsdp", "fl_fsdp", "fsdp", "fl_fsdp"):
        t0 = time.perf_counter()
        emulate(sc, sc.algorithm(name), corpus, keep_group_losses=False)
        best[name] = min(best.get(name, float("inf")), time.perf_counter() - t0)
    seqs = 4 * groups * steps
    click.echo(f"FSDP, 1 model x {4 * groups} sequences: {best['fsdp']:.2f} s "
               f"({seqs / best['fsdp']:.0f} sequences/s)")
    click.echo(f"FL+FSDP, {groups} models x 4 sequences: {best['fl_fsdp']:.2f} s "
               f"({seqs / best['fl_fsdp']:.0f} sequences/s)")
    click.echo(f"FL+FSDP / FSDP time: {best['fl_fsdp'] / best['fsdp']:.2f}x (goal <= 1.5x)")


def _register_optional() -> None:
    """`bench` and `testbed` live in modules another part of the project provides."""
    try:
        from .bench import bench_command

        main.add_command(bench_command, "bench")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__package__}.bench":
            raise
    try:
        from .testbed import testbed_group

        main.add_command(testbed_group, "testbed")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__package__}.testbed":
            raise


_register_optional()


if __name__ == "__main__":
    main()
