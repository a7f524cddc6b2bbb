"""`bakery bake` and `bakery check`: the pinned wheel to a patched tree and wheel."""

from __future__ import annotations

from pathlib import Path

import click

from bakery.bake import manifest
from bakery.bake.bake import bake as run_bake
from bakery.bake.bake import pristine_edits, staleness, tree_dir
from bakery.cli.options import base_option, build_option, series_option
from bakery.errors import BakeryError, HunkFailed
from bakery.maintain.rebase_loop import refuse_during_rebase
from bakery.series import apply as apply_mod
from bakery.series.series import load_series


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
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
def check_cmd(directory: Path) -> None:
    """Re-hash a baked tree or patched site-packages against its BAKED.json."""
    path = manifest.find(directory)
    data = manifest.load(path)
    drift = manifest.drift(directory, data)
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
