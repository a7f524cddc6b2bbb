#!/usr/bin/env python3
"""Build the tiny random Llama used by the smoke test (a door onto bakery.verify.tiny_model).

usage: tools/tiny_model.py [OUT_DIR] [--force]    (default OUT_DIR: build/tiny-llama)
"""

import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bakery.cli.boundary import run_command  # noqa: E402
from bakery.cli.options import under_root  # noqa: E402
from bakery.verify import tiny_model  # noqa: E402


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument(
    "out_dir",
    required=False,
    type=click.Path(file_okay=False, path_type=Path),
    callback=under_root(tiny_model.DEFAULT_DIR),
)
@click.option("--force", is_flag=True, help="Rebuild it even when a complete one is there.")
def tiny(out_dir: Path, force: bool) -> None:
    """Build the tiny random Llama in OUT_DIR [default: build/tiny-llama], once."""
    path = tiny_model.build(out_dir) if force else tiny_model.ensure(out_dir)
    click.echo(f"tiny model: {path}")


if __name__ == "__main__":
    sys.exit(run_command(tiny, sys.argv[1:], "tools/tiny_model.py"))
