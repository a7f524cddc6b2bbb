"""The launcher's own failures, all BakeryError subclasses (one ``error:`` line each).

Exit codes: 2 a profile or flag that cannot be read, 3 a preflight refusal
(nothing was started), 1 a server that was started and failed.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from bakery.errors import BakeryError, UsageError

__all__ = ["LaunchError", "LaunchInterrupted", "ProfileError", "PreflightError", "Problem"]


class LaunchError(BakeryError):
    """The server was started and did not become ready, or could not be stopped."""

    exit_code = 1


class LaunchInterrupted(LaunchError):
    """SIGINT or SIGTERM arrived during start; the group was torn down. Exit 128 + signal."""

    def __init__(self, signum: int, log) -> None:
        name = signal.Signals(signum).name
        super().__init__(
            f"interrupted by {name} during start; the server was torn down", hint=f"its log: {log}"
        )
        self.exit_code = 128 + signum


class ProfileError(UsageError):
    """A profile file or an override that cannot be read or is malformed."""


@dataclass(frozen=True)
class Problem:
    """One refusal: ``what failed (why): value`` plus the way out."""

    what: str
    why: str
    value: str
    hint: str

    def __str__(self) -> str:
        return f"{self.what} ({self.why}): {self.value}"


class PreflightError(BakeryError):
    """Every reason the launch was refused, found in one pass before any side effect."""

    exit_code = 3

    def __init__(self, problems: tuple[Problem, ...]) -> None:
        lines = [f"preflight refused the launch ({len(problems)} problem(s)); nothing started"]
        for problem in problems:
            lines.append(f"  - {problem}")
            lines.append(f"    fix: {problem.hint}")
        super().__init__("\n".join(lines), hint="fix every problem above, then run again")
        self.problems = problems
