"""Issue 26, item 4: `bakery --help` imports no command group (the speed is in `make
bench`); the lines it lists are each command's own short help."""

from __future__ import annotations

import subprocess
import sys

import click

from bakery.cli.root import ALIASES, COMMANDS, cli
from tests.conftest import REPO

PROBE = """
import sys
from bakery.cli.root import main
code = main(sys.argv[1:])
print(sorted(m for m in sys.modules if m.startswith(("bakery", "msgspec", "unidiff", "httpx"))))
"""


def _loaded(*argv: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=REPO,
                          capture_output=True, text=True, check=True)  # fmt: skip
    return eval(proc.stdout.splitlines()[-1])


def test_help_imports_no_command_group():
    assert _loaded("--help") == [
        "bakery", "bakery.cli", "bakery.cli.boundary", "bakery.cli.root", "bakery.errors",
        "bakery.project",
    ]  # fmt: skip


def test_a_command_imports_its_own_group_only():
    loaded = _loaded("stages", "--help")
    assert "bakery.cli.series" in loaded
    assert not {"bakery.cli.launch", "bakery.cli.verify", "bakery.cli.maintain"} & set(loaded)


def test_every_listed_line_is_the_commands_own_short_help():
    ctx = click.Context(cli)
    for name, (_, line) in COMMANDS.items():
        command = cli.get_command(ctx, name)
        assert command is not None and command.get_short_help_str(10_000) == line, name
        assert command.name == name and not command.hidden
    for alias, name in ALIASES.items():
        command = cli.get_command(ctx, alias)
        assert command is not None and command.hidden
        assert command.callback is cli.get_command(ctx, name).callback
    assert cli.get_command(ctx, "nope") is None


def test_planted_listing_from_the_commands_is_caught():
    """click's own listing asks every command for its help: it imports every group."""
    plant = "import click, bakery.cli.root as r; r._LazyGroup.format_commands = " \
        "click.Group.format_commands\n"  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", plant + PROBE, "--help"], cwd=REPO,
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert "bakery.cli.launch" in eval(proc.stdout.splitlines()[-1])
