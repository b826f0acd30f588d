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


@main.command()
def schema() -> None:
    """Print every scenario key with its type, default and meaning."""
    from .spec.scenario import Scenario
    from .spec.schema import describe

    click.echo(describe(Scenario))
