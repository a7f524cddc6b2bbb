#!/usr/bin/env python3
"""Build the tiny random Llama used by the smoke test (a door onto bakery.verify.tiny_model).

usage: tools/tiny_model.py [OUT_DIR] [--force]    (default OUT_DIR: build/tiny-llama)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bakery.verify import tiny_model  # noqa: E402


def main(argv: list[str]) -> int:
    force = "--force" in argv
    rest = [a for a in argv if a != "--force"]
    out = Path(rest[0]) if rest else tiny_model.DEFAULT_DIR
    path = tiny_model.build(out) if force else tiny_model.ensure(out)
    print(f"tiny model: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
