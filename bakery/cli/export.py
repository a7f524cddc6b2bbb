"""`bakery export --git DIR` and `bakery import --git DIR`: the series as a git branch."""

from __future__ import annotations

from pathlib import Path

import click

from bakery.cli.options import base_option, series_option
from bakery.maintain import export as export_mod
from bakery.series.series import load_series

_GIT_DIR = click.Path(file_okay=False, path_type=Path)


@click.command("export")
@series_option
@base_option
@click.option("--git", "out", type=_GIT_DIR, required=True, help="A new folder for the repo.")
@click.option("--by-stage", is_flag=True, help="One commit per DCP stage, not per patch.")
def export_cmd(series_dir, base_key, out, by_stage) -> None:
    """The pristine sources as a git repository, then one commit per patch (or stage),
    messages from the patches' headers: git log, blame, rebase -i, format-patch."""
    series = load_series(series_dir)
    for line in export_mod.export(series, base_key, out, by_stage=by_stage):
        click.echo(f"commit: {line}")
    click.echo(
        f"exported {series.name} to {out}: branch {export_mod.BRANCH}, the base at tag "
        f"{export_mod.PRISTINE_TAG}; `bakery import --git {out}` brings commits back"
    )


@click.command("import")
@series_option
@base_option
@click.option("--git", "repo", type=_GIT_DIR, required=True, help="A repo `export` wrote.")
@click.option("--yes", is_flag=True, help="Remove patches whose files HEAD no longer changes.")
def import_cmd(series_dir, base_key, repo, yes) -> None:
    """The way back: HEAD's changes against the pristine tag become the series' patches;
    each commit naming a patch (Bakery-Patch:) gives it its summary, description, author."""
    series = load_series(series_dir)
    lines = export_mod.import_git(series, base_key, repo, yes=yes)
    for line in lines:
        click.echo(line)
    if not lines:
        click.echo(f"nothing to import: the series matches {repo}")
    click.echo(f"next: review `git diff {series.root}`, then `bakery bake --base {base_key}`")
