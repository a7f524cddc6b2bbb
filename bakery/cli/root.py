"""The root command group, `bakery`: every command group registered in one place.

``main(argv) -> int`` is the console script; tests call it with a list of arguments.
"""

from __future__ import annotations

import copy
import sys

import click

from bakery import __version__, project
from bakery.cli.bake import bake_cmd, bisect_cmd, check_cmd, clean_cmd
from bakery.cli.boundary import run_command
from bakery.cli.check import importcheck_cmd, linkcheck_cmd
from bakery.cli.export import export_cmd, import_cmd
from bakery.cli.launch import doctor_cmd
from bakery.cli.launch import launch as launch_group
from bakery.cli.maintain import rebase_cmd, rebase_matrix_cmd, refresh_cmd, status_cmd
from bakery.cli.series import apply_cmd, stages_cmd
from bakery.cli.verify import verify
from bakery.errors import BakeryError
from bakery.series.series import load_series


def _print_version(ctx, param, value) -> None:
    """--version: the tool, and the series of this checkout with its pins."""
    if not value or ctx.resilient_parsing:
        return
    click.echo(f"bakery {__version__}")
    try:
        series = load_series(project.root() / project.SERIES)
    except BakeryError as exc:
        click.echo(f"series: none ({exc})")
        ctx.exit(0)
    click.echo(f"series {series.name} sha256 {series.sha256}")
    for pin in [*series.bases.values(), *series.dependencies.values()]:
        click.echo(f"  {pin.key}: {pin.requirement} sha256 {pin.sha256}")
    ctx.exit(0)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the tool version, the series sha256 and the pins, and exit.",
)
def cli() -> None:
    """Bake a patch series onto a pinned vLLM wheel."""


for command in (
    apply_cmd,
    stages_cmd,
    bake_cmd,
    bisect_cmd,
    check_cmd,
    clean_cmd,
    importcheck_cmd,
    linkcheck_cmd,
    refresh_cmd,
    rebase_cmd,
    rebase_matrix_cmd,
    status_cmd,
    export_cmd,
    import_cmd,
    verify,
    launch_group,
    doctor_cmd,  # `bakery doctor`: the launcher's host checks, no profile
):
    cli.add_command(command)
# Hidden alias: this command's old name, so existing scripts keep working.
cli.add_command(copy.copy(rebase_matrix_cmd), "matrix")
cli.commands["matrix"].hidden = True


def main(argv: list[str] | None = None) -> int:
    return run_command(cli, argv, "bakery")


if __name__ == "__main__":
    sys.exit(main())
