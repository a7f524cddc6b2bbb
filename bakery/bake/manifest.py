"""BAKED.json: what a bake applied, to what, and what came out.

It records the tool version, the base pin and wheel sha256, the series sha256,
every patch's sha256 and hunk placements, and each touched file's sha256
before and after. ``drift`` re-hashes a tree (a baked tree or an installed
site-packages) against it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from bakery import __version__
from bakery.bake.record import parse_record, record_hash_file
from bakery.errors import ManifestError, UnsafePathError
from bakery.schema import Document, Sha256, encode_json, try_decode, try_decode_json
from bakery.series.apply import ApplyPlan
from bakery.series.series import Pin, Series
from bakery.tree import inside, relative, write_atomic

__all__ = [
    "MANIFEST",
    "BakedManifest",
    "ServedBake",
    "served",
    "BaseRecord",
    "SeriesRecord",
    "PatchRecord",
    "PatchedFile",
    "Hunk",
    "FileHashes",
    "Tool",
    "build",
    "parse",
    "dumps",
    "write",
    "load",
    "find",
    "Drift",
    "drift",
    "record_drift",
]

MANIFEST = "BAKED.json"


class Tool(Document, frozen=True):
    name: str
    version: str


class BaseRecord(Document, frozen=True, kw_only=True):
    key: str = ""
    requirement: str
    wheel: str = ""
    sha256: Sha256


class SeriesRecord(Document, frozen=True, kw_only=True):
    name: str = ""
    sha256: Sha256
    package: str = ""
    max_fuzz: int = 0


class Hunk(Document, frozen=True):
    """Where one hunk landed (the engine's placement, as BAKED.json keeps it)."""

    hunk: int
    line: int
    offset: int
    fuzz: int


class PatchedFile(Document, frozen=True):
    path: str
    hunks: tuple[Hunk, ...]


class PatchRecord(Document, frozen=True, kw_only=True):
    file: str
    sha256: Sha256
    status: str = ""
    files: tuple[PatchedFile, ...] = ()


class FileHashes(Document, frozen=True):
    """A touched file's sha256 before and after the series (None: absent)."""

    pre: Sha256 | None
    post: Sha256 | None


class BakedManifest(Document, frozen=True, kw_only=True):
    """BAKED.json. What ``drift``, ``staleness`` and ``refresh`` rely on is required (the
    two sha256s, the base requirement, each patch's file and sha256, ``files``); the rest
    has a default, as a hand-written manifest may leave it out."""

    tool: Tool | None = None
    base: BaseRecord
    series: SeriesRecord
    patches: tuple[PatchRecord, ...]
    files: dict[str, FileHashes]
    # Any JSON value: ``bake.baked_wheel`` judges it, and a bad one names no wheel
    # instead of refusing the whole tree (`status` still reports it).
    wheel: Any = ""


class ServedSeries(msgspec.Struct, frozen=True, kw_only=True):
    sha256: Sha256
    name: str = ""


class ServedBase(msgspec.Struct, frozen=True):
    requirement: str


class ServedBake(msgspec.Struct, frozen=True):
    """BAKED.json as the launcher reads it: which series over which base a tree serves.

    A narrow view of ``BakedManifest``, not the whole: it ignores every other field, so a
    manifest of another bakery version (an installed wheel's) still names its series
    when recorded with a run and compared later; judging the whole manifest is
    preflight's, before anything starts."""

    series: ServedSeries
    base: ServedBase


def served(raw: bytes) -> tuple[ServedBake | None, str]:
    """BAKED.json's bytes as a ``ServedBake``, or ``(None, why)`` in one short line."""
    return try_decode_json(raw, ServedBake)


def _sha(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def build(series: Series, base: Pin, plan: ApplyPlan, wheel_name: str) -> BakedManifest:
    package = series.package
    return BakedManifest(
        tool=Tool(name="bakery", version=__version__),
        base=BaseRecord(
            key=base.key, requirement=str(base.requirement), wheel=base.wheel, sha256=base.sha256
        ),
        series=SeriesRecord(
            name=series.name, sha256=series.sha256, package=package, max_fuzz=series.max_fuzz
        ),
        patches=tuple(
            PatchRecord(
                file=outcome.patch.name,
                sha256=outcome.patch.sha256,
                status=outcome.status,
                files=tuple(
                    PatchedFile(
                        f"{package}/{r.path}",
                        tuple(Hunk(p.hunk, p.line, p.offset, p.fuzz) for p in r.placements),
                    )
                    for r in outcome.files
                ),
            )
            for outcome in plan.outcomes
        ),
        files={
            f"{package}/{path}": FileHashes(_sha(plan.before[path]), _sha(plan.after[path]))
            for path in sorted(plan.after)
        },
        wheel=wheel_name,
    )


def dumps(manifest: BakedManifest) -> bytes:
    # Sorted keys and a fixed layout: the manifest is part of the reproducible output.
    return encode_json(manifest, sort_keys=True)


def write(path: Path, manifest: BakedManifest) -> None:
    """Atomic: a reader (or a kill) sees the old manifest or the new one, never half."""
    write_atomic(path, dumps(manifest))


def find(root: Path) -> Path:
    """The manifest of a baked tree, or of a patched wheel installed in ``root``."""
    direct = root / MANIFEST
    if direct.is_file():
        return direct
    found = sorted(root.glob(f"*.dist-info/{MANIFEST}"))
    if len(found) == 1:
        return found[0]
    what = "several patched installs" if found else f"no {MANIFEST}"
    raise ManifestError(
        f"not a baked tree or patched site-packages ({what}): {str(root)!r}",
        hint="run `make bake`, or point at the folder holding BAKED.json",
    )


_RESTORE = "re-run `make bake` (or reinstall the patched wheel) to write a sound BAKED.json"


def parse(data: object, where: str) -> BakedManifest:
    """A parsed BAKED.json as its type, refused whole (exit 2) unless every path and hash
    ``drift`` uses is sound: a path that leaves the tree is refused before any is read."""
    value, problems = try_decode(data, BakedManifest)
    if value is not None:
        for rel in value.files:
            try:
                relative(rel)
            except UnsafePathError:
                problems.append(f"files: path leaves the tree (refused): {rel!r}")
    if problems:
        shown = "; ".join(problems[:5]) + (
            f"; ... {len(problems) - 5} more" if len(problems) > 5 else ""
        )
        raise ManifestError(
            f"{where}: not a bakery manifest ({len(problems)} problem(s)): {shown}",
            hint=_RESTORE,
        )
    assert value is not None
    return value


def load(path: Path) -> BakedManifest:
    """BAKED.json (see ``parse``); unreadable or not JSON is one ``ManifestError`` too."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise ManifestError(f"unreadable manifest ({exc}): {str(path)!r}", hint=_RESTORE) from None
    return parse(data, str(path))


@dataclass(frozen=True)
class Drift:
    modified: tuple[str, ...]
    missing: tuple[str, ...]
    extra: tuple[str, ...]  # the series deletes them, yet they exist

    @property
    def clean(self) -> bool:
        return not (self.modified or self.missing or self.extra)


def drift(root: Path, manifest: BakedManifest) -> Drift:
    """How ``root`` differs from what the manifest says the series left in it."""
    modified, missing, extra = [], [], []
    for rel, hashes in sorted(manifest.files.items()):
        path = inside(root, rel)  # load() refused '..'; this also refuses symlink escapes
        actual = _sha(path.read_bytes()) if path.is_file() else None
        if hashes.post is None:
            if actual is not None:
                extra.append(rel)
        elif actual is None:
            missing.append(rel)
        elif actual != hashes.post:
            modified.append(rel)
    return Drift(tuple(modified), tuple(missing), tuple(extra))


def record_drift(root: Path, path: Path, manifest: BakedManifest) -> tuple[Drift, int]:
    """Every other member of ``root`` re-hashed against RECORD: the installed wheel's
    (beside ``path`` in its dist-info) or, for a baked tree, the base wheel's. The files
    BAKED.json covers are ``drift``'s; members outside ``root`` (``../../bin/vllm``) are
    counted, never read. Returns the drift and how many members were checked."""
    if path.parent == Path(root):
        records = sorted(Path(root).glob("*.dist-info/RECORD"))
    else:
        records = [path.parent / "RECORD"]
    covered = set(manifest.files)
    modified, missing, checked = [], [], 0
    for record in records:
        try:
            rows = parse_record(record.read_text(encoding="utf-8"), str(record))
        except (OSError, UnicodeDecodeError) as exc:
            raise ManifestError(f"unreadable RECORD ({exc}): {str(record)!r}") from None
        for member, expected in sorted(rows.items()):
            if member in covered or not expected.startswith("sha256="):
                continue
            try:
                target = inside(root, member)
            except UnsafePathError:
                continue  # a script installed outside site-packages: not ours to read
            checked += 1
            if not target.is_file():
                missing.append(member)
            elif record_hash_file(target) != expected:
                modified.append(member)
    return Drift(tuple(modified), tuple(missing), ()), checked
