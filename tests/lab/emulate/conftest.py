"""tests/lab/emulate: each stand-in of lab/emulate/bakery_emulate against an independent
reference."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from _emu import run_checks

# Modules whose CHECKS run in the child (Triton interpreted, vLLM from the bake).
CHILD_MODULES = (
    "test_emu_cache_insert",
    "test_emu_sparse_mla",
    "test_emu_slot_mapping",
    "test_emu_mhc",
    "test_emu_aten",
)


@pytest.fixture(scope="session")
def tree(cpu_bake) -> Path:
    """The baked cpu tree whose Triton kernels and vLLM references the stand-ins meet."""
    return Path(cpu_bake.tree)


@pytest.fixture(scope="session")
def child_results(tree) -> dict:
    """Every child check of the folder, run once in one engine-like child: module -> name
    -> verdict."""
    names = [f"{m}:{c}" for m in CHILD_MODULES for c in importlib.import_module(m).CHECKS]
    out: dict[str, dict] = {m: {} for m in CHILD_MODULES}
    for key, verdict in run_checks(tree, names).items():
        module, _, name = key.partition(":")
        out[module][name] = verdict
    return out
