"""BAKED.json: what a bake applied, to what, and what came out.

It records the tool version, the base pin and wheel sha256, the series sha256,
every patch's sha256 and hunk placements, and each touched file's sha256
before and after. ``drift`` re-hashes a tree (a baked tree or an installed
site-packages) against it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from bakery import __version__
from bakery.bake.record import parse_record, record_hash_file
from bakery.errors import ManifestError, UnsafePathError
from bakery.series.apply import ApplyPlan
from bakery.series.series import Pin, Series, is_sha256
from bakery.tree import inside, relative, write_atomic

__all__ = [
    "MANIFEST",
    "build",
    "dumps",
    "write",
    "load",
    "find",
    "Drift",
    "drift",
    "record_drift",
]

MANIFEST = "BAKED.json"


def _sha(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def build(series: Series, base: Pin, plan: ApplyPlan, wheel_name: str) -> dict:
    package = series.package
    return {
        "tool": {"name": "bakery", "version": __version__},
        "base": {
            "key": base.key,
            "requirement": str(base.requirement),
            "wheel": base.wheel,
            "sha256": base.sha256,
        },
        "series": {
            "name": series.name,
            "sha256": series.sha256,
            "package": package,
            "max_fuzz": series.max_fuzz,
        },
        "patches": [
            {
                "file": outcome.patch.name,
                "sha256": outcome.patch.sha256,
                "status": outcome.status,
                "files": [
                    {
                        "path": f"{package}/{r.path}",
                        "hunks": [asdict(p) for p in r.placements],
                    }
                    for r in outcome.files
                ],
            }
            for outcome in plan.outcomes
        ],
        "files": {
            f"{package}/{path}": {"pre": _sha(plan.before[path]), "post": _sha(plan.after[path])}
            for path in sorted(plan.after)
        },
        "wheel": wheel_name,
    }


def dumps(manifest: dict) -> bytes:
    # Sorted keys and a fixed layout: the manifest is part of the reproducible output.
    return (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()


def write(path: Path, manifest: dict) -> None:
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


def _shape_problems(data) -> list[str]:
    """What ``drift``, ``staleness`` and ``refresh`` rely on: the two sha256s, the base
    requirement, ``patches`` (file, sha256), and ``files`` mapping tree-relative paths to
    their ``pre``/``post`` sha256 (null where absent)."""
    if not isinstance(data, dict):
        return [f"the top level must be an object, not {type(data).__name__}"]
    problems = [
        f"{key}.sha256 must be 64 hex digits"
        for key in ("series", "base")
        if not (isinstance(data.get(key), dict) and is_sha256(data[key].get("sha256")))
    ]
    base = data.get("base")
    if not (isinstance(base, dict) and isinstance(base.get("requirement"), str)):
        problems.append("base.requirement must be a string")
    patches = data.get("patches")
    if not (
        isinstance(patches, list)
        and all(
            isinstance(p, dict) and isinstance(p.get("file"), str) and is_sha256(p.get("sha256"))
            for p in patches
        )
    ):
        problems.append("patches must be a list of {file, sha256} objects")
    files = data.get("files")
    if not isinstance(files, dict):
        return problems + [
            f"files must be an object (path -> pre/post), not {type(files).__name__}"
        ]
    for rel, hashes in files.items():
        try:
            relative(rel)
        except UnsafePathError:
            problems.append(f"files: path leaves the tree (refused): {rel!r}")
            continue
        if not (
            isinstance(hashes, dict)
            and set(hashes) == {"pre", "post"}
            and all(h is None or is_sha256(h) for h in hashes.values())
        ):
            problems.append(f"files[{rel!r}] must be {{pre, post}} sha256 or null, not {hashes!r}")
    return problems


def load(path: Path) -> dict:
    """BAKED.json, refused whole (exit 2) unless every path and hash ``drift`` uses is sound."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise ManifestError(
            f"unreadable manifest ({exc}): {str(path)!r}",
            hint="re-run `make bake` (or reinstall the patched wheel) to write a sound BAKED.json",
        ) from None
    problems = _shape_problems(data)
    if problems:
        shown = "; ".join(problems[:5]) + (
            f"; ... {len(problems) - 5} more" if len(problems) > 5 else ""
        )
        raise ManifestError(
            f"{path}: not a bakery manifest ({len(problems)} problem(s)): {shown}",
            hint="re-run `make bake` (or reinstall the patched wheel) to write a sound BAKED.json",
        )
    return data


@dataclass(frozen=True)
class Drift:
    modified: tuple[str, ...]
    missing: tuple[str, ...]
    extra: tuple[str, ...]  # the series deletes them, yet they exist

    @property
    def clean(self) -> bool:
        return not (self.modified or self.missing or self.extra)


def drift(root: Path, manifest: dict) -> Drift:
    """How ``root`` differs from what the manifest says the series left in it."""
    modified, missing, extra = [], [], []
    for rel, hashes in sorted(manifest["files"].items()):
        path = inside(root, rel)  # load() refused '..'; this also refuses symlink escapes
        actual = _sha(path.read_bytes()) if path.is_file() else None
        if hashes["post"] is None:
            if actual is not None:
                extra.append(rel)
        elif actual is None:
            missing.append(rel)
        elif actual != hashes["post"]:
            modified.append(rel)
    return Drift(tuple(modified), tuple(missing), tuple(extra))


def record_drift(root: Path, path: Path, manifest: dict) -> tuple[Drift, int]:
    """Every other member of ``root`` re-hashed against RECORD: the installed wheel's
    (beside ``path`` in its dist-info) or, for a baked tree, the base wheel's. The files
    BAKED.json covers are ``drift``'s; members outside ``root`` (``../../bin/vllm``) are
    counted, never read. Returns the drift and how many members were checked."""
    if path.parent == Path(root):
        records = sorted(Path(root).glob("*.dist-info/RECORD"))
    else:
        records = [path.parent / "RECORD"]
    covered = set(manifest["files"])
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
