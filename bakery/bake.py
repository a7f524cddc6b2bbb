"""The bake: pinned wheel -> verified -> pristine -> patched tree, manifest, wheel.

``bake()`` is the whole pipeline and only moves data between the steps, each of
which lives in its own module. The cached pristine tree is never written; the
baked tree is built beside the old one and swapped in whole, so a bake killed
at any moment leaves the previous tree intact.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from . import apply, manifest
from .errors import PreimageMismatch
from .fetch import cache_dir, fetch
from .progress import interactive, step
from .series import Pin, Series
from .tree import clone_tree, remove_tree, swap_into_place, write_atomic
from .wheel import (
    WheelInfo,
    extract,
    patched_wheel_name,
    read_wheel,
    record_hash,
    write_patched_wheel,
)

__all__ = [
    "BakeResult",
    "bake",
    "tree_dir",
    "pristine",
    "unpacked",
    "patched_version",
    "staleness",
]


@dataclass(frozen=True)
class BakeResult:
    tree: Path
    manifest: Path
    wheel: Path
    plan: apply.Plan


def tree_dir(build: Path, base_key: str) -> Path:
    return build / ("baked" if base_key == "default" else f"baked-{base_key}")


def patched_version(series: Series, base_version: str) -> Version:
    return Version(f"{base_version}+{series.name}.{series.sha256[:8]}")


def pristine(wheel: WheelInfo, sha256: str, cache: Path) -> Path:
    """The wheel extracted once per sha256 (read-only, shared by every bake)."""
    root = cache / "pristine" / sha256
    if root.is_dir():
        return root
    tmp = root.with_name(f".{sha256[:16]}.tmp-{os.getpid()}")
    remove_tree(tmp)
    with step(f"extracting {wheel.path.name}"):
        extract(wheel, tmp)
    try:
        os.rename(tmp, root)
    except OSError:  # another bake finished first; its tree is the same bytes
        remove_tree(tmp)
    return root


def unpacked(pin: Pin, cache: Path | None = None, wheel: Path | None = None) -> Path:
    """Fetch (hash-pinned) and extract a pinned wheel; the read-only pristine root."""
    cache = cache or cache_dir()
    with step(f"fetching {pin.wheel}"):
        path = fetch(pin, wheel=wheel, cache=cache, verbose=interactive())
    return pristine(read_wheel(path), pin.sha256, cache)


def _check_preimage(root: Path, wheel: WheelInfo, series: Series) -> None:
    """Every touched file must be what the wheel's RECORD says, before patching."""
    bad = []
    for path in series.touched:
        member = f"{series.package}/{path}"
        expected = wheel.record.get(member)
        target = root / member
        if expected is None:
            if target.exists():
                bad.append(f"{member} (not in RECORD)")
            continue
        if not target.is_file():
            bad.append(f"{member} (missing)")
        elif record_hash(target.read_bytes()) != expected:
            bad.append(f"{member} (hash differs from RECORD)")
    if bad:
        raise PreimageMismatch(
            f"base is not what the series expects ({len(bad)} file(s)): " + ", ".join(bad),
            hint="the pristine cache may be damaged: delete it under $BAKERY_CACHE/pristine",
        )


def staleness(series: Series, base_key: str, build: Path = Path("build")) -> list[str]:
    """Why the baked tree cannot be trusted as this series' bake ([] if it can)."""
    tree = tree_dir(build, base_key)
    path = tree / manifest.MANIFEST
    if not path.is_file():
        return [f"no baked tree at {tree}"]
    data = manifest.load(path)
    problems = []
    if data["series"]["sha256"] != series.sha256:
        problems.append(
            f"{tree} was baked from series {data['series']['sha256'][:8]}, "
            f"the repo has {series.sha256[:8]}"
        )
    if data["base"]["sha256"] != series.base(base_key).sha256:
        problems.append(f"{tree} was baked from another {base_key} wheel")
    drift = manifest.check(tree, data)
    problems += [
        f"{kind}: {rel}"
        for kind, rels in (
            ("modified", drift.modified),
            ("missing", drift.missing),
            ("extra", drift.extra),
        )
        for rel in rels
    ]
    return problems


def _write_wheel(
    base: WheelInfo,
    dist: Path,
    name: str,
    version: Version,
    changed: dict[str, bytes | None],
    data: dict,
) -> Path:
    dist.mkdir(exist_ok=True)
    out = dist / name
    tmp = dist / f".{name}.tmp-{os.getpid()}"
    with step(f"building {name}"):
        try:
            write_patched_wheel(
                base, tmp, version, changed, {manifest.MANIFEST: manifest.dumps(data)}
            )
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
    return out


def bake(
    series: Series,
    base_key: str = "default",
    *,
    build: Path = Path("build"),
    wheel: Path | None = None,
    cache: Path | None = None,
) -> BakeResult:
    pin = series.base(base_key)
    cache = cache or cache_dir()
    with step(f"fetching {pin.wheel}"):
        wheel_path = fetch(pin, wheel=wheel, cache=cache, verbose=interactive())
    base = read_wheel(wheel_path)
    root = pristine(base, pin.sha256, cache)
    _check_preimage(root, base, series)
    with step(f"applying {len(series.entries)} patch(es) of {series.name}"):
        plan = apply.plan(root / series.package, series.patches, max_fuzz=series.max_fuzz)
    version = patched_version(series, pin.version)
    wheel_name = patched_wheel_name(base, version)
    data = manifest.build(series, pin, plan, wheel_name)

    tree = tree_dir(build, base_key)
    build.mkdir(parents=True, exist_ok=True)
    for stale in build.glob(f".{tree.name}.new-*"):  # left by a killed bake
        remove_tree(stale)
    staging = build / f".{tree.name}.new-{os.getpid()}"
    changed = {f"{series.package}/{p}": plan.after[p] for p in plan.changed}
    modes = {f"{series.package}/{p}": mode for p, mode in plan.modes.items()}
    try:
        with step(f"writing {tree}"):
            clone_tree(root, staging, skip=frozenset(changed))
            for member, content in changed.items():
                if content is not None:
                    write_atomic(staging / member, content, modes.get(member))
            manifest.write(staging / manifest.MANIFEST, data)
        out = _write_wheel(base, build / "dist", wheel_name, version, changed, data)
        swap_into_place(staging, tree)
    except BaseException:
        remove_tree(staging)
        raise
    return BakeResult(tree, tree / manifest.MANIFEST, out, plan)
