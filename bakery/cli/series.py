"""`bakery apply` and `bakery stages`: the series and its hunk engine."""

from __future__ import annotations

import json
import shutil
import textwrap
from dataclasses import asdict
from pathlib import Path

import click

from bakery.cli.options import series_option
from bakery.errors import BakeryError
from bakery.series import apply as apply_mod
from bakery.series import stages
from bakery.series.diff import parse_patch, parse_renames, read_patch


def _placement_text(placement) -> str:
    notes = []
    if placement.offset:
        notes.append(f"offset {placement.offset:+d}")
    if placement.fuzz:
        notes.append(f"fuzz {placement.fuzz}")
    return f"#{placement.hunk} at {placement.line}" + (f" ({', '.join(notes)})" if notes else "")


def _plan_json(plan: apply_mod.ApplyPlan, dry_run: bool) -> dict:
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


def _print_plan(plan: apply_mod.ApplyPlan, dry_run: bool) -> None:
    for outcome in plan.outcomes:
        if outcome.status is apply_mod.ApplyStatus.ALREADY_APPLIED:
            click.echo(
                f"{outcome.patch.name}: already applied (it reverse-applies cleanly), skipped"
            )
            continue
        click.echo(f"{outcome.patch.name}: {'would apply' if dry_run else 'applied'}")
        for result in outcome.files:
            hunks = ", ".join(_placement_text(p) for p in result.placements)
            click.echo(f"  {result.path}: {hunks}")


@click.command("apply")
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


def _stage_text(stage: stages.Stage, width: int) -> list[str]:
    """One stage for a terminal: a heading line, then wrapped, labelled paragraphs."""
    out = [f"stage {stage.number}: {stage.name} ({stage.status})"]
    fields = (
        ("enables", (stage.enables,)),
        ("gates", stage.env),
        ("constraints", stage.requires),
        ("patches", stage.patches),
    )
    for label, items in fields:
        for i, item in enumerate(items):
            head = f"  {label}: " if i == 0 else " " * (len(label) + 4)
            out += textwrap.wrap(
                item,
                width,
                initial_indent=head,
                subsequent_indent=" " * (len(label) + 4),
                break_on_hyphens=False,
                break_long_words=False,
            ) or [head.rstrip()]
    return out


@click.command("stages")
@series_option
@click.option("--write", is_flag=True, help="Render stages.toml's table into PLAN.md first.")
@click.option(
    "--markdown", "as_markdown", is_flag=True, help="Print the Markdown table PLAN.md holds."
)
def stages_cmd(series_dir: Path, write: bool, as_markdown: bool) -> None:
    """Print the stage table; exit 1 if stages.toml, PLAN.md and series.toml disagree."""
    if write:
        stages.write_plan(series_dir)
    elif as_markdown:
        click.echo(stages.render_table(stages.load_stages(series_dir)))
    else:
        width = max(40, min(100, shutil.get_terminal_size().columns))
        for stage in stages.load_stages(series_dir):
            click.echo("\n".join(_stage_text(stage, width)))
    problems = stages.stage_table_problems(series_dir)
    for problem in problems:
        click.echo(problem, err=True)
    if problems:  # a failed check, like `refresh --check`: exit 1
        raise BakeryError(
            f"{len(problems)} stage problem(s) in {series_dir}",
            hint="edit stages.toml (the source), then `bakery stages --write`",
        )
