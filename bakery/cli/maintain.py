"""`bakery refresh`, `rebase`, `rebase-matrix` and `status`: the maintainer's loop."""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections import Counter
from pathlib import Path

import click
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from bakery import project
from bakery.bake import manifest
from bakery.bake.bake import bake as run_bake
from bakery.bake.bake import tree_dir
from bakery.bake.fetch import cache_dir
from bakery.bake.pristine import unpacked
from bakery.cli.options import base_option, build_option, series_option, under_root
from bakery.errors import BakeryError, UsageError
from bakery.maintain import rebase as rebase_mod
from bakery.maintain import rebase_loop, refresh
from bakery.maintain import status as status_mod
from bakery.maintain.rebase_loop import refuse_during_rebase
from bakery.series.diff import NEW_PREFIX, OLD_PREFIX, render_file_diff
from bakery.series.series import load_series
from bakery.tree import read_file, write_atomic


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
        _check_every_base(series, base_key)
        return
    refuse_during_rebase(build_dir)
    tree = tree_dir(build_dir, base_key)
    if not (tree / manifest.MANIFEST).is_file():
        raise BakeryError(
            f"no baked tree to refresh from: {str(tree)!r}",
            hint=f"run `bakery bake --base {base_key}`",
        )
    _refuse_if_series_moved(series, base_key, tree, build_dir)
    pristine_pkg = unpacked(series.base(base_key), build=build_dir) / series.package
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
            diff = _relabel(render_file_diff(change.file, old, change.data), series.root)
            click.echo(diff.decode("utf-8", "replace"), nl=False)
        click.echo("dry run: nothing written")
        return
    removed = [c.file for c in changes if c.action == "remove"]
    if removed and not yes:
        if not sys.stdin.isatty():
            raise UsageError(
                f"would remove {len(removed)} patch(es) (pass --yes): " + ", ".join(removed)
            )
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


def _relabel(diff: bytes, root: Path) -> bytes:
    """A diff of a patch file, labelled as that file (committed / as refresh writes it),
    not with the series' own tree labels (baked-ours/, baked/)."""
    lines = diff.split(b"\n", 2)
    if len(lines) < 3:
        return diff
    for i, (side, prefix) in enumerate(((b"--- ", OLD_PREFIX), (b"+++ ", NEW_PREFIX))):
        label = lines[i][len(side) :]
        if label.startswith(prefix.encode()):
            name = label[len(prefix) :].decode("utf-8", "surrogateescape")
            lines[i] = side + str(root / name).encode("utf-8", "surrogateescape")
    return b"\n".join(lines)


def _check_every_base(series, base_key: str) -> None:
    """`refresh --check`: the patches are up to date on every base of the series (a
    rebase that moved one base must not leave another unbakeable), or on --base alone."""
    source = click.get_current_context().get_parameter_source("base_key")
    explicit = source is not click.core.ParameterSource.DEFAULT
    keys = [base_key] if explicit else sorted(series.bases, key=lambda k: (k != "default", k))
    problems = []
    for key in keys:
        found = refresh.patches_out_of_date(series, unpacked(series.base(key)) / series.package)
        problems += [f"[bases.{key}] {p}" if len(keys) > 1 else p for p in found]
    for problem in problems:
        click.echo(problem)
    if problems:
        raise BakeryError(
            f"{len(problems)} patch problem(s) on {len(keys)} base(s): the series needs a refresh",
            hint="bake, edit build/baked, then run `bakery refresh` (a base the series cannot "
            "serve any more: remove it from series.toml)",
        )
    click.echo(
        f"ok: {len(series.entries)} patch(es) are clean and up to date on "
        + ", ".join(f"{k} ({series.base(k).requirement})" for k in keys)
    )


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
        where = "" if series.root == project.root() / project.SERIES else f" --series {series.root}"
        where += "" if build == project.root() / project.BUILD else f" --build {build}"
        raise BakeryError(
            f"the series changed after {tree} was baked: refresh would undo that change",
            hint=f"to keep the series as it is, re-bake (`bakery bake --base {base_key}{where}`, "
            f"which replaces edits in {tree}); to keep the tree's edits, restore the "
            f"series (e.g. `git checkout -- {series.root}`) and refresh again",
        )


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
    if resume:
        _rebase_continue(build_dir, series_dir, tuple(drop), tuple(keep))
        return None
    if abort:
        state = rebase_loop.abort(build_dir, series_dir)
        for name in state["kept"]:
            click.echo(f"kept: {name} (changed after --continue wrote it)", err=True)
        click.echo(f"aborted the rebase onto {state['release']}: series and tree restored")
        return
    series = load_series(series_dir)
    version = _release_version(target, series.base(base_key).name)
    if checkout:
        _rebase_checkout(series, version, build_dir, base_key, fuzz)
        return
    out = out or build_dir / "rebase" / f"{series.base(base_key).name}-{version}"
    report = rebase_mod.rebase(series, version, out, base_key=base_key, max_fuzz=fuzz)
    counts = Counter(h["status"] for h in report["hunks"])
    click.echo(
        f"{report['release']} (sha256 {report['sha256']}): "
        + ", ".join(f"{counts[k]} {k}" for k in sorted(counts))
    )
    for patch, status in report["patches"].items():
        click.echo(f"  {patch}: {status}")
    unplaced = [p for p, v in report["patches"].items() if v == rebase_mod.PatchVerdict.FAILS]
    for finding in report["linkcheck"]:
        click.echo(f"linkcheck: {finding}{_tie(finding, series, unplaced)}")
    for note in report["kept_bases"]:
        click.echo(f"warning: {note}", err=True)
    click.echo(f"refreshed series and report: {out}")
    failed = counts[rebase_mod.HunkVerdict.FAILED]
    if failed + len(report["linkcheck"]):
        raise BakeryError(
            f"{failed} hunk(s) failed and {len(report['linkcheck'])} "
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
    for path, info in state["files"].items():
        fuzzed = f", fuzz {info['fuzz']}: review it" if info.get("fuzz") else ""
        click.echo(f"{info['status']}: {tree / path} ({info['patch']}{fuzzed})")
    for note in state["notes"]:
        click.echo(f"warning: {note}", err=True)
    conflict = rebase_loop.CheckoutStatus.CONFLICT  # state.json holds its word
    left = [p for p, info in state["files"].items() if info["status"] == conflict]
    reused = [
        p for p, i in state["files"].items() if i["status"] == rebase_loop.CheckoutStatus.RESOLVED
    ]
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
    report = rebase_loop.resume(build_dir, cache_dir(), series_dir, drop, keep)
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
@click.option("--releases", required=True, help="Comma-separated versions, e.g. 0.31.0,0.32.0.")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    callback=under_root(project.BUILD / "matrix"),
    show_default="build/matrix in the repo root",
)
@click.option("--fuzz", type=click.IntRange(0, 3), default=3, show_default=True)
@click.option("--no-linkcheck", is_flag=True, help="Skip linkcheck (text status only).")
@click.option(
    "--strict",
    is_flag=True,
    help="Exit 1 if any release is missing, any patch fails or linkcheck finds anything.",
)
def rebase_matrix_cmd(series_dir, base_key, releases, out, fuzz, no_linkcheck, strict) -> None:
    """Patch x release table of apply status and linkcheck findings (Markdown + JSON).

    A release that cannot be fetched is a row of "missing", not an abort."""
    series = load_series(series_dir)
    project = series.base(base_key).name
    versions = [
        _release_version(f"{project}=={v.strip()}", project, "--releases")
        for v in releases.split(",")
    ]
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
    report = status_mod.collect(load_series(series_dir), build_dir, artifacts)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    for line in status_mod.lines(report):
        click.echo(line)
