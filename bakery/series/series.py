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
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import msgspec
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from bakery.errors import SeriesError, UnsafePathError
from bakery.schema import Document, decode, read_toml, refuse
from bakery.series.diff import Patch, parse_patch
from bakery.tree import relative

__all__ = [
    "Pin",
    "PatchEntry",
    "Series",
    "load_series",
    "validate",
    "SeriesDoc",
    "PinDoc",
    "is_sha256",
]

_PATCH_NAME = re.compile(r"^(?P<number>\d{2,})-(?P<slug>[^/\\\0]+)\.diff$")
_SHA256 = re.compile(r"[0-9a-f]{64}")
# The package is a folder of the wheel (import names joined by '/'); the series
# name becomes part of a PEP 440 local version (+<name>.<sha>).
_PACKAGE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(/[A-Za-z_][A-Za-z0-9_]*)*$")
_NAME = re.compile(r"^[A-Za-z0-9]+([._-][A-Za-z0-9]+)*$")
MAX_FUZZ = 3  # as `bakery apply --fuzz`: beyond 3 a hunk keeps almost no context
MAX_STRIP = 16
STAGES = range(1, 10)  # as `bakery refresh --stage`


# series.toml's schema, the one place that knows its shape (bakery.schema decodes it).
class PinDoc(Document):
    requirement: str
    wheel: str
    sha256: str


class PolicyDoc(Document):
    strip: int = 1
    max_fuzz: int = 0


class PatchDoc(Document):
    file: str
    stage: int
    summary: str
    # The patch's header (quilt's `header`, git's message): what it does and why, who
    # wrote it, where it stands upstream (e.g. "not submitted", a PR link, "merged in X").
    description: str = ""
    author: str = ""
    upstream: str = ""


class LinkcheckDoc(Document):
    allow: dict[str, str] = {}  # name -> why it may stay unresolved


class SeriesDoc(Document):
    bases: dict[str, PinDoc]
    name: str | None = None  # the folder's name when absent
    package: str = "vllm"
    policy: PolicyDoc = msgspec.field(default_factory=PolicyDoc)
    renames: dict[str, str] = {}
    dependencies: dict[str, PinDoc] = {}
    patches: list[PatchDoc] = []
    linkcheck: LinkcheckDoc = msgspec.field(default_factory=LinkcheckDoc)


_HINT = "see patches/dcp2/series.toml for the expected fields and types"
_PIN_HINT = "a pin is requirement = 'name==version', its wheel's file name and that file's sha256"


def is_sha256(value: object) -> bool:
    """A sha256 as pins and BAKED.json spell it: exactly 64 lowercase hex digits."""
    return isinstance(value, str) and _SHA256.fullmatch(value) is not None


def _range_problems(doc: SeriesDoc, name: str) -> list[str]:
    """Values whose type is right but which are still unusable: out of range, or paths
    that could leave their folder. Wrong types are the schema's to report."""
    problems = []
    if "default" not in doc.bases:
        problems.append("$.bases.default: missing (the base `bakery bake` uses by default)")
    for key, high in (("max_fuzz", MAX_FUZZ), ("strip", MAX_STRIP)):
        value = getattr(doc.policy, key)
        if not 0 <= value <= high:
            problems.append(f"$.policy.{key}: must be 0..{high}, not {value!r}")
    if not _PACKAGE.match(doc.package):
        problems.append(
            f"$.package: must be a folder of the wheel such as 'vllm' (names joined by '/'), "
            f"not {doc.package!r}"
        )
    if not _NAME.match(name):
        problems.append(f"$.name: must be letters and digits (joined by . _ -), not {name!r}")
    for old, new in doc.renames.items():
        for side in (old, new):
            try:
                relative(side)
            except UnsafePathError:
                problems.append(f"$.renames: {old!r} = {new!r} leaves the tree (refused): {side!r}")
    for kind, pins in (("bases", doc.bases), ("dependencies", doc.dependencies)):
        for key, pin in pins.items():
            if any(c in pin.wheel for c in "/\\\0"):
                problems.append(f"$.{kind}.{key}.wheel: must be a file name, not {pin.wheel!r}")
    for i, patch in enumerate(doc.patches):
        if not _PATCH_NAME.match(patch.file):
            problems.append(f"$.patches[{i}].file: is not NN-<path>.diff: {patch.file!r}")
        if patch.stage not in STAGES:
            problems.append(
                f"$.patches[{i}].stage: must be {STAGES[0]}..{STAGES[-1]}, not {patch.stage!r}"
            )
        if not patch.summary.strip():
            problems.append(f"$.patches[{i}].summary: is empty")
        for key in ("summary", "author", "upstream"):
            if "\n" in getattr(patch, key) or "\0" in getattr(patch, key):
                problems.append(f"$.patches[{i}].{key}: must be one line")
        if "\0" in patch.description:
            problems.append(f"$.patches[{i}].description: holds a NUL character")
    return problems


def validate(data: object, where: str, default_name: str = "series") -> SeriesDoc:
    """A parsed series.toml as a ``SeriesDoc``, or one ``SeriesError`` naming every problem:
    first every field of the wrong type or name, then every value out of range."""
    doc = decode(data, SeriesDoc, where=where, error=SeriesError, hint=_HINT)
    refuse(
        _range_problems(doc, doc.name or default_name), where=where, error=SeriesError, hint=_HINT
    )
    return doc


@dataclass(frozen=True)
class Pin:
    """One hash-pinned wheel: ``name==version``, its file name and sha256."""

    key: str  # "default", "cpu", or a dependency's project name
    requirement: Requirement
    wheel: str
    sha256: str
    is_base: bool = False  # one of the series' [bases] (`bakery bake --base KEY` bakes it)

    @property
    def name(self) -> str:
        return self.requirement.name

    @property
    def version(self) -> str:
        (spec,) = self.requirement.specifier
        return spec.version

    @classmethod
    def parse(cls, key: str, table: object, where: str, *, is_base: bool = False) -> Pin:
        """A pin from a mapping of requirement, wheel and sha256 (a state or index file)."""
        doc = decode(table, PinDoc, where=f"{where}: pin {key!r}", error=SeriesError, hint=_HINT)
        return cls.from_doc(key, doc, where, is_base=is_base)

    @classmethod
    def from_doc(cls, key: str, doc: PinDoc, where: str, *, is_base: bool = False) -> Pin:
        """The pin, once its format holds: name==version, 64 hex digits, a matching wheel."""
        try:
            requirement = Requirement(doc.requirement)
        except InvalidRequirement as exc:
            raise SeriesError(
                f"{where}: pin {key!r} (bad requirement, {_first_line(exc)}): {doc.requirement!r}",
                hint=_PIN_HINT,
            ) from None
        specs = list(requirement.specifier)
        if len(specs) != 1 or specs[0].operator != "==":
            raise SeriesError(
                f"{where}: pin {key!r} must be name==version: {str(requirement)!r}", hint=_PIN_HINT
            )
        if not is_sha256(doc.sha256):
            raise SeriesError(
                f"{where}: pin {key!r} (sha256 is not 64 hex digits): {doc.sha256!r}",
                hint=_PIN_HINT,
            )
        try:
            name, version, _, _ = parse_wheel_filename(doc.wheel)
        except InvalidWheelFilename as exc:
            raise SeriesError(
                f"{where}: pin {key!r} (bad wheel name, {_first_line(exc)}): {doc.wheel!r}",
                hint=_PIN_HINT,
            ) from None
        if name != canonicalize_name(requirement.name) or version != Version(specs[0].version):
            raise SeriesError(
                f"{where}: pin {key!r}: wheel {doc.wheel!r} is not {requirement}", hint=_PIN_HINT
            )
        return cls(key, requirement, doc.wheel, doc.sha256, is_base)


def _first_line(exc: Exception) -> str:
    """packaging's message without its caret drawing (an error is one line)."""
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


@dataclass(frozen=True)
class PatchEntry:
    number: int
    file: str
    summary: str
    stage: int
    description: str = ""
    author: str = ""
    upstream: str = ""

    def header(self) -> dict[str, str | int]:
        """The fields refresh and rebase carry over when a patch is written again."""
        return {
            "stage": self.stage,
            "summary": self.summary,
            **{k: v for k in HEADER if (v := getattr(self, k))},
        }


HEADER = ("description", "author", "upstream")  # optional per-patch fields


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
            raise SeriesError(
                f"unknown base (known: {known}): {key!r}",
                hint=f"pass one of them as `--base KEY` (the [bases.KEY] tables of "
                f"{self.root / 'series.toml'})",
            ) from None

    def patch_bytes(self, entry: PatchEntry) -> bytes:
        path = self.root / entry.file
        # A regular file only: a patch linked to /dev/zero or a FIFO would never end.
        if not path.is_file():
            raise SeriesError(f"patch is not a regular file: {str(path)!r}")
        try:
            return path.read_bytes()
        except OSError as exc:
            raise SeriesError(f"cannot read patch ({exc.strerror}): {str(path)!r}") from None

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
        """Identity of what a bake applies: every apply setting (where, with which path
        renames, strip and fuzz), then every patch's name and bytes in order
        (length-framed, so boundaries cannot shift)."""
        digest = hashlib.sha256()
        settings = {
            "package": self.package,
            "renames": self.renames,
            "max_fuzz": self.max_fuzz,
            "strip": self.strip,
        }
        digest.update(json.dumps(settings, sort_keys=True).encode() + b"\0")
        for entry in self.entries:
            data = self.patch_bytes(entry)
            digest.update(f"{entry.file}\0{len(data)}\0".encode() + data)
        return digest.hexdigest()

    @property
    def touched(self) -> tuple[str, ...]:
        """Every tree-relative path the series touches, sorted."""
        return tuple(sorted({path for patch in self.patches for path in patch.paths}))


def _entries(root: Path, docs: list[PatchDoc], where: str) -> tuple[PatchEntry, ...]:
    entries = []
    for doc in docs:  # validated: file matches _PATCH_NAME, stage and summary are set
        match = _PATCH_NAME.match(doc.file)
        assert match is not None  # _range_problems refused every other name
        entries.append(
            PatchEntry(
                int(match["number"]),
                doc.file,
                doc.summary,
                doc.stage,
                doc.description,
                doc.author,
                doc.upstream,
            )
        )
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


def load_series(root: Path) -> Series:
    root = Path(root)
    where = str(root / "series.toml")
    if not (root / "series.toml").exists():
        raise SeriesError(
            f"no series here (missing file): {where!r}",
            hint="run from the project root, or name a folder holding series.toml (patches/dcp2)",
        )
    data = read_toml(root / "series.toml", SeriesError)
    # The folder's name is checked like a written one: it goes into versions.
    doc = validate(data, where, default_name=root.name)
    return Series(
        root=root,
        name=doc.name or root.name,
        package=doc.package,
        bases={k: Pin.from_doc(k, v, where, is_base=True) for k, v in doc.bases.items()},
        dependencies={k: Pin.from_doc(k, v, where) for k, v in doc.dependencies.items()},
        renames=tuple(doc.renames.items()),
        max_fuzz=doc.policy.max_fuzz,
        strip=doc.policy.strip,
        entries=_entries(root, doc.patches, where),
        allow_names=dict(doc.linkcheck.allow),
    )
