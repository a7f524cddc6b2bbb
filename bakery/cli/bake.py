"""`bakery bake` and `bakery check`: the pinned wheel to a patched tree and wheel, and
the re-hash of a baked tree or an installed patched wheel."""

from __future__ import annotations

import dataclasses
import itertools
import json
import subprocess
from collections.abc import Iterable
from pathlib import Path

import click

from bakery.bake import clean, manifest
from bakery.bake.bake import bake as run_bake
from bakery.bake.bake import refuse_lost_edits, staleness, tree_dir, up_to
from bakery.bake.fetch import cache_dir
from bakery.bake.pristine import pristine_edits
from bakery.cli.options import base_option, build_option, series_option
from bakery.errors import BakeryError, HunkFailed, UsageError
from bakery.maintain import rebase_loop
from bakery.maintain.rebase_loop import refuse_during_rebase
from bakery.series import apply as apply_mod
from bakery.series.series import load_series

_discard = click.option(
    "--discard-edits",
    is_flag=True,
    help="Replace the baked tree even though it holds edits since its bake (they are lost; "
    "without it the command refuses and names them).",
)


@click.command("bake")
@series_option
@base_option
@click.option(
    "--wheel",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Use this local wheel instead of downloading (its sha256 is still checked).",
)
@build_option
@click.option(
    "--check",
    "check_only",
    is_flag=True,
    help="Write nothing; exit 1 if the baked tree is missing or stale.",
)
@click.option(
    "--upto",
    metavar="NN",
    help="Bake only the patches up to this one (number or file name; 0: none), tree only, "
    "no wheel: a bisect step (quilt's push NN). `bakery bake` bakes the whole series again.",
)
@_discard
def bake_cmd(series_dir, base_key, wheel, build_dir, check_only, upto, discard_edits) -> None:
    """Fetch the pinned wheel, apply the series, write tree + BAKED.json + wheel."""
    series = load_series(series_dir)
    if upto is not None:
        if check_only:
            raise UsageError("--upto bakes; it does not go with --check")
        refuse_during_rebase(build_dir)
        part = up_to(series, upto)
        refuse_lost_edits(build_dir, base_key, discard_edits)
        result = run_bake(part, base_key, build=build_dir, wheel=wheel, write_wheel=False)
        last = part.entries[-1].file if part.entries else "none"
        click.echo(
            f"baked {result.tree} with {len(part.entries)} of {len(series.entries)} patch(es) "
            f"(up to {last}); no wheel. `bakery bake --base {base_key}` bakes the whole series"
        )
        return
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
    refuse_lost_edits(build_dir, base_key, discard_edits)
    try:
        result = run_bake(series, base_key, build=build_dir, wheel=wheel)
    except HunkFailed as exc:
        # bake has no --fuzz: the series' fuzz is its policy, in series.toml.
        exc.hint = (
            f"refresh the patch against this base (`bakery rebase --checkout` writes the "
            f"conflicts to fix), or allow fuzz in the series (`max_fuzz` under [policy] in "
            f"{series.root / 'series.toml'})"
        )
        raise
    for outcome in result.plan.outcomes:
        if outcome.status is apply_mod.ApplyStatus.ALREADY_APPLIED:
            click.echo(f"warning: {outcome.patch.name} is already in the base", err=True)
    click.echo(
        f"baked {result.tree} (series {series.name} {series.sha256[:8]}, "
        f"{len(result.plan.changed)} file(s) patched)"
    )
    click.echo(f"wheel {result.wheel}")
    for name in result.superseded:
        click.echo(f"removed older wheel: {result.wheel.parent / name}")


@click.command("check")
@click.argument(
    "directory", required=False, type=click.Path(exists=True, file_okay=False, path_type=Path)
)
@click.option(
    "--python",
    "python",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Check the patched wheel installed in this Python's environment (bakery need not "
    "be installed there).",
)
def check_cmd(directory: Path | None, python: Path | None) -> None:
    """Re-hash a baked tree or patched site-packages: the touched files against its
    BAKED.json, every other file against RECORD."""
    if (directory is None) == (python is None):
        raise UsageError(
            "give a DIRECTORY or --python, one of the two",
            hint="e.g. `bakery check build/baked` or `bakery check --python /opt/vllm/bin/python`",
        )
    if python is not None:
        directory = _site_packages(python)
    assert directory is not None
    path = manifest.find(directory)
    data = manifest.load(path)
    drift = manifest.drift(directory, data)
    others, checked = manifest.record_drift(directory, path, data)
    for label, paths in (
        ("modified", drift.modified + others.modified),
        ("missing", drift.missing + others.missing),
        ("extra", drift.extra),
    ):
        for rel in paths:
            click.echo(f"{label}: {rel}")
    # A tree an older bakery baked may still share its untouched files with the cache.
    linked = pristine_edits(data.base.sha256) if path.parent == directory else []
    for line in linked:
        click.echo(line)
    count = sum(len(d.modified) + len(d.missing) + len(d.extra) for d in (drift, others))
    if count or linked:
        raise BakeryError(
            f"{count + len(linked)} file(s) drifted from {path} and RECORD",
            hint="re-run `make bake` (or reinstall the patched wheel)",
        )
    click.echo(
        f"ok: {len(data.files)} touched file(s) match {path}; {checked} other file(s) match RECORD"
    )


def _site_packages(python: Path) -> Path:
    """The site-packages of ``python`` holding a patched wheel (its BAKED.json)."""
    code = (
        "import json, sysconfig; p = sysconfig.get_paths(); "
        "print(json.dumps([p['purelib'], p['platlib']]))"
    )
    try:
        proc = subprocess.run(
            [str(python), "-I", "-c", code], capture_output=True, text=True, timeout=60
        )
        folders = [Path(p) for p in json.loads(proc.stdout)] if proc.returncode == 0 else []
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"cannot run that Python ({exc}): {str(python)!r}") from None
    if not folders:
        raise UsageError(f"that Python did not name its site-packages: {str(python)!r}")
    found = [f for f in dict.fromkeys(folders) if list(f.glob(f"*.dist-info/{manifest.MANIFEST}"))]
    if not found:
        raise BakeryError(
            f"no patched wheel installed for {python} (no *.dist-info/{manifest.MANIFEST} "
            f"in {', '.join(map(str, dict.fromkeys(folders)))})",
            hint="pip install the wheel `bakery status` names into that environment",
        )
    return found[0]


@click.command("clean")
@series_option
@build_option
@click.option("--all", "everything", is_flag=True, help="Also the baked trees and current wheels.")
@click.option(
    "--cache",
    "gc_cache",
    is_flag=True,
    help="Also the cache ($BAKERY_CACHE): wheels, pristine trees and sources no pin of this "
    "series, bake or rebase wants (the cache may be shared: another checkout re-fetches).",
)
@click.option("--dry-run", is_flag=True, help="List what would go, and its size; remove nothing.")
def clean_cmd(series_dir, build_dir, everything, gc_cache, dry_run) -> None:
    """Remove superseded wheels, reports and trash from the build folder (and the cache)."""
    series = load_series(series_dir)
    default = click.get_current_context().get_parameter_source("build_dir")
    clean.check_build_folder(build_dir, default == click.core.ParameterSource.DEFAULT)
    state = rebase_loop.in_progress(build_dir)
    if state and everything:
        raise UsageError(
            f"a rebase onto {state.release} is in progress in {build_dir}: --all would "
            "drop its saved series and tree",
            hint="finish it with `bakery rebase --continue` or `bakery rebase --abort` first",
        )
    tables = [state.pin, *state.dependencies.values(), *state.other_bases.values()] if state else []
    extra = [str(t.get("sha256")) for t in tables if isinstance(t, dict)]
    plan = clean.build_garbage(
        build_dir,
        series.name,
        everything,
        series_files=tuple(e.file for e in series.entries),
        saved=build_dir / rebase_loop.STATE / "baked" if state else None,
        keep_bases=frozenset(extra),
    )
    cache_plan = clean.Plan()
    if gc_cache:
        pins = [*series.bases.values(), *series.dependencies.values()]
        keep = clean.wanted_hashes(pins, build_dir, extra)
        cache_plan = clean.cache_garbage(cache_dir(), keep)
    for link in plan.links + cache_plan.links:
        click.echo(f"left alone: {link} (a symlink: bakery never follows or removes one)")
    removals: Iterable[clean.Removal] = plan.removals + cache_plan.removals
    if not dry_run:
        # Lazy: each entry is yielded once it is gone, so a line never names one that is
        # still there; the build lock comes first, so a running bake refuses them all.
        own = build_dir.is_dir() and not build_dir.is_symlink()
        gone = clean.remove(plan.removals, build_dir if own else None)
        removals = itertools.chain(gone, clean.remove(cache_plan.removals))
    verb, count, total = "would remove" if dry_run else "removed", 0, 0
    for removal in removals:
        click.echo(f"{verb}: {removal.path} ({removal.size / 1e6:.1f} MB; {removal.why})")
        count, total = count + 1, total + removal.size
    what = f"{count} item(s), {total / 1e6:.1f} MB"
    click.echo(f"dry run: {what} would go" if dry_run else f"clean: {what} freed")


@click.command("bisect", context_settings={"ignore_unknown_options": True})
@series_option
@base_option
@build_option
@click.option(
    "--good",
    default="0",
    show_default=True,
    metavar="NN",
    help="The last patch known good (0: the pristine base passes).",
)
@_discard
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def bisect_cmd(series_dir, base_key, build_dir, good, discard_edits, command) -> None:
    """Find the first patch that makes COMMAND fail, as `git bisect run` does: bake the
    patches up to N (tree only), run COMMAND, exit 0 is good, anything else bad. The
    whole series is baked again at the end."""
    series = load_series(series_dir)
    refuse_during_rebase(build_dir)
    total = len(series.entries)
    low = len(up_to(series, good).entries)  # known good: this many patches
    refuse_lost_edits(build_dir, base_key, discard_edits)

    def passes(count: int) -> bool:
        part = dataclasses.replace(series, entries=series.entries[:count])
        run_bake(part, base_key, build=build_dir, write_wheel=False)
        code = subprocess.run(list(command), check=False).returncode
        last = series.entries[count - 1].file if count else "none"
        click.echo(
            f"bisect: {count} of {total} patch(es) (up to {last}): "
            + ("good" if code == 0 else f"bad (exit {code})")
        )
        return code == 0

    try:
        if passes(total):
            raise BakeryError(
                "COMMAND passes on the whole series: there is no bad patch to find",
                hint="check that COMMAND fails on the tree `bakery bake` writes",
            )
        if not passes(low):
            raise BakeryError(
                f"COMMAND fails with {low} patch(es) too (--good {good})",
                hint="pass an earlier --good, or check COMMAND on the pristine base (--good 0)",
            )
        high = total
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if passes(mid) else (low, mid)
    finally:
        run_bake(series, base_key, build=build_dir)  # the whole series, as before
    entry = series.entries[high - 1]
    click.echo(f"first bad patch: {entry.file} (stage {entry.stage}): {entry.summary}")
