"""`bakery refresh`, `rebase`, `rebase-matrix` and `status`: the maintainer's loop."""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import click
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from bakery import project
from bakery.bake.bake import tree_dir
from bakery.bake.fetch import cache_dir
from bakery.cli.options import base_option, build_option, series_option, under_root
from bakery.errors import BakeryError, UsageError
from bakery.launch import lifecycle
from bakery.maintain import matrix as matrix_mod
from bakery.maintain import rebase as rebase_mod
from bakery.maintain import rebase_loop, refresh
from bakery.maintain import status as status_mod
from bakery.schema import encode_json
from bakery.series.series import load_series
from bakery.tree import write_atomic

# rebase and rebase-matrix: how far a hunk may stray in another release.
_release_fuzz = click.option(
    "--fuzz",
    type=click.IntRange(0, 3),
    default=3,
    show_default=True,
    help="Context lines a hunk may drop from each end to find its place in the release.",
)


@click.command("refresh")
@series_option
@base_option
@build_option
@click.option(
    "--check",
    "check_only",
    is_flag=True,
    help="Write nothing; exit 1 if any patch is unclean, stale or out of order.",
)
@click.option("--at", type=click.IntRange(0, 99), help="Number for a new patch.")
@click.option(
    "--stage",
    type=click.IntRange(1, 9),
    help="DCP stage recorded for new patches [default: the one last committed for the "
    "same patch file, else 1].",
)
@click.option(
    "--summary",
    help="One-line summary recorded for new patches [default: the one last committed for "
    "the same patch file].",
)
@click.option("--yes", is_flag=True, help="Remove patches of files that no longer differ.")
@click.option(
    "--no-bake",
    is_flag=True,
    help="Do not re-bake after writing the patches: record them in the tree's BAKED.json "
    "(checked against the tree); `bakery bake` builds the wheel later.",
)
@click.option(
    "--dry-run", is_flag=True, help="Show what refresh would write (a diff per patch file)."
)
def refresh_cmd(
    series_dir, base_key, build_dir, check_only, at, stage, summary, yes, no_bake, dry_run
):
    """Turn edits in the baked tree into the series' per-file patches."""
    series = load_series(series_dir)
    if check_only:
        source = click.get_current_context().get_parameter_source("base_key")
        explicit = source is not click.core.ParameterSource.DEFAULT
        refresh.check_bases(series, base_key if explicit else None, click.echo)
        return
    refresh.run(
        series,
        base_key,
        build_dir,
        click.echo,
        at=at,
        stage=stage,
        summary=summary,
        ask_to_remove=None if yes else _ask_to_remove,
        dry_run=dry_run,
        no_bake=no_bake,
    )


def _ask_to_remove(removed: list[str]) -> None:
    """Removing patches needs --yes, or a yes on a terminal."""
    if not sys.stdin.isatty():
        raise UsageError(
            f"would remove {len(removed)} patch(es) (pass --yes): " + ", ".join(removed)
        )
    click.confirm(f"remove {', '.join(removed)}?", abort=True)


@click.command("rebase")
@series_option
@base_option
@build_option
@click.option(
    "--to",
    "target",
    metavar="NAME==X.Y.Z",
    help="The release to try, e.g. vllm==0.33.0.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for the refreshed series and report (default build/rebase/<release>).",
)
@_release_fuzz
@click.option(
    "--in-place",
    is_flag=True,
    help="Also replace the current series with the refreshed one (only if all apply).",
)
@click.option(
    "--checkout",
    is_flag=True,
    help="Write the series onto the release into the baked tree, with 3-way conflict "
    "markers where it does not place; then fix them and --continue.",
)
@click.option(
    "--continue",
    "resume",
    is_flag=True,
    help="After --checkout: refresh the series from the fixed tree, move the pins, "
    "re-bake, linkcheck.",
)
@click.option(
    "--abort",
    is_flag=True,
    help="After --checkout: restore the series and the baked tree as they were.",
)
@click.option(
    "--drop-base",
    "drop",
    multiple=True,
    metavar="KEY",
    help="With --continue: remove this other base (e.g. cpu) from series.toml when the "
    "rebased series no longer bakes on it.",
)
@click.option(
    "--keep-base",
    "keep",
    multiple=True,
    metavar="KEY",
    help="With --continue: keep this other base's pin although the rebased series no "
    "longer bakes on it.",
)
def rebase_cmd(
    series_dir,
    base_key,
    build_dir,
    target,
    out,
    fuzz,
    in_place,
    checkout,
    resume,
    abort,
    drop,
    keep,
) -> None:
    """Try the series on another release: per-hunk report, refreshed series, linkcheck.

    With --checkout, --continue and --abort it is the conflict loop of `git rebase`."""
    _check_rebase_options(target, out, in_place, checkout, resume, abort, drop, keep)
    if resume:
        _rebase_continue(build_dir, series_dir, tuple(drop), tuple(keep))
        return None
    if abort:
        release, kept = rebase_loop.abort(build_dir, series_dir)
        for name in kept:
            click.echo(f"kept: {name} (changed after --continue wrote it)", err=True)
        click.echo(f"aborted the rebase onto {release}: series and tree restored")
        return
    series = load_series(series_dir)
    version = _release_version(target, series.base(base_key).name)
    if checkout:
        _rebase_checkout(series, version, build_dir, base_key, fuzz)
        return
    out = out or build_dir / "rebase" / f"{series.base(base_key).name}-{version}"
    report = rebase_mod.rebase(series, version, out, base_key=base_key, max_fuzz=fuzz)
    counts = Counter(h.status for h in report.hunks)
    click.echo(
        f"{report.release} (sha256 {report.sha256}): "
        + ", ".join(f"{counts[k]} {k}" for k in sorted(counts))
    )
    for patch, status in report.patches.items():
        click.echo(f"  {patch}: {status}")
    unplaced = [p for p, v in report.patches.items() if v == rebase_mod.PatchVerdict.FAILS]
    for forced in report.linkcheck_forced:
        click.echo(f"linkcheck: forced {forced}; a finding in it may come from the forcing")
    for finding in report.linkcheck:
        click.echo(f"linkcheck: {finding}{_tie(finding, series, unplaced)}")
    for note in report.kept_bases + report.notes:
        click.echo(f"warning: {note}", err=True)
    click.echo(f"refreshed series and report: {out}")
    failed = counts[rebase_mod.HunkVerdict.FAILED]
    if failed + len(report.linkcheck):
        raise BakeryError(
            f"{failed} hunk(s) failed and {len(report.linkcheck)} "
            f"linkcheck finding(s) on {report.release}",
            hint=f"see {out / 'rebase.md'}; `bakery rebase --checkout` writes the conflicts "
            "into the baked tree to fix them",
        )
    if in_place:
        rebase_mod.replace_series(series, out)
        click.echo(f"replaced {series.root} with the refreshed series")
    return None


def _check_rebase_options(target, out, in_place, checkout, resume, abort, drop, keep) -> None:
    """One mode at a time, and only the options that mode takes."""
    modes = [
        name
        for name, on in (
            ("--checkout", checkout),
            ("--continue", resume),
            ("--abort", abort),
            ("--in-place", in_place),
        )
        if on
    ]
    if len(modes) > 1:
        raise UsageError(f"choose one of {', '.join(modes)}")
    if (resume or abort) and (target or out):
        raise UsageError(f"{modes[0]} takes no --to or --out: the rebase in progress has them")
    if checkout and out:
        raise UsageError("--checkout writes into the baked tree and takes no --out")
    if not (resume or abort) and not target:
        raise UsageError("missing --to NAME==X.Y.Z", hint="e.g. `bakery rebase --to vllm==0.33.0`")
    if (drop or keep) and not resume:
        raise UsageError("--drop-base and --keep-base go with --continue")
    if set(drop) & set(keep):
        raise UsageError(
            "a base is either dropped or kept, not both: "
            + ", ".join(sorted(set(drop) & set(keep)))
        )


def _tie(finding: str, series, failed: list[str]) -> str:
    """The patch a linkcheck finding sits in, and a patch that failed to place whose
    added lines define the missing name (its code is absent, so the finding follows);
    one whose file the finding looked in first."""
    path, _, rest = finding.partition(":")
    paths = {p.name: p.paths for p in series.patches}
    owner = next((name for name, files in paths.items() if path in files), None)
    missing = rest.split(": ", 1)[-1].split(" (", 1)[0]
    names = [a or b for a, b in re.findall(r"'(\w+)'|self\.(\w+)", missing)]
    cause: list[str] = []
    for name in names:
        word = re.escape(name.encode())
        defines = re.compile(rb"^\+\s*(?:def |class )?(?:self\.)?" + word + rb"\b\s*[(:=]", re.M)
        cause += [
            f for f in failed if f != owner and defines.search((series.root / f).read_bytes())
        ]
    looked = [c for c in cause if any(f in finding for f in paths.get(c, ()))]
    out = f" [in {owner}]" if owner else ""
    return out + (f" [defined by {(looked or cause)[0]}, which did not place]" if cause else "")


def _rebase_checkout(series, version: str, build_dir: Path, base_key: str, fuzz: int) -> None:
    state = rebase_loop.checkout(
        series, version, build_dir, base_key=base_key, max_fuzz=fuzz, cache=cache_dir()
    )
    tree = tree_dir(build_dir, base_key) / series.package
    for path, info in state.files.items():
        fuzzed = f", fuzz {info.fuzz}: review it" if info.fuzz else ""
        click.echo(f"{info.status}: {tree / path} ({info.patch}{fuzzed})")
    for note in state.notes:
        click.echo(f"warning: {note}", err=True)
    status = rebase_loop.CheckoutStatus
    left = [p for p, info in state.files.items() if info.status is status.CONFLICT]
    reused = [p for p, info in state.files.items() if info.status is status.RESOLVED]
    if reused:
        click.echo(
            f"{len(reused)} conflict(s) resolved as you fixed them before "
            f"({build_dir / rebase_loop.RERERE}): review them"
        )
    rebase_loop.stop_at_conflicts(left)
    click.echo("no conflicts: review the tree, then `bakery rebase --continue`")


def _rebase_continue(
    build_dir: Path, series_dir: Path, drop: tuple[str, ...], keep: tuple[str, ...]
) -> None:
    done = rebase_loop.resume(build_dir, cache_dir(), series_dir, drop, keep)
    for action, file in done.changes:
        click.echo(f"{action}: {file}")
    for rel in done.strays:
        click.echo(f"ignored (stray file): {rel}")
    for note in done.notes:
        click.echo(f"warning: {note}", err=True)
    click.echo(f"re-baked {done.tree} on {done.release}")
    for finding in done.linkcheck:
        click.echo(f"linkcheck: {finding}")
    if done.linkcheck:
        raise BakeryError(
            f"rebased onto {done.release}, but linkcheck has {len(done.linkcheck)} finding(s)",
            hint="fix them in the baked tree, then `bakery refresh`",
        )
    click.echo(f"rebased onto {done.release}; linkcheck: 0 findings")


def _release_version(target: str, project: str, option: str = "--to") -> str:
    try:
        requirement = Requirement(target)
    except InvalidRequirement as exc:
        raise UsageError(f"{option} is not NAME==VERSION ({exc}): {target!r}") from None
    specs = list(requirement.specifier)
    if canonicalize_name(requirement.name) != canonicalize_name(project) or [
        s.operator for s in specs
    ] != ["=="]:
        raise UsageError(f"{option} must pin {project}==X.Y.Z: {target!r}")
    return specs[0].version


@click.command("rebase-matrix")
@series_option
@base_option
@click.option("--releases", help="Comma-separated versions, e.g. 0.31.0,0.32.0.")
@click.option(
    "--latest",
    is_flag=True,
    help="Ask the package index (through pip) for the newest releases of the base and "
    "each pinned dependency; the matrix is then the pin and the newest release.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    callback=under_root(project.BUILD / "matrix"),
    show_default="build/matrix in the repo root",
    help="Folder for each release's refreshed series and the matrix report.",
)
@_release_fuzz
@click.option("--no-linkcheck", is_flag=True, help="Skip linkcheck (text status only).")
@click.option(
    "--strict",
    is_flag=True,
    help="Exit 1 if any release is missing, any patch fails or linkcheck finds anything.",
)
def rebase_matrix_cmd(
    series_dir, base_key, releases, latest, out, fuzz, no_linkcheck, strict
) -> None:
    """Patch x release table of apply status and linkcheck findings (Markdown + JSON).

    A release that cannot be fetched is a row of "missing", not an abort."""
    if bool(releases) == latest:
        raise UsageError(
            "give one of --releases and --latest",
            hint="e.g. `bakery rebase-matrix --latest` or `--releases 0.32.0,0.33.0`",
        )
    series = load_series(series_dir)
    project = series.base(base_key).name
    if latest:
        found = matrix_mod.newest(series, base_key)
        for pinned in found:
            click.echo(f"{pinned.name}: pinned {pinned.pinned}, newest {pinned.newest}")
        versions = list(dict.fromkeys([found[0].pinned, found[0].newest]))
    else:
        versions = [
            _release_version(f"{project}=={v.strip()}", project, "--releases")
            for v in releases.split(",")
        ]
    table = matrix_mod.matrix(
        series, versions, base_key=base_key, max_fuzz=fuzz, linkcheck=not no_linkcheck
    )
    out.mkdir(parents=True, exist_ok=True)
    markdown = matrix_mod.matrix_markdown(table)
    write_atomic(out / "matrix.json", encode_json(table))
    write_atomic(out / "matrix.md", markdown.encode())
    click.echo(markdown, nl=False)
    click.echo(f"written: {out / 'matrix.md'}, {out / 'matrix.json'}")
    for version, row in table.releases.items():
        if isinstance(row, matrix_mod.MissingRelease):
            click.echo(f"warning: {version}: {row.error}", err=True)
        else:
            for note in row.notes:
                click.echo(f"warning: {version}: {note}", err=True)
    failures = matrix_mod.matrix_failures(table)
    if strict and failures:
        raise BakeryError(
            f"{len(failures)} failure(s) in the matrix (--strict): " + "; ".join(failures),
            hint=f"see {out / 'matrix.md'}",
        )


@click.command("status")
@series_option
@build_option
@click.option(
    "--artifacts",
    type=click.Path(file_okay=False, path_type=Path),
    callback=under_root(project.ARTIFACTS),
    show_default="artifacts/dcp2 in the repo root",
    help="Where the launcher records its runs.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON on stdout.")
def status_cmd(series_dir, build_dir, artifacts, as_json) -> None:
    """What is baked (series, pins), whether it is stale, pending edits, rebase, servers."""
    servers = [row for row in lifecycle.status(artifacts, None) if row.running]
    report = status_mod.collect(load_series(series_dir), build_dir, servers)
    if as_json:
        click.echo(encode_json(report).decode(), nl=False)
        return
    for line in status_mod.lines(report):
        click.echo(line)
