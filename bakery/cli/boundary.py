"""The one error boundary: bakery's errors become one ``error:`` line and an exit code.

``run_command(command, argv, prog)`` runs a click command; a ``BakeryError`` becomes one
``error: ...`` line plus an optional ``hint:`` line and its exit code (1: the work failed,
2: bad usage or unreadable input, 3: a launcher preflight refusal). No traceback reaches
the user from any command group: every entry point goes through here.
"""

from __future__ import annotations

import errno

import click

from bakery.errors import BakeryError, InputTooLarge, UnreadableInput

__all__ = ["run_command"]


# The disk failed the work (exit 1; EFBIG: the kernel refused a write past the file size
# limit); any other OSError is a path that cannot be read or written as given: missing,
# not ours, not a regular file, an input over the read bound (exit 2).
_DISK = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG}


def _as_bakery_error(exc: OSError) -> BakeryError:
    """An OSError that reached the boundary, as the error it is for the user."""
    where = f": {exc.filename!r}" if exc.filename else ""
    text = f"{exc.strerror or exc}{where}"
    if exc.errno in _DISK and not isinstance(exc, InputTooLarge):
        return BakeryError(text, hint="free space (or make the disk writable), then run it again")
    return UnreadableInput(
        text,
        hint="check the path named: it must exist, be a regular file where a file is "
        "expected, and be yours to read (or write, for an output)",
    )


def _report(exc: BakeryError) -> int:
    click.echo(f"error: {exc}", err=True)
    if exc.hint:
        click.echo(f"hint: {exc.hint}", err=True)
    return exc.exit_code


def run_command(command: click.Command, argv: list[str] | None, prog_name: str) -> int:
    """Run a click command; bakery's errors become one ``error:`` line and an exit code."""
    try:
        result = command.main(args=argv, prog_name=prog_name, standalone_mode=False)
    except BakeryError as exc:
        return _report(exc)
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("aborted", err=True)
        return 130
    except OSError as exc:  # disk full, permissions: the user's world, not a bug
        return _report(_as_bakery_error(exc))
    return result if isinstance(result, int) else 0
