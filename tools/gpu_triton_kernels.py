#!/usr/bin/env python3
"""A door: the run, its usage and its outputs are lab/gpu/triton_kernels.py's (docs/gpu-dcp.md)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lab.gpu.triton_kernels import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
