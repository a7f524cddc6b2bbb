"""Every git command bakery runs goes through ``run``: in an environment of its own.

Nothing of the caller's git reaches it: no ``GIT_*`` variable (git sets ``GIT_DIR`` and
``GIT_INDEX_FILE`` for its hooks: inherited, they turn an export into commits in another
repository), no global or system config (an ``excludesFile`` empties a commit,
``autocrlf`` rewrites a CRLF line), and the settings that change what a commit holds
are given on the command line. A repository's own ``.git/config`` still holds in it, but
for the hook and fsmonitor commands it could name, which never run.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

__all__ = ["run", "environment"]

# Each one keeps a commit byte for byte what bakery wrote, whatever the repository says.
_CONFIG = (
    "core.autocrlf=false",  # no CRLF -> LF on add, no LF -> CRLF on checkout
    "core.safecrlf=false",  # and no refusal of mixed line ends either
    "core.excludesFile=/dev/null",  # a user's ignore list never drops a patched file
    "core.attributesFile=/dev/null",  # nor do their eol/filter attributes apply
    "core.hooksPath=/dev/null",  # no hook of theirs runs in our repository
    "commit.gpgSign=false",  # nor does signing, which needs their keys and a prompt
    "core.fsmonitor=false",  # nor a command an imported repository's config names
)


def environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The caller's environment less every ``GIT_*`` variable, with no global or system
    git config, plus ``extra`` (bakery's own ``GIT_AUTHOR_*``, say)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    env.update(GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1", GIT_TERMINAL_PROMPT="0")
    env.update(extra or {})
    return env


def run(
    args: Sequence[str],
    *,
    repo: Path | None = None,
    env: dict[str, str] | None = None,
    data: bytes | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """``git [-C repo] ARGS`` in ``environment(env)``, output captured as bytes; a git
    that is not installed raises ``FileNotFoundError`` (each caller says what it needs git for)."""
    where = ["-C", str(repo)] if repo is not None else []
    config = [arg for setting in _CONFIG for arg in ("-c", setting)]
    return subprocess.run(
        ["git", *where, *config, *args],
        input=data,
        capture_output=True,
        env=environment(env),
        check=False,
    )
