"""Progress on a terminal, silence elsewhere (pipes, CI, tests)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console

__all__ = ["interactive", "step", "warn"]

_console = Console(stderr=True)


def interactive() -> bool:
    return sys.stderr.isatty()


@contextmanager
def step(message: str) -> Iterator[None]:
    """A spinner with ``message`` while the block runs, then a done line (TTY only)."""
    if not interactive():
        yield
        return
    with _console.status(message):
        yield
    _console.print(f"[green]✓[/] {message}")


def warn(message: str) -> None:
    """A warning line on stderr, TTY or not (it reports something the user must know)."""
    print(f"warning: {message}", file=sys.stderr)
