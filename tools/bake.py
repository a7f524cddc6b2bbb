#!/usr/bin/env python3
"""Bake the series onto its pinned vLLM wheel (a door onto `bakery bake`)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bakery.cli.root import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["bake", *sys.argv[1:]]))
