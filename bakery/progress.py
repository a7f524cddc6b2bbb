"""Progress on a terminal, silence elsewhere (pipes, CI, tests)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import Progress

__all__ = ["interactive", "note", "step", "warn"]

_console = Console(stderr=True)


def interactive() -> bool:
    return sys.stderr.isatty()


def _nothing() -> None:
    pass


@contextmanager
def step(
    message: str, total: int | None = None, *, show: bool | None = None
) -> Iterator[Callable[[], None]]:
    """A spinner with ``message`` while the block runs, then a done line.

    With ``total`` it is a bar instead, moved on by the ``advance()`` the block
    receives. Shown on a terminal only, unless ``show`` says otherwise; hidden,
    ``advance`` does nothing."""
    if not (interactive() if show is None else show):
        yield _nothing
        return
    if total is None:
        with _console.status(message):
            yield _nothing
    else:
        with Progress(console=_console, transient=True) as bar:
            task = bar.add_task(message, total=total)
            yield lambda: bar.advance(task)
    _console.print(f"[green]✓[/] {message}")


def warn(message: str) -> None:
    """A warning line on stderr, TTY or not (it reports something the user must know)."""
    print(f"warning: {message}", file=sys.stderr)


def note(message: str) -> None:
    """A line on a terminal only: how a step went, where someone watches it."""
    if interactive():
        _console.print(f"  {message}", highlight=False)
