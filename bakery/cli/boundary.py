"""The one error boundary: bakery's errors become one ``error:`` line and an exit code.

``run_command(command, argv, prog)`` runs a click command; a ``BakeryError`` becomes one
``error: ...`` line plus an optional ``hint:`` line and its exit code (1: the work failed,
2: bad usage or unreadable input, 3: a launcher preflight refusal). No traceback reaches
the user from any command group: every entry point goes through here.
"""

from __future__ import annotations

import click

from bakery.errors import BakeryError

__all__ = ["run_command"]


def run_command(command: click.Command, argv: list[str] | None, prog_name: str) -> int:
    """Run a click command; bakery's errors become one ``error:`` line and an exit code."""
    try:
        result = command.main(args=argv, prog_name=prog_name, standalone_mode=False)
    except BakeryError as exc:
        click.echo(f"error: {exc}", err=True)
        if exc.hint:
            click.echo(f"hint: {exc.hint}", err=True)
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("aborted", err=True)
        return 130
    except OSError as exc:  # disk full, permissions: the user's world, not a bug
        where = f": {exc.filename!r}" if exc.filename else ""
        click.echo(f"error: {exc.strerror or exc}{where}", err=True)
        click.echo("hint: free space or fix the permission named, then run it again", err=True)
        return 1
    return result if isinstance(result, int) else 0
