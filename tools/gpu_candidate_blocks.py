#!/usr/bin/env python3
"""A door: the run, its usage and its outputs are lab/gpu/candidate_blocks.py's."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lab.gpu.candidate_blocks import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
