"""The engine's scaling case (issue 26): one large file and one diff of many hunks.

``big_case(30_000)`` is the benchmark's case: a 300k-line file and an ~8 MB diff of 30k hunks
(`make bench` times it against GNU `patch --dry-run`); tests use a smaller one. Deterministic
(seeded); every 3000 lines the file carries a line the diff does not know, so hunks place
at growing offsets as they do against a drifted base. Stdlib only.
"""

from __future__ import annotations

import random

__all__ = ["big_case"]

LINES_PER_HUNK = 10  # the file is 10 lines per hunk: 300k lines for 30k hunks
_DRIFT_EVERY = 3000  # a line the diff does not know, every this many lines


def _line(rng: random.Random, number: int) -> bytes:
    if number % 7 == 0:
        return b"\n"  # blank lines repeat, as in real code
    if number % 11 == 0:
        return b"        return result\n"
    name = "".join(rng.choices("abcdefghijklmnopqrstuvwxyz_", k=rng.randint(2, 8)))
    return f"    {name}{number} = f({rng.randint(0, 999)})\n".encode()


def big_case(hunks: int, seed: int = 26) -> tuple[bytes, bytes]:
    """(target file, diff of ``hunks`` hunks against it), both bytes."""
    rng = random.Random(seed)
    old = [_line(rng, i) for i in range(hunks * LINES_PER_HUNK)]
    out = [b"--- a/pkg/big.py\n+++ b/pkg/big.py\n"]
    shift = 0  # new-side line numbers run ahead of old-side ones by this much
    for index in range(hunks):
        start = index * LINES_PER_HUNK + 1  # 0-based first context line, one line in
        removed = rng.randint(1, 2)
        added = [
            f"    new{index}_{k} = g({rng.randint(0, 9999)}, {k})  # new\n".encode()
            for k in range(rng.randint(1, 3))
        ]
        before, after = old[start : start + 3], old[start + 3 + removed : start + 6 + removed]
        old_len, new_len = 6 + removed, 6 + len(added)
        out.append(f"@@ -{start + 1},{old_len} +{start + 1 + shift},{new_len} @@\n".encode())
        out.extend(b" " + line for line in before)
        out.extend(b"-" + line for line in old[start + 3 : start + 3 + removed])
        out.extend(b"+" + line for line in added)
        out.extend(b" " + line for line in after)
        shift += len(added) - removed
    target = []
    for number, line in enumerate(old):
        if number and number % _DRIFT_EVERY == 0:
            target.append(f"# drift {number}\n".encode())
        target.append(line)
    return b"".join(target), b"".join(out)
