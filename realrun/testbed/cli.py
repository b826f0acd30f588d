"""`realrun testbed up | down | status | run`."""

from __future__ import annotations

import json
from collections.abc import Sequence

import click

from simfed.spec import Scenario, SpecError, load_scenario
from simfed.spec.overrides import parse_sets

from .cluster import Testbed, cleanup, describe, testbed_for, testbed_prefixes, testbed_status
from .netns import privilege_problem
from .spec import DEFAULT_PREFIX, TestbedError, TestbedSpec


def _load(scenario: str, sets: Sequence[str]) -> Scenario:
    try:
        return load_scenario(scenario, parse_sets(sets))
    except SpecError as exc:
        raise TestbedError(str(exc)) from None


def _fail(exc: Exception) -> None:
    click.echo(f"error: {exc}", err=True)
    raise SystemExit(2)


_prefix_option = click.option("--prefix", default=DEFAULT_PREFIX, show_default=True,
                              help="name prefix of the namespaces and links")
_set_option = click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                           help="override a scenario value, e.g. cluster.nodes=4")
_rate_option = click.option("--rate-Gbps", "rate_Gbps", type=float, default=None,
                            help="link rate per node (default: nics.bw_Gbps x count)")


def _spec_from(scenario: str, sets: Sequence[str], prefix: str, rate_Gbps: float | None,
               latency: bool) -> TestbedSpec:
    scn = _load(scenario, sets)
    spec = TestbedSpec.from_scenario(scn, prefix=prefix, emulate_latency=latency,
                                     source=scenario)
    if rate_Gbps is not None:
        spec = spec.replace(rate_Gbps=rate_Gbps)
    return spec


@click.group("testbed")
def testbed_group() -> None:
    """An emulated multi-node cluster on this machine (network namespaces + tc), as root."""


@testbed_group.command("up")
@click.argument("scenario", type=click.Path(dir_okay=False))
@_prefix_option
@_set_option
@_rate_option
@click.option("--latency/--no-latency", default=False,
              help="also add nics.latency_us with netem (if the kernel has it)")
def up_command(scenario: str, prefix: str, sets: tuple[str, ...], rate_Gbps: float | None,
               latency: bool) -> None:
    """Build the testbed a SCENARIO's cluster section describes, and leave it up."""
    try:
        spec = _spec_from(scenario, sets, prefix, rate_Gbps, latency)
        Testbed(spec).up()
    except (TestbedError, SpecError) as exc:
        _fail(exc)
    click.echo(describe(spec))
    click.echo(f"remove it with: realrun testbed down --prefix {prefix}")


@testbed_group.command("down")
@_prefix_option
@click.option("--all", "all_", is_flag=True, help="remove every testbed found")
def down_command(prefix: str, all_: bool) -> None:
    """Remove a testbed (namespaces, links, qdiscs, its processes); safe to repeat."""
    problem = privilege_problem()
    if problem:
        _fail(TestbedError(problem))
    try:
        prefixes = testbed_prefixes() if all_ else [prefix]
        removed = [r for p in prefixes for r in cleanup(p)]
    except TestbedError as exc:
        _fail(exc)
    click.echo(f"removed {len(removed)}: {', '.join(removed)}" if removed else "nothing to remove")


@testbed_group.command("status")
@_prefix_option
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def status_command(prefix: str, as_json: bool) -> None:
    """Show the testbeds on this machine as the kernel reports them."""
    problem = privilege_problem()
    if problem:
        _fail(TestbedError(problem))
    try:
        prefixes = sorted(set(testbed_prefixes()) | {prefix})
        states = [st for p in prefixes if (st := testbed_status(p))["namespaces"] or st["spec"]]
    except TestbedError as exc:
        _fail(exc)
    if as_json:
        click.echo(json.dumps(states, indent=1))
        return
    if not states:
        click.echo("no testbed is up")
    for st in states:
        head = describe(TestbedSpec(**st["spec"])) if st["spec"] else f"testbed {st['prefix']}"
        click.echo(head + ("" if st["complete"] else "  [INCOMPLETE: run `down`]"))
        for n in st["nodes"]:
            click.echo(f"  {n['namespace']:<10} {n['ifname']:<8} {n['addr']:<16} "
                       f"out: {'; '.join(n['egress'])}  in: {'; '.join(n['ingress'])}")


@testbed_group.command("run", context_settings={"ignore_unknown_options": True})
@click.argument("scenario", type=click.Path(dir_okay=False))
@click.option("-m", "--module", default="realrun.train", show_default=True,
              help="python module torchrun starts on every rank")
@click.option("--timeout-s", type=float, default=600.0, show_default=True)
@click.option("--log-dir", type=click.Path(file_okay=False), default=None)
@_prefix_option
@_set_option
@_rate_option
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run_command(scenario: str, module: str, timeout_s: float, log_dir: str | None, prefix: str,
                sets: tuple[str, ...], rate_Gbps: float | None, args: tuple[str, ...]) -> None:
    """Run `torchrun -m MODULE ARGS` across the testbed's nodes (on the one `up` left, or on a
    temporary one built from SCENARIO). Example:
    realrun testbed run scenarios/testbed.yaml -- scenarios/testbed.yaml --algorithm fsdp --out o"""
    try:
        scn = _load(scenario, sets)
        with testbed_for(scn, prefix=prefix, rate_Gbps=rate_Gbps, source=scenario,
                         echo=lambda m: click.echo(m, err=True)) as tb:
            result = tb.launch(module, args, timeout_s=timeout_s, log_dir=log_dir)
    except (TestbedError, SpecError) as exc:
        _fail(exc)
    for n in result.nodes:
        click.echo(f"--- node {n.node} (exit {n.returncode}), log {n.log_path}")
        click.echo(n.output.rstrip()[-4000:])
    if not result.ok:
        _fail(TestbedError(result.summary()))
