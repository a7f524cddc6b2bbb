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
from typing import Annotated

import msgspec
from msgspec import Meta
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from bakery.errors import SeriesError, UnsafePathError
from bakery.schema import (
    SHA256_PATTERN,
    Document,
    OneLine,
    Sha256,
    Text,
    decode,
    parse_toml,
    read_toml,
    refuse,
)
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
    "committed_headers",
]

_PATCH_NAME = r"^(?P<number>\d{2,})-(?P<slug>[^/\\\0]+)\.diff$"
# The package is a folder of the wheel (import names joined by '/'); the series
# name becomes part of a PEP 440 local version (+<name>.<sha>).
_PACKAGE = r"^[A-Za-z_][A-Za-z0-9_]*(/[A-Za-z_][A-Za-z0-9_]*)*$"
_PACKAGE_WORDS = "a folder of the wheel such as 'vllm' (names joined by '/')"
_NAME = r"^[A-Za-z0-9]+([._-][A-Za-z0-9]+)*$"
_NAME_WORDS = "letters and digits (joined by . _ -)"
MAX_FUZZ = 3  # as `bakery apply --fuzz`: beyond 3 a hunk keeps almost no context
MAX_STRIP = 16
STAGES = range(1, 10)  # as `bakery refresh --stage`


# series.toml's schema, the one place that knows its shape (bakery.schema decodes it).
class PinDoc(Document, frozen=True):
    """A pin as written; ``Pin`` is it parsed, with the key and table it was found under."""

    requirement: str
    wheel: Annotated[str, Meta(pattern=r"^[^/\\\0]*\Z", description="a file name")]
    sha256: Sha256


class PolicyDoc(Document, frozen=True):
    strip: Annotated[int, Meta(ge=0, le=MAX_STRIP, description=f"0..{MAX_STRIP}")] = 1
    max_fuzz: Annotated[int, Meta(ge=0, le=MAX_FUZZ, description=f"0..{MAX_FUZZ}")] = 0


class PatchEntry(Document, frozen=True):
    """One ``[[patches]]`` table; its number is its file name's prefix."""

    file: Annotated[str, Meta(pattern=_PATCH_NAME, description="NN-<path>.diff")]
    stage: Annotated[
        int, Meta(ge=STAGES[0], le=STAGES[-1], description=f"{STAGES[0]}..{STAGES[-1]}")
    ]
    summary: Annotated[str, Meta(pattern=r"^[^\n\0]*\S[^\n\0]*\Z", description="a line of text")]
    # The patch's header (quilt's `header`, git's message): what it does and why, who
    # wrote it, where it stands upstream (e.g. "not submitted", a PR link, "merged in X").
    description: Text = ""
    author: OneLine = ""
    upstream: OneLine = ""

    @property
    def number(self) -> int:
        return int(self.file.partition("-")[0])

    def header(self) -> dict[str, str | int]:
        """The fields refresh and rebase carry over when a patch is written again."""
        return {
            "stage": self.stage,
            "summary": self.summary,
            **{k: v for k in HEADER if (v := getattr(self, k))},
        }


HEADER = ("description", "author", "upstream")  # optional per-patch fields


class LinkcheckDoc(Document, frozen=True):
    allow: dict[str, str] = {}  # name -> why it may stay unresolved


class SeriesDoc(Document, frozen=True):
    bases: dict[str, PinDoc]
    # The folder's name when absent (checked by hand then: it goes into versions too).
    name: Annotated[str, Meta(pattern=_NAME, description=_NAME_WORDS)] | None = None
    package: Annotated[str, Meta(pattern=_PACKAGE, description=_PACKAGE_WORDS)] = "vllm"
    policy: PolicyDoc = msgspec.field(default_factory=PolicyDoc)
    renames: dict[str, str] = {}
    dependencies: dict[str, PinDoc] = {}
    patches: tuple[PatchEntry, ...] = ()
    linkcheck: LinkcheckDoc = msgspec.field(default_factory=LinkcheckDoc)


_HINT = "see patches/dcp2/series.toml for the expected fields and types"
_PIN_HINT = "a pin is requirement = 'name==version', its wheel's file name and that file's sha256"


def is_sha256(value: object) -> bool:
    """A sha256 as pins and BAKED.json spell it (``schema.Sha256``), for untyped data."""
    return isinstance(value, str) and re.search(SHA256_PATTERN, value) is not None


def _rule_problems(doc: SeriesDoc, folder: str) -> list[str]:
    """What the types cannot say: the default base, a folder name good as a series name,
    renames that stay in the tree. Wrong types and ranges are the schema's to report."""
    problems = []
    if "default" not in doc.bases:
        problems.append("$.bases.default: missing (the base `bakery bake` uses by default)")
    if doc.name is None and not re.match(_NAME, folder):
        problems.append(f"$.name: must be {_NAME_WORDS} (the folder's name), not {folder!r}")
    for old, new in doc.renames.items():
        for side in (old, new):
            try:
                relative(side)
            except UnsafePathError:
                problems.append(f"$.renames: {old!r} = {new!r} leaves the tree (refused): {side!r}")
    return problems


class _Headers(Document, frozen=True, forbid_unknown_fields=False):
    """series.toml's patch tables alone (its other tables are not read): another revision
    of it, as git keeps it."""

    patches: tuple[PatchEntry, ...] = ()


def committed_headers(text: str, where: str) -> dict[str, PatchEntry]:
    """Patch file -> its entry (refresh takes its header) in another revision of series.toml
    (git HEAD's), checked by the series' own schema: a header written back from it is
    one the series takes (a duplicate key is not TOML; a stage of 99 is refused here)."""
    data = parse_toml(text, where, SeriesError)
    hint = "fix series.toml and commit it: refresh takes a re-made patch's header from git HEAD"
    doc = decode(data, _Headers, where=where, error=SeriesError, hint=hint)
    return {entry.file: entry for entry in doc.patches}


def validate(data: object, where: str, default_name: str = "series") -> SeriesDoc:
    """A parsed series.toml as a ``SeriesDoc``, or one ``SeriesError`` naming every problem:
    first every field of the wrong type, name or range, then every broken rule."""
    doc = decode(data, SeriesDoc, where=where, error=SeriesError, hint=_HINT)
    refuse(_rule_problems(doc, default_name), where=where, error=SeriesError, hint=_HINT)
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
        """The pin, once its requirement is name==version and its wheel is of it."""
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
class Series:
    root: Path
    name: str
    package: str  # the wheel folder the diff paths are relative to
    bases: dict[str, Pin]
    dependencies: dict[str, Pin]
    renames: tuple[tuple[str, str], ...]
    policy: PolicyDoc
    entries: tuple[PatchEntry, ...]
    allow_names: dict[str, str]  # linkcheck allowlist: name -> reason

    @property
    def max_fuzz(self) -> int:
        return self.policy.max_fuzz

    @property
    def strip(self) -> int:
        return self.policy.strip

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


def _entries(root: Path, entries: tuple[PatchEntry, ...], where: str) -> tuple[PatchEntry, ...]:
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
        policy=doc.policy,
        entries=_entries(root, doc.patches, where),
        allow_names=dict(doc.linkcheck.allow),
    )
