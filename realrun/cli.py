"""The `realrun` command line: `run` (one host, torchrun for you), plus `bench` and `testbed`
when those modules are installed."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from simfed.spec import SpecError

from .errors import EXIT_BAD_INPUT, RealrunError


class _Group(click.Group):
    """Bad input (SpecError, RealrunError) becomes one line and exit status 2."""

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except (SpecError, RealrunError) as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(EXIT_BAD_INPUT)


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
@click.option("--kill-at-step", type=int, default=-1, help="... at the start of this step")
@click.option("--kill-signal", type=click.Choice(["KILL", "STOP"]), default="KILL",
              show_default=True, help="... with SIGKILL (dies) or SIGSTOP (hangs)")
@click.option("--quiet", "-q", is_flag=True, help="no progress lines")
def run_command(scenario: str, algorithm: str, out: Path, nproc: int | None,
                overrides: tuple[str, ...], device: str, timeout_s: float, profile_steps: str,
                dump_fedavg: bool, kill_rank: int, kill_at_step: int, kill_signal: str,
                quiet: bool) -> None:
    """Train SCENARIO's ALGORITHM on this host with torchrun (one process per rank)."""
    from .launch import RunRequest, run

    code = run(RunRequest(
        scenario=scenario, algorithm=algorithm, out=out, nproc=nproc, overrides=overrides,
        device=device, timeout_s=timeout_s, profile_steps=profile_steps,
        dump_fedavg=dump_fedavg, kill_rank=kill_rank, kill_at_step=kill_at_step,
        kill_signal=kill_signal, echo=not quiet,
    ))
    sys.exit(code)


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
