"""A minimal deterministic zip writer that can copy a member's compressed bytes raw.

``zipfile`` cannot write an already-deflated member without inflating and
deflating it again; for a 130 MB wheel of which a bake replaces a few files,
that raw copy is what makes a rebake cost a file copy. Every entry gets the
same fixed timestamp and the caller's order, so equal inputs give equal bytes.
Nothing here knows about wheels; ``zipfile`` reads what it writes.
"""

from __future__ import annotations

import struct
import zipfile
import zlib
from dataclasses import dataclass
from typing import BinaryIO

from bakery.errors import WheelError

__all__ = ["ZipWriter"]

# Zip's own epoch: the earliest time a zip entry can carry, so no clock leaks in.
_DOS_DATE = (0 << 9) | (1 << 5) | 1  # 1980-01-01
_DOS_TIME = 0
_UTF8_NAME = 0x800  # general purpose flag 11: the name is UTF-8
_VERSION = 20  # 2.0: deflate, folders; no zip64 (members and wheels here are < 4 GiB)
_MADE_BY_UNIX = 3 << 8  # so external_attr's high 16 bits are read as Unix mode bits
_LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")
_CENTRAL_HEADER = struct.Struct("<IHHHHHHIIIHHHHHII")
_END_OF_DIRECTORY = struct.Struct("<IHHHHIIH")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class _Entry:
    name: bytes
    method: int
    crc: int
    compressed_size: int
    size: int
    offset: int


class ZipWriter:
    """Write entries one after another to ``out``, then ``finish()`` writes the directory."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.central: list[bytes] = []

    def _local_header(
        self, name: bytes, method: int, crc: int, compressed_size: int, size: int
    ) -> _Entry:
        offset = self.out.tell()
        if max(compressed_size, size, offset) >= 0xFFFFFFFF:
            raise WheelError(f"member too large for a non-zip64 zip: {name.decode()!r}")
        fields = (_VERSION, _UTF8_NAME, method, _DOS_TIME, _DOS_DATE, crc, compressed_size, size)
        self.out.write(_LOCAL_HEADER.pack(0x04034B50, *fields, len(name), 0) + name)
        return _Entry(name, method, crc, compressed_size, size, offset)

    def _central_header(self, entry: _Entry, external_attr: int) -> None:
        self.central.append(
            _CENTRAL_HEADER.pack(
                0x02014B50,
                _MADE_BY_UNIX | _VERSION,
                _VERSION,
                _UTF8_NAME,
                entry.method,
                _DOS_TIME,
                _DOS_DATE,
                entry.crc,
                entry.compressed_size,
                entry.size,
                len(entry.name),
                0,  # extra field length
                0,  # comment length
                0,  # disk number
                0,  # internal attributes
                external_attr,
                entry.offset,
            )
            + entry.name
        )

    def add_bytes(self, name: str, data: bytes, external_attr: int) -> None:
        """Deflate ``data`` (level 6, as zipfile's default) into a new member."""
        compressor = zlib.compressobj(6, zlib.DEFLATED, -15)
        packed = compressor.compress(data) + compressor.flush()
        entry = self._local_header(
            name.encode(), zipfile.ZIP_DEFLATED, zlib.crc32(data), len(packed), len(data)
        )
        self.out.write(packed)
        self._central_header(entry, external_attr)

    def add_raw(self, name: str, source: BinaryIO, info: zipfile.ZipInfo) -> None:
        """Copy the member ``info`` of the zip open as ``source`` as its compressed bytes
        (method, CRC and sizes from its directory entry), under ``name``."""
        source.seek(info.header_offset)
        local = source.read(_LOCAL_HEADER.size)
        if len(local) < _LOCAL_HEADER.size or local[:4] != b"PK\x03\x04":
            raise WheelError(f"no local header where the zip directory says: {info.filename!r}")
        name_len, extra_len = struct.unpack("<HH", local[26:30])
        source.seek(info.header_offset + _LOCAL_HEADER.size + name_len + extra_len)
        entry = self._local_header(
            name.encode(), info.compress_type, info.CRC, info.compress_size, info.file_size
        )
        remaining = info.compress_size
        while remaining:
            chunk = source.read(min(_CHUNK, remaining))
            if not chunk:
                raise WheelError(f"truncated member in the source zip: {info.filename!r}")
            self.out.write(chunk)
            remaining -= len(chunk)
        self._central_header(entry, info.external_attr)

    def finish(self) -> None:
        """Write the central directory and its end record; the zip is complete."""
        start = self.out.tell()
        directory = b"".join(self.central)
        self.out.write(directory)
        count = len(self.central)
        self.out.write(
            _END_OF_DIRECTORY.pack(0x06054B50, 0, 0, count, count, len(directory), start, 0)
        )
