"""Where a checkout stands: what is baked from which series and pins, whether it is
stale, which edits `refresh` would pick up, a rebase in progress, running servers (listed
by the command line, which may read the launcher's records).

Read-only and offline: it reads BAKED.json, the trees and the pristine trees as
they are, and never fetches or extracts (no intact pristine tree makes the pending
edits "unknown", not a download).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import msgspec

from bakery import __version__
from bakery.bake import manifest
from bakery.bake.bake import (
    baked_wheel,
    staleness,
    superseded_wheels,
    tree_dir,
)
from bakery.bake.fetch import cache_dir
from bakery.bake.pristine import compared_pristine, pristine_edits
from bakery.maintain import refresh
from bakery.maintain.edits import differing_files
from bakery.maintain.rebase_loop import conflicts_left, in_progress
from bakery.series.series import PatchEntry, Series

__all__ = ["collect", "lines"]


class PendingEdit(msgspec.Struct, frozen=True):
    action: str
    file: str


class UnbakedBase(msgspec.Struct, frozen=True):
    """A base with no BAKED.json (``checkout``: the rebase's conflict tree is there)."""

    pin: str
    sha256: str
    tree: str
    baked: bool
    checkout: bool
    baked_series: None
    stale: list[str]
    pending: None


class BakedBase(msgspec.Struct, frozen=True, kw_only=True):
    """A baked base: its series, staleness, wheel, and the edits refresh would write
    (``pending`` None: unknown, ``why`` says why; ``strays`` only when they were told)."""

    pin: str
    sha256: str
    tree: str
    up_to: str | None  # a bisect step (`bake --upto`): the series' first patches only
    baked: bool
    baked_series: str
    stale: list[str]
    wheel: str | None
    wheel_present: bool
    older_wheels: list[str]
    pending: list[PendingEdit] | None
    why: str | None
    strays: list[str] | msgspec.UnsetType = msgspec.UNSET


class SeriesFacts(msgspec.Struct, frozen=True):
    name: str
    root: str
    sha256: str
    patches: int


class RebaseProgress(msgspec.Struct, frozen=True):
    release: str
    conflicts: list[str]


class Server(Protocol):
    """A running server as `bakery status` shows it: the launcher's row (its type is the
    launcher's, ``bakery.launch.lifecycle.ServerRow``; this room does not import it)."""

    @property
    def profile(self) -> str: ...
    @property
    def pgid(self) -> int: ...
    @property
    def url(self) -> str | None: ...
    @property
    def health(self) -> str: ...
    @property
    def rebaked(self) -> str | None: ...


class PatchFacts(msgspec.Struct, frozen=True, kw_only=True):
    """One patch as status shows it: its file and header, an empty header field left out
    (as ``PatchEntry.header`` gives it). A view made from the series' ``PatchEntry``
    (``of``), not a document read anywhere: it exists because status --json has always
    left an empty header field out, where ``PatchEntry`` holds ``""``."""

    file: str
    stage: int
    summary: str
    description: str | msgspec.UnsetType = msgspec.UNSET
    author: str | msgspec.UnsetType = msgspec.UNSET
    upstream: str | msgspec.UnsetType = msgspec.UNSET

    @classmethod
    def of(cls, entry: PatchEntry) -> PatchFacts:
        return cls(
            file=entry.file,
            stage=entry.stage,
            summary=entry.summary,
            description=entry.description or msgspec.UNSET,
            author=entry.author or msgspec.UNSET,
            upstream=entry.upstream or msgspec.UNSET,
        )


class StatusReport(msgspec.Struct, frozen=True):
    """`bakery status --json`. ``servers`` are the launcher's rows: another room owns
    their shape."""

    tool: manifest.Tool
    series: SeriesFacts
    patches: list[PatchFacts]
    bases: dict[str, UnbakedBase | BakedBase]
    rebase: RebaseProgress | None
    servers: Sequence[Server]


def _pending(series: Series, key: str, tree: Path, cache: Path) -> dict:
    """The edits refresh would write, or why they cannot be told."""
    root = compared_pristine(series.base(key).sha256, cache, tree.parent)
    if root is None:
        why = "no intact pristine tree to compare with (`bakery bake` copies it again)"
        return {"pending": None, "why": why, "strays": []}
    strays: list[str] = []
    edited = differing_files(root / series.package, tree / series.package, strays)
    changes = refresh.plan_refresh(series, edited)
    pending = [PendingEdit(c.action, c.file) for c in changes]
    return {"pending": pending, "why": None, "strays": strays}


def _base(
    series: Series, key: str, build: Path, cache: Path, rebasing: bool
) -> UnbakedBase | BakedBase:
    pin = series.base(key)
    tree = tree_dir(build, key)
    row: dict[str, Any] = {"pin": str(pin.requirement), "sha256": pin.sha256, "tree": str(tree)}
    path = tree / manifest.MANIFEST
    if not path.is_file():
        checkout = rebasing and tree.is_dir()  # the conflict tree: written, not baked
        return UnbakedBase(
            **row, baked=False, checkout=checkout, baked_series=None, stale=[], pending=None
        )
    baked = manifest.load(path)
    stale = staleness(series, key, build) + pristine_edits(pin.sha256, cache)
    files = [p.file for p in baked.patches]
    ours = [e.file for e in series.entries]
    part = len(files) < len(ours) and files == ours[: len(files)]
    wheel = baked_wheel(build, baked)
    older = superseded_wheels(wheel.parent, wheel.name, series.name) if wheel else []
    if part and wheel:  # a bisect bake writes no wheel: the last whole bake's stays current
        wheel, older = (older[-1] if older else None), []
    if rebasing or refresh.series_changes_since_bake(series, baked):
        pending: dict = {"pending": None, "why": "the tree is not a bake of this series"}
    else:
        pending = _pending(series, key, tree, cache)
    return BakedBase(
        **row,
        up_to=(files[-1] if files else "none") if part else None,
        baked=True,
        baked_series=baked.series.sha256,
        stale=stale,
        wheel=str(wheel) if wheel else None,
        wheel_present=bool(wheel and wheel.is_file()),
        older_wheels=[str(p) for p in older],
        **pending,
    )


def collect(
    series: Series, build: Path, servers: Sequence[Server], cache: Path | None = None
) -> StatusReport:
    """Where the checkout stands; ``servers`` are the running servers, as the command line
    lists them from the launcher's records (this room knows nothing of the launcher)."""
    cache = cache or cache_dir()
    state = in_progress(build)
    rebase = RebaseProgress(state.release, conflicts_left(state, build, series)) if state else None
    return StatusReport(
        tool=manifest.Tool(name="bakery", version=__version__),
        series=SeriesFacts(series.name, str(series.root), series.sha256, len(series.entries)),
        patches=[PatchFacts.of(e) for e in series.entries],
        bases={
            key: _base(series, key, build, cache, bool(state and state.base_key == key))
            for key in sorted(series.bases, key=lambda k: (k != "default", k))
        },
        rebase=rebase,
        servers=servers,
    )


# What a terminal would act on rather than show (a CR rewrites the line, ESC starts a sequence).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _shown(line: str) -> str:
    """``line`` with each control character written as its Python escape (``\\r``, ``\\x1b``)."""
    return _CONTROL.sub(lambda m: repr(m[0])[1:-1], line)


def lines(status: StatusReport) -> list[str]:
    """The human form of ``collect``'s report, control characters escaped (a header, a path
    or a server's URL comes from files anyone may have edited)."""
    return [_shown(line) for line in _lines(status)]


def _lines(status: StatusReport) -> list[str]:
    s = status.series
    tool = status.tool.version
    out = [f"bakery {tool}, series {s.name} {s.sha256[:8]} ({s.patches} patches) at {s.root}"]
    for patch in status.patches:
        facts = [f"stage {patch.stage}"]
        facts += [
            f"{k} {v}" for k, v in (("upstream", patch.upstream), ("author", patch.author)) if v
        ]
        head = f"  {patch.file} ({'; '.join(facts)}): "
        room = max(20, 100 - len(head))
        summary = patch.summary
        out.append(head + (summary if len(summary) <= room else summary[: room - 3] + "..."))
    for key, base in status.bases.items():
        head = f"{key} ({base.pin}): {base.tree}"
        if isinstance(base, UnbakedBase):
            what = "the rebase's checkout (fix, then --continue)" if base.checkout else ""
            out.append(f"{head}: {what or 'not baked'}")
            continue
        verdict = "stale" if base.stale else "up to date"
        if base.up_to:
            verdict = f"a bisect bake up to {base.up_to} (`bakery bake` bakes the whole series)"
        out.append(f"{head}: baked from series {base.baked_series[:8]}, {verdict}")
        out += [f"  stale: {problem}" for problem in base.stale]
        missing = "" if base.wheel_present else " (missing: run `bakery bake`)"
        if base.up_to:
            last = base.wheel or "none (run `bakery bake`)"
            out.append(f"  wheel: {last} (the last whole bake's; a bisect bake writes none)")
        else:
            out.append(f"  wheel: {base.wheel or 'none named in BAKED.json'}{missing}")
        out += [f"  older wheel: {p} (`bakery clean` removes it)" for p in base.older_wheels]
        if base.pending is None:
            out.append(f"  pending edits: unknown ({base.why})")
        else:
            out += [f"  pending: {c.action} {c.file}" for c in base.pending]
            strays = [] if isinstance(base.strays, msgspec.UnsetType) else base.strays
            out += [f"  ignored (stray file): {rel}" for rel in strays]
    rebase = status.rebase
    if rebase:
        left = ", ".join(rebase.conflicts) or "none (run `bakery rebase --continue`)"
        out.append(f"rebase onto {rebase.release} in progress; conflicts left: {left}")
    servers = status.servers
    for r in servers:
        out.append(f"server {r.profile}: {r.health} pgid {r.pgid} {r.url or ''}")
        if r.rebaked:
            out.append(f"  re-baked under it: {r.rebaked} (`run.sh restart` serves it)")
    if not servers:
        out.append("servers: none running")
    return out
