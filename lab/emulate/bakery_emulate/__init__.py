"""Torch stand-ins for CUDA-only kernels, loaded by ``lab/emulate/sitecustomize.py``.

The stand-ins share the lab's math (``lab.dcp.merge``): the repository root is appended to
``sys.path`` (last, so nothing installed is shadowed) for the processes that put only
``lab/emulate`` and a baked tree on PYTHONPATH (the launcher's, vLLM's workers).
"""

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[3])
if _ROOT not in sys.path:
    sys.path.append(_ROOT)
