"""The launcher's argument helpers: value types (seconds, ports), and `start`'s own
command line as a run records it, every path made absolute, for `restart`."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import click

__all__ = ["PORT", "SECONDS", "is_path", "model_path", "port_of", "start_argv"]

PORT = click.IntRange(1, 65535)


class _Seconds(click.ParamType):
    """A finite number of seconds, >= 0 (``nan`` and ``inf`` would make every wait odd)."""

    name = "seconds"

    def convert(self, value, param, ctx):
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(seconds) or seconds < 0:
            self.fail(f"{value!r} is not a finite number >= 0", param, ctx)
        return seconds


SECONDS = _Seconds()


def model_path(value: str | None) -> str | None:
    """A --model that exists from the caller's cwd becomes absolute (vLLM runs at the root)."""
    if value and Path(value).exists():  # "" is no path (Path("") is the cwd)
        return str(Path(value).resolve())
    return value


@dataclass(frozen=True)
class Restart:
    """What `restart` hands each `start` it runs (as click's ``ctx.obj``): the run's own
    `start` argv, whether only its preflight runs (would it be refused?), and the ports
    the servers it stops hold (counted as free)."""

    start_argv: list[str]
    preflight_only: bool = False
    held_ports: tuple[int, ...] = ()


def restart_of(ctx: click.Context) -> Restart | None:
    """The restart this `start` runs for (None: run as itself)."""
    return ctx.obj if isinstance(ctx.obj, Restart) else None


def is_path(ref: str) -> bool:
    return ref.endswith(".toml") or "/" in ref  # as profiles.load_profile reads it


def start_argv(ctx: click.Context, absolute: dict[str, str | None]) -> list[str]:
    """`start` and its arguments as given (a restart passes them in ctx.obj), with every
    path made absolute (``absolute``: option -> its absolute value): `restart` runs them
    again from any folder. Nothing after ``--`` (vLLM's own arguments) is touched."""
    restart = restart_of(ctx)
    argv = list((restart.start_argv if restart else None) or sys.argv[1:])
    argv = argv[argv.index("start") :] if "start" in argv else ["start", *argv]
    out: list[str] = []
    words = iter(argv)
    for arg in words:
        if arg == "--":
            out += [arg, *words]
            break
        name, eq, _ = arg.partition("=")
        value = absolute.get(name)
        if value and eq:
            out.append(f"{name}={value}")
        elif value:
            out += [arg, value]
            next(words, None)
        else:
            out.append(arg)
    return out


def port_of(url: str | None) -> int | None:
    try:
        return urlsplit(url).port if url else None
    except ValueError:
        return None
