"""The rebase loop's state (``build/.rebase``): state.json, read back strictly, and the
names in it confined before anything moves; which series files the loop wrote.

state.json is ours, but a hand or a second loop may have changed it or the series since:
every name in it goes through ``own_path``, the series folder must be the one the command
names, and only files --continue wrote (with the bytes it wrote) are ever put back.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from enum import StrEnum
from pathlib import Path
from typing import Annotated

from msgspec import Meta

from bakery.bake.bake import tree_dir
from bakery.errors import BakeryError, UnreadableInput, UsageError
from bakery.schema import Document, encode_json, read_json, try_decode
from bakery.series.series import load_series
from bakery.tree import empty_trash, own_folder, own_path, read_bounded, relative, write_atomic

STATE = ".rebase"  # under the build folder: state.json, series/ (saved), baked/ (saved)
# Beside it, kept across rebases: conflict sha256 -> the fixed file, as git's rerere
# records it, so a conflict fixed once (then aborted) is not fixed twice.
RERERE = ".rerere"


def state_path(build: Path) -> Path:
    return build / STATE / "state.json"


class CheckoutStatus(StrEnum):
    """How ``checkout`` wrote one file onto the release (state.json keeps the word)."""

    APPLIED = "applied"  # its patch placed
    UPSTREAM = "upstream"  # the release already has its patch: left as the release has it
    MERGED = "merged"  # 3-way merged without a clash
    CONFLICT = "conflict"  # merged with conflict markers: a hand must fix it
    RESOLVED = "resolved"  # the same conflict was fixed before: that fix reused (rerere)


class CheckedOutFile(Document, frozen=True):
    """How ``checkout`` wrote one file (state.json's ``files`` values)."""

    patch: str
    status: CheckoutStatus
    fuzz: int = 0
    conflict: str = ""  # sha256 of the conflict as merged: its name under RERERE


class RebaseState(Document, frozen=True, kw_only=True):
    """state.json: every value is read back before anything moves, so an edited or
    forged one is refused, never followed (its names are checked with ``own_path``).
    The fields in the order state.json has them."""

    release: str
    base_key: Annotated[
        str, Meta(pattern=r"^[a-z0-9][a-z0-9_-]{0,31}\Z", description="a base name")
    ]
    series: str
    series_sha256: str = ""  # the series checked out (a later loop's series is not ours)
    wrote: dict[str, str | None] = {}  # series file -> sha256 --continue wrote (None: removed)
    had_tree: bool
    pin: dict[str, str]
    dependencies: dict[str, dict[str, str]]
    other_bases: dict[str, dict[str, str]]
    notes: tuple[str, ...]
    files: dict[str, CheckedOutFile]


def write_state(path: Path, state: RebaseState) -> None:
    write_atomic(path, encode_json(state))


def in_progress(build: Path) -> RebaseState | None:
    """The rebase in progress in ``build`` (None if none); a damaged one is refused."""
    path = state_path(build)
    if not path.parent.exists() and not path.parent.is_symlink():
        return None
    try:
        own_path(build, f"{STATE}/state.json", "the rebase state")
        data = read_json(path, "state.json", UnreadableInput, limit=4 << 20)
        state, found = try_decode(data, RebaseState)
        if state is not None:
            for name in [*state.files, *state.wrote]:
                relative(name)
    except FileNotFoundError:
        problem = "it has no state.json"
    except BakeryError as exc:
        problem = str(exc)
    else:
        if state is not None:
            return state
        problem = f"state.json: {'; '.join(found[:6])}"
    raise UnreadableInput(
        f"the rebase state in {path.parent} is damaged ({problem})",
        hint=f"the series as it was is in {path.parent / 'series'} and the tree, if one was "
        f"set aside, in {path.parent / 'baked'}: put back what you need, then delete "
        f"{path.parent}",
    )


def refuse_during_rebase(build: Path) -> None:
    """Commands that would overwrite the conflict tree refuse while a rebase runs."""
    state = in_progress(build)
    if state:
        raise UsageError(
            f"a rebase onto {state.release} is in progress in {build}",
            hint="finish it with `bakery rebase --continue`, or undo it with "
            "`bakery rebase --abort`",
        )


def loop_tree(build: Path, state: RebaseState) -> Path:
    return own_path(build, tree_dir(build, state.base_key).name, "the rebase's tree")


def checked_out(state: RebaseState, build: Path) -> bool:
    """Whether the tree in place is the checkout's (checkout moves the old tree into
    the state first, then the new one in; abort moves the old one back)."""
    saved = own_path(build, f"{STATE}/baked", "the saved tree")
    return loop_tree(build, state).exists() and (saved.exists() or not state.had_tree)


def load_state(build: Path, series_root: Path | None) -> RebaseState:
    """The rebase in progress, if it is this series' (its names all checked)."""
    state = in_progress(build)
    if state is None:
        raise UsageError(
            f"no rebase in progress in {build}",
            hint="start one with `bakery rebase --to vllm==X.Y.Z --checkout`",
        )
    if series_root is not None and Path(state.series) != Path(series_root).resolve():
        raise UsageError(
            f"the rebase in progress in {build} is of another series: {state.series!r}",
            hint=f"name that series (`bakery rebase --abort --series DIR`), or delete "
            f"{build / STATE} if it is not yours",
        )
    loop_tree(build, state)
    return state


def series_files(root: Path) -> dict[str, str]:
    """sha256 of each regular file directly in the series folder."""
    return {
        p.name: hashlib.sha256(read_bounded(p)).hexdigest()
        for p in sorted(root.iterdir())
        if p.is_file() and not p.is_symlink()
    }


def is_ours(state: RebaseState, root: Path) -> bool:
    """Whether the series folder is still the one this loop checked out, or exactly what
    its own --continue wrote: else another loop (another build folder) has finished a
    rebase of it, or a hand changed it, and this loop must not write over that."""
    try:
        if load_series(root).sha256 == state.series_sha256:
            return True
    except BakeryError:
        pass
    now = series_files(root)
    return bool(state.wrote) and all(now.get(n) == h for n, h in state.wrote.items())


def folder_changes(new: Path, old: Path, saved: Path) -> dict[str, bytes | None]:
    """The writes and removals that make ``old``'s top-level files ``new``'s; only a file
    the saved series had is removed (a file a hand added meanwhile is not the loop's)."""
    after, before = series_files(new), series_files(old)
    had = series_files(saved)
    out: dict[str, bytes | None] = {n: None for n in before if n not in after and n in had}
    out |= {n: read_bounded(new / n) for n, h in after.items() if before.get(n) != h}
    return out


def to_trash(build: Path, path: Path) -> None:
    trash = own_folder(build / ".trash")
    os.rename(path, trash / f"{path.name}-{uuid.uuid4().hex[:12]}")


def discard_state(build: Path) -> None:
    """The state (and the old tree saved in it) goes last: until then a rerun works."""
    to_trash(build, build / STATE)
    empty_trash(build / ".trash")
