#!/usr/bin/env python3
"""Apply unified diffs to a tree with GNU patch semantics (a door onto `bakery apply`).

usage: python tools/apply.py [--fuzz N] [--rename OLD=NEW]... [-p N|--strip N] [--dry-run]
                             [--reverse] [--json] TREE PATCH...
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bakery.cli.root import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["apply", *sys.argv[1:]]))
