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

from bakery.errors import SeriesError, UnsafePathError
from bakery.series.diff import Patch, parse_patch
from bakery.tree import relative

__all__ = [
    "Pin",
    "PatchEntry",
    "Series",
    "load_series",
    "validate",
    "is_sha256",
    "DEFAULT_SERIES",
]

DEFAULT_SERIES = Path("patches/dcp2")
_PATCH_NAME = re.compile(r"^(?P<number>\d{2,})-(?P<slug>[^/\\\0]+)\.diff$")
_SHA256 = re.compile(r"[0-9a-f]{64}")
# The package is a folder of the wheel (import names joined by '/'); the series
# name becomes part of a PEP 440 local version (+<name>.<sha>).
_PACKAGE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(/[A-Za-z_][A-Za-z0-9_]*)*$")
_NAME = re.compile(r"^[A-Za-z0-9]+([._-][A-Za-z0-9]+)*$")
MAX_FUZZ = 3  # as `bakery apply --fuzz`: beyond 3 a hunk keeps almost no context
MAX_STRIP = 16
STAGES = range(1, 10)  # as `bakery refresh --stage`


# series.toml's schema, the one place that knows its shape: a _Table has exactly
# these fields, a _Map any names (each to the same kind), a list an array of tables.
@dataclass(frozen=True)
class _Table:
    fields: dict
    required: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Map:
    value: object
    required: tuple[str, ...] = ()


_PIN_TABLE = _Table(
    {"requirement": str, "wheel": str, "sha256": str}, ("requirement", "wheel", "sha256")
)
_SCHEMA = _Table(
    {
        "name": str,
        "package": str,
        "policy": _Table({"strip": int, "max_fuzz": int}),
        "renames": _Map(str),
        "bases": _Map(_PIN_TABLE, ("default",)),
        "dependencies": _Map(_PIN_TABLE),
        "patches": [
            _Table({"file": str, "stage": int, "summary": str}, ("file", "stage", "summary"))
        ],
        "linkcheck": _Table({"allow": _Map(str)}),
    },
    ("bases",),
)
_TYPE_NAMES = {str: "a string", int: "an integer"}


def _schema_problems(value, spec, at: str) -> list[str]:
    """Every place ``value`` departs from ``spec``: unknown keys, wrong types, missing keys."""
    if isinstance(spec, type):
        # bool is an int in Python; `max_fuzz = true` is not a number of lines.
        if isinstance(value, spec) and not isinstance(value, bool):
            return []
        return [f"{at} must be {_TYPE_NAMES[spec]}, not {type(value).__name__} {value!r}"]
    if isinstance(spec, list):
        if not isinstance(value, list):
            return [f"{at} must be an array of tables ([[{at}]]), not {type(value).__name__}"]
        return [p for i, v in enumerate(value) for p in _schema_problems(v, spec[0], f"{at}[{i}]")]
    if not isinstance(value, dict):
        return [f"{at} must be a table, not {type(value).__name__} {value!r}"]
    prefix = f"{at}." if at else ""
    problems = [f"{prefix}{key} is missing" for key in spec.required if key not in value]
    if isinstance(spec, _Map):
        items = [(key, spec.value) for key in value]
    else:
        known = ", ".join(spec.fields)
        problems += [
            f"unknown field {prefix}{key} (known: {known})"
            for key in value
            if key not in spec.fields
        ]
        items = [(key, sub) for key, sub in spec.fields.items() if key in value]
    for key, sub in items:
        problems += _schema_problems(value[key], sub, f"{prefix}{key}")
    return problems


def is_sha256(value) -> bool:
    """A sha256 as pins and BAKED.json spell it: exactly 64 lowercase hex digits."""
    return isinstance(value, str) and _SHA256.fullmatch(value) is not None


def _typed(value, kind) -> bool:
    return isinstance(value, kind) and not isinstance(value, bool)


def _tables(value) -> list[tuple[str, dict]]:
    """The (name, table) pairs of a table of tables, skipping what the schema refuses."""
    return [(k, v) for k, v in value.items() if isinstance(v, dict)] if _typed(value, dict) else []


def _range_problems(data: dict) -> list[str]:
    """Values whose type is right but which are still unusable: out of range, or paths
    that could leave their folder. Wrong types are the schema's to report."""
    problems = []
    policy = data.get("policy") if _typed(data.get("policy"), dict) else {}
    for key, high in (("max_fuzz", MAX_FUZZ), ("strip", MAX_STRIP)):
        value = policy.get(key)
        if _typed(value, int) and not 0 <= value <= high:
            problems.append(f"policy.{key} must be 0..{high}, not {value!r}")
    package = data.get("package")
    if _typed(package, str) and not _PACKAGE.match(package):
        problems.append(
            f"package must be a folder of the wheel such as 'vllm' (names joined by '/'), "
            f"not {package!r}"
        )
    if _typed(data["name"], str) and not _NAME.match(data["name"]):
        problems.append(f"name must be letters and digits (joined by . _ -), not {data['name']!r}")
    renames = data.get("renames") if _typed(data.get("renames"), dict) else {}
    for old, new in renames.items():
        for side in (old, new) if _typed(new, str) else (old,):
            try:
                relative(side)
            except UnsafePathError:
                problems.append(f"renames: {old!r} = {new!r} leaves the tree (refused): {side!r}")
    for kind in ("bases", "dependencies"):
        for key, pin in _tables(data.get(kind)):
            wheel = pin.get("wheel")
            if _typed(wheel, str) and any(c in wheel for c in "/\\\0"):
                problems.append(f"{kind}.{key}.wheel must be a file name, not {wheel!r}")
    patches = data.get("patches") if _typed(data.get("patches"), list) else []
    for i, table in enumerate(patches):
        table = table if _typed(table, dict) else {}
        file, stage, summary = table.get("file"), table.get("stage"), table.get("summary")
        if _typed(file, str) and not _PATCH_NAME.match(file):
            problems.append(f"patches[{i}].file is not NN-<path>.diff: {file!r}")
        if _typed(stage, int) and stage not in STAGES:
            problems.append(f"patches[{i}].stage must be {STAGES[0]}..{STAGES[-1]}, not {stage!r}")
        if _typed(summary, str) and not summary.strip():
            problems.append(f"patches[{i}].summary is empty")
    return problems


def validate(data: dict, where: str) -> None:
    """Refuse a series.toml that is not exactly the schema, naming every problem at once."""
    problems = _schema_problems(data, _SCHEMA, "") + _range_problems(data)
    if problems:
        raise SeriesError(
            f"{where}: {len(problems)} problem(s): " + "; ".join(problems),
            hint="see patches/dcp2/series.toml for the expected fields and types",
        )


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
    def parse(cls, key: str, table: dict, where: str, *, is_base: bool = False) -> Pin:
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
        if not is_sha256(sha256):
            raise SeriesError(f"{where}: pin {key!r} (sha256 is not 64 hex digits): {sha256!r}")
        try:
            name, version, _, _ = parse_wheel_filename(wheel)
        except InvalidWheelFilename as exc:
            raise SeriesError(f"{where}: pin {key!r} (bad wheel name): {exc}") from None
        if name != canonicalize_name(requirement.name) or version != Version(specs[0].version):
            raise SeriesError(f"{where}: pin {key!r}: wheel {wheel!r} is not {requirement}")
        return cls(key, requirement, wheel, sha256, is_base)


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


def _entries(root: Path, tables: list[dict], where: str) -> tuple[PatchEntry, ...]:
    entries = []
    for table in tables:  # validated: file matches _PATCH_NAME, stage and summary are set
        number = int(_PATCH_NAME.match(table["file"])["number"])
        entries.append(PatchEntry(number, table["file"], table["summary"], table["stage"]))
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
        data = tomllib.loads((root / "series.toml").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SeriesError(f"no series here (missing file): {where!r}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SeriesError(f"cannot read series.toml ({exc}): {where!r}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SeriesError(f"{where}: not valid TOML ({exc})") from None
    data.setdefault("name", root.name)  # validated like a written name: it goes into versions
    validate(data, where)
    bases = {k: Pin.parse(k, v, where, is_base=True) for k, v in data.get("bases", {}).items()}
    deps = {k: Pin.parse(k, v, where) for k, v in data.get("dependencies", {}).items()}
    policy = data.get("policy", {})
    return Series(
        root=root,
        name=data["name"],
        package=data.get("package", "vllm"),
        bases=bases,
        dependencies=deps,
        renames=tuple(data.get("renames", {}).items()),
        max_fuzz=policy.get("max_fuzz", 0),
        strip=policy.get("strip", 1),
        entries=_entries(root, data.get("patches", []), where),
        allow_names={k: v for k, v in data.get("linkcheck", {}).get("allow", {}).items()},
    )
