"""Where the project's files are: the one resolver for every command and door.

The root is ``$BAKERY_ROOT`` when set (``launcher/dcp2/run.sh`` sets it to its own
checkout), else the nearest folder at or above the current one that holds the default
series, found the way git finds ``.git``. Never the package's own location: an installed
bakery lives in site-packages, far from any checkout.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "ROOT_ENV",
    "SERIES",
    "BUILD",
    "ARTIFACTS",
    "PROFILES",
    "MATRIX",
    "TINY_MODELS",
    "root",
]

ROOT_ENV = "BAKERY_ROOT"
# Paths relative to the root.
SERIES = Path("patches/dcp2")
BUILD = Path("build")
ARTIFACTS = Path("artifacts/dcp2")
PROFILES = Path("launcher/dcp2/profiles")
MATRIX = Path("launcher/dcp2/matrix.toml")
# The tiny test models' folders and the command that builds each: lab builds
# them there, and the launcher's refusal of a missing model folder names the command.
TINY_MODELS = {
    BUILD / "tiny-llama": "python tools/tiny_model.py",
    BUILD / "tiny-llama-perturbed": "python tools/tiny_model.py --perturbed",
    **{BUILD / f"tiny-v41-{name}": f"python tools/tiny_model.py --v41 {name}"
       for name in ("fast", "released", "batch", "dspark")},
}  # fmt: skip


def root(start: Path | None = None) -> Path:
    """The project root: ``$BAKERY_ROOT``, else the nearest folder at or above ``start``
    (default: the current folder) holding ``SERIES/series.toml``, as a path relative to the
    current folder ("." when it is the root, or when none is found)."""
    if env := os.environ.get(ROOT_ENV):
        return Path(env)
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / SERIES / "series.toml").is_file():
            return Path(os.path.relpath(folder))
    return Path(".")
