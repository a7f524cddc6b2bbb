"""The rebase matrix: patch x release, each release's verdicts and linkcheck findings; and
the release watch, which asks the package index for the newest releases to put in it.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from bakery import markdown
from bakery.bake.fetch import cache_dir, release_versions, wheel_platform
from bakery.errors import FetchError
from bakery.maintain.rebase import (
    PatchVerdict,
    linkcheck_on,
    patch_status,
    release_files,
    release_pin,
    survey,
)
from bakery.progress import step
from bakery.series.series import Series

__all__ = [
    "ReleaseRow",
    "MissingRelease",
    "MatrixTable",
    "Newest",
    "matrix",
    "matrix_markdown",
    "matrix_failures",
    "newest",
]


class ReleaseRow(msgspec.Struct, frozen=True):
    """One release of matrix.json: its wheel, each patch's verdict and linkcheck's
    findings on the series forced onto it (None: skipped), and notes on its sources."""

    wheel: str
    sha256: str
    patches: dict[str, PatchVerdict]
    linkcheck: list[str] | None
    notes: list[str] = []


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
            files = release_files(series, pin, cache)
            statuses = survey(series, files, max_fuzz)
        statuses_by_patch = {e.file: patch_status(statuses, e.file) for e in series.entries}
        checked = None
        if linkcheck:
            with step(f"{base.name}=={version}: linkcheck"):
                checked = linkcheck_on(series, base_key, pin, files, max_fuzz, cache)
        table.releases[version] = ReleaseRow(
            pin.wheel,
            pin.sha256,
            statuses_by_patch,
            checked.findings if checked else None,
            checked.notes if checked else [],
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


class Newest(msgspec.Struct, frozen=True):
    """One project the series pins: its pin and the newest release the index lists."""

    name: str
    pinned: str
    newest: str


def newest(series: Series, base_key: str = "default") -> list[Newest]:
    """The base's project (vllm, for its wheel's platform) and each third-party dependency
    of the series: pinned version and newest final release, asked of the index (pip)."""
    base = series.base(base_key)
    asked = [(base.name, base.version, wheel_platform(base.wheel))]
    asked += [(dep.name, dep.version, "any") for dep in series.dependencies.values()]
    out = []
    for name, pinned, platform in asked:
        with step(f"{name}: asking the package index for its releases"):
            versions = release_versions(name, platform)
        out.append(Newest(name, str(pinned), str(versions[0])))
    return out
