#!/usr/bin/env python3
"""Build the tiny random models the tests serve (a door onto lab.tiny_model and
lab.tiny_v41).

usage: tools/tiny_model.py [OUT_DIR] [--force] [--v41 batch|dspark|fast|released | --perturbed]
  default OUT_DIR: build/tiny-llama, build/tiny-v41-NAME with --v41,
  build/tiny-llama-perturbed with --perturbed
"""

import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bakery import project  # noqa: E402
from bakery.cli.boundary import run_command  # noqa: E402
from lab import tiny_model, tiny_v41  # noqa: E402


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("out_dir", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Rebuild it even when a complete one is there.")
@click.option(
    "--v41",
    type=click.Choice(sorted(tiny_v41.SPECS)),
    help="A tiny random DeepSeek-V4.1 instead of the Llama: 'fast' (CI index and candidate "
    "settings) or 'released' (the released ones; slow to serve).",
)
@click.option(
    "--perturbed",
    is_flag=True,
    help="A copy of the tiny Llama (built first when missing) with one attention weight "
    "moved (model.layers.0.self_attn.v_proj.weight[0, 0] += 50): the planted bug that "
    "matrix-cpu.toml's tiny-perturbed candidate must fail on.",
)
def tiny(out_dir: Path | None, force: bool, v41: str | None, perturbed: bool) -> None:
    """Build a tiny random model in OUT_DIR [default: build/tiny-llama,
    build/tiny-v41-NAME with --v41, build/tiny-llama-perturbed with --perturbed], once."""
    if perturbed and v41 is not None:
        raise click.UsageError("--perturbed copies the tiny Llama; it takes no --v41")
    if perturbed:
        out = out_dir or project.root() / tiny_model.PERTURBED_DIR
        if force or not (out / tiny_model.MARKER).is_file():
            base = tiny_model.ensure(project.root() / tiny_model.DEFAULT_DIR)
            tensor, index, delta = tiny_model.PLANTED
            tiny_model.perturb(base, out, tensor, index, delta)
        path = out
    elif v41 is None:
        out = out_dir or project.root() / tiny_model.DEFAULT_DIR
        path = tiny_model.build(out) if force else tiny_model.ensure(out)
    else:
        spec = tiny_v41.SPECS[v41]
        out = out_dir or project.root() / tiny_v41.DEFAULT_DIRS[v41]
        path = tiny_v41.build(out, spec) if force else tiny_v41.ensure(out, spec)
    click.echo(f"tiny model: {path}")


if __name__ == "__main__":
    sys.exit(run_command(tiny, sys.argv[1:], "tools/tiny_model.py"))
