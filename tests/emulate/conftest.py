"""tests/emulate: each stand-in of emulate/bakery_emulate against an independent reference."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tree(cpu_bake) -> Path:
    """The baked cpu tree whose Triton kernels and vLLM references the stand-ins meet."""
    return Path(cpu_bake.tree)
