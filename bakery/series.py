"""The series: ``patches/<name>/series.toml`` plus its numbered per-file diffs.

The order is the numeric prefix of each patch file (``09-...diff``); the target
path always comes from the diff header, never from the file name. The toml
holds the pins (bases and pinned dependencies), the path renames, the fuzz
policy and, per patch, a one-line summary and its DCP stage.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from .diff import Patch, parse_patch
from .errors import SeriesError

__all__ = ["Pin", "PatchEntry", "Series", "load_series", "DEFAULT_SERIES"]

DEFAULT_SERIES = Path("patches/dcp2")
_PATCH_NAME = re.compile(r"^(?P<number>\d{2,})-(?P<slug>[^/]+)\.diff$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Pin:
    """One hash-pinned wheel: ``name==version``, its file name and sha256."""

    key: str  # "default", "cpu", or a dependency's project name
    requirement: Requirement
    wheel: str
    sha256: str

    @property
    def name(self) -> str:
        return self.requirement.name

    @property
    def version(self) -> str:
        (spec,) = self.requirement.specifier
        return spec.version

    @classmethod
    def parse(cls, key: str, table: dict, where: str) -> Pin:
        try:
            requirement = Requirement(table["requirement"])
            wheel, sha256 = table["wheel"], table["sha256"]
        except KeyError as exc:
            raise SeriesError(f"{where}: pin {key!r} lacks {exc.args[0]!r}") from None
        except InvalidRequirement as exc:
            raise SeriesError(f"{where}: pin {key!r} (bad requirement): {exc}") from None
        specs = list(requirement.specifier)
        if len(specs) != 1 or specs[0].operator != "==":
            raise SeriesError(f"{where}: pin {key!r} must be name==version: {str(requirement)!r}")
        if not _SHA256.match(sha256):
            raise SeriesError(f"{where}: pin {key!r} (sha256 is not 64 hex digits): {sha256!r}")
        try:
            name, version, _, _ = parse_wheel_filename(wheel)
        except InvalidWheelFilename as exc:
            raise SeriesError(f"{where}: pin {key!r} (bad wheel name): {exc}") from None
        if name != canonicalize_name(requirement.name) or version != Version(specs[0].version):
            raise SeriesError(f"{where}: pin {key!r}: wheel {wheel!r} is not {requirement}")
        return cls(key, requirement, wheel, sha256)


@dataclass(frozen=True)
class PatchEntry:
    number: int
    file: str
    summary: str
    stage: int


@dataclass(frozen=True)
class Series:
    root: Path
    name: str
    package: str  # the wheel folder the diff paths are relative to
    bases: dict[str, Pin]
    dependencies: dict[str, Pin]
    renames: tuple[tuple[str, str], ...]
    max_fuzz: int
    strip: int
    entries: tuple[PatchEntry, ...]
    allow_names: dict[str, str]  # linkcheck allowlist: name -> reason

    def base(self, key: str) -> Pin:
        try:
            return self.bases[key]
        except KeyError:
            known = ", ".join(sorted(self.bases))
            raise SeriesError(f"unknown base (known: {known}): {key!r}") from None

    def patch_bytes(self, entry: PatchEntry) -> bytes:
        return (self.root / entry.file).read_bytes()

    @cached_property
    def patches(self) -> tuple[Patch, ...]:
        return tuple(
            parse_patch(self.patch_bytes(e), e.file, renames=self.renames, strip=self.strip)
            for e in self.entries
        )

    def select(self, only: tuple[str, ...]) -> tuple[Patch, ...]:
        """The patches named in ``only`` (file names), in series order."""
        known = {e.file for e in self.entries}
        unknown = [name for name in only if Path(name).name not in known]
        if unknown:
            raise SeriesError(f"not a patch of series {self.name!r}: {unknown[0]!r}")
        wanted = {Path(name).name for name in only}
        return tuple(p for p in self.patches if p.name in wanted)

    @cached_property
    def sha256(self) -> str:
        """Identity of what a bake applies: the apply settings, then every patch's
        name and bytes in order (length-framed, so boundaries cannot shift)."""
        digest = hashlib.sha256()
        settings = {"renames": self.renames, "max_fuzz": self.max_fuzz, "strip": self.strip}
        digest.update(json.dumps(settings, sort_keys=True).encode() + b"\0")
        for entry in self.entries:
            data = self.patch_bytes(entry)
            digest.update(f"{entry.file}\0{len(data)}\0".encode() + data)
        return digest.hexdigest()

    @property
    def touched(self) -> tuple[str, ...]:
        """Every tree-relative path the series touches, sorted."""
        return tuple(sorted({path for patch in self.patches for path in patch.paths}))


def _entries(root: Path, tables: list[dict], where: str) -> tuple[PatchEntry, ...]:
    entries = []
    for table in tables:
        file = table.get("file", "")
        match = _PATCH_NAME.match(file)
        if not match:
            raise SeriesError(f"{where}: patch file name is not NN-<path>.diff: {file!r}")
        if not isinstance(table.get("stage"), int) or not table.get("summary"):
            raise SeriesError(f"{where}: patch {file!r} needs an integer stage and a summary")
        entries.append(PatchEntry(int(match["number"]), file, table["summary"], table["stage"]))
    numbers = [e.number for e in entries]
    if len(set(numbers)) != len(numbers):
        raise SeriesError(f"{where}: two patches share a number: {sorted(numbers)!r}")
    listed = {e.file for e in entries}
    on_disk = {p.name for p in root.glob("*.diff")}
    if listed != on_disk:
        stray = sorted(on_disk - listed) or sorted(listed - on_disk)
        what = "not listed in series.toml" if on_disk - listed else "listed but missing"
        raise SeriesError(f"{where}: patch files {what}: {stray!r}")
    return tuple(sorted(entries, key=lambda e: e.number))


def load_series(root: Path = DEFAULT_SERIES) -> Series:
    root = Path(root)
    where = str(root / "series.toml")
    try:
        data = tomllib.loads((root / "series.toml").read_text())
    except FileNotFoundError:
        raise SeriesError(f"no series here (missing file): {where!r}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SeriesError(f"{where}: not valid TOML ({exc})") from None
    bases = {k: Pin.parse(k, v, where) for k, v in data.get("bases", {}).items()}
    if "default" not in bases:
        raise SeriesError(f"{where}: no [bases.default] pin")
    deps = {k: Pin.parse(k, v, where) for k, v in data.get("dependencies", {}).items()}
    policy = data.get("policy", {})
    return Series(
        root=root,
        name=data.get("name", root.name),
        package=data.get("package", "vllm"),
        bases=bases,
        dependencies=deps,
        renames=tuple(data.get("renames", {}).items()),
        max_fuzz=int(policy.get("max_fuzz", 0)),
        strip=int(policy.get("strip", 1)),
        entries=_entries(root, data.get("patches", []), where),
        allow_names={k: v for k, v in data.get("linkcheck", {}).get("allow", {}).items()},
    )
