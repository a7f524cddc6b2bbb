"""The root command group, `bakery`: every command group registered in one place (COMMANDS).

``main(argv) -> int`` is the console script; tests call it with a list of arguments.
"""

from __future__ import annotations

import copy
import importlib
import sys

import click

from bakery import __version__, project
from bakery.cli.boundary import run_command
from bakery.errors import BakeryError

# Each command's module is imported only when that command runs (or its own help is
# shown): `bakery --help` lists them from here, without importing vLLM-sized trees of
# modules. Each line is the command's own short help (tests/cli/test_cli_root.py checks it).
COMMANDS: dict[str, tuple[str, str]] = {
    "apply": (
        "bakery.cli.series:apply_cmd",
        "Apply PATCHES in order to TREE; nothing is written unless every hunk places.",
    ),
    "bake": (
        "bakery.cli.bake:bake_cmd",
        "Fetch the pinned wheel, apply the series, write tree + BAKED.json + wheel.",
    ),
    "bisect": (
        "bakery.cli.bake:bisect_cmd",
        "Find the first patch that makes COMMAND fail, as `git bisect run` does: bake "
        "the patches up to N (tree only), run COMMAND, exit 0 is good, anything else "
        "bad.",
    ),
    "check": (
        "bakery.cli.bake:check_cmd",
        "Re-hash a baked tree or patched site-packages: the touched files against its "
        "BAKED.json, every other file against RECORD.",
    ),
    "clean": (
        "bakery.cli.bake:clean_cmd",
        "Remove superseded wheels, reports and trash from the build folder (and the cache).",
    ),
    "doctor": (
        "bakery.cli.launch:doctor_cmd",
        "Can this host serve the series? GPUs, driver, baked tree, where vllm imports from.",
    ),
    "export": (
        "bakery.cli.export:export_cmd",
        "The pristine sources as a git repository, then one commit per patch (or "
        "stage), messages from the patches' headers: git log, blame, rebase -i, "
        "format-patch.",
    ),
    "import": (
        "bakery.cli.export:import_cmd",
        "The way back: HEAD's changes against the pristine tag become the series' "
        "patches; each commit naming a patch (Bakery-Patch:) gives it its summary, "
        "description, author.",
    ),
    "importcheck": (
        "bakery.cli.check:importcheck_cmd",
        "Import every touched module from the baked tree in a fresh interpreter.",
    ),
    "launch": (
        "bakery.cli.launch:launch",
        "Serve the baked tree with validated DCP stage gates (launcher/dcp2/run.sh).",
    ),
    "linkcheck": (
        "bakery.cli.check:linkcheck_cmd",
        "Resolve every import, call, name, config read and self.X of the patched files.",
    ),
    "rebase": (
        "bakery.cli.maintain:rebase_cmd",
        "Try the series on another release: per-hunk report, refreshed series, linkcheck.",
    ),
    "rebase-matrix": (
        "bakery.cli.maintain:rebase_matrix_cmd",
        "Patch x release table of apply status and linkcheck findings (Markdown + JSON).",
    ),
    "refresh": (
        "bakery.cli.maintain:refresh_cmd",
        "Turn edits in the baked tree into the series' per-file patches.",
    ),
    "stages": (
        "bakery.cli.series:stages_cmd",
        "Print the stage table; exit 1 if stages.toml, PLAN.md and series.toml disagree.",
    ),
    "status": (
        "bakery.cli.maintain:status_cmd",
        "What is baked (series, pins), whether it is stale, pending edits, rebase, servers.",
    ),
    "verify": (
        "bakery.cli.verify:verify",
        "Check that a candidate server answers like a baseline server (parity harness).",
    ),
}
# Hidden alias: this command's old name, so existing scripts keep working.
ALIASES = {"matrix": "rebase-matrix"}


def _load(name: str) -> click.Command:
    module, _, attr = COMMANDS[ALIASES.get(name, name)][0].partition(":")
    command = getattr(importlib.import_module(module), attr)
    if name in ALIASES:
        command = copy.copy(command)
        command.hidden = True
    return command


class _Commands(dict):
    """Every name of COMMANDS and ALIASES; each command imported at its first lookup."""

    def __init__(self) -> None:
        super().__init__((name, None) for name in [*COMMANDS, *ALIASES])

    def __getitem__(self, name: str) -> click.Command:
        command = super().__getitem__(name)
        if command is None:
            command = _load(name)
            super().__setitem__(name, command)
        return command

    def get(self, name, default=None):
        return self[name] if name in self else default

    def values(self):
        return [self[name] for name in self]

    def items(self):
        return [(name, self[name]) for name in self]


class _LazyGroup(click.Group):
    """A group whose commands are imported when one is asked for."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.commands = _Commands()

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """As click lists them, from COMMANDS' lines instead of the imported commands."""
        limit = formatter.width - 6 - max(len(name) for name in COMMANDS)
        # A stand-in command per line shortens it exactly as the real one would be.
        rows = [(name, click.Command(name, help=line).get_short_help_str(limit))
                for name, (_, line) in sorted(COMMANDS.items())]  # fmt: skip
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _print_version(ctx, param, value) -> None:
    """--version: the tool, and the series of this checkout with its pins."""
    if not value or ctx.resilient_parsing:
        return
    click.echo(f"bakery {__version__}")
    from bakery.series.series import load_series  # only here: it imports msgspec and more

    try:
        series = load_series(project.root() / project.SERIES)
    except BakeryError as exc:
        click.echo(f"series: none ({exc})")
        ctx.exit(0)
    click.echo(f"series {series.name} sha256 {series.sha256}")
    for pin in [*series.bases.values(), *series.dependencies.values()]:
        click.echo(f"  {pin.key}: {pin.requirement} sha256 {pin.sha256}")
    ctx.exit(0)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
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


def main(argv: list[str] | None = None) -> int:
    return run_command(cli, argv, "bakery")


if __name__ == "__main__":
    sys.exit(main())
