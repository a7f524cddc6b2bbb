"""``start --installed``: serve the patched wheel installed in the serving Python.

The wheel ``make bake`` writes carries BAKED.json in its dist-info. With
``--installed`` no baked tree is put on PYTHONPATH; instead the site-packages
the serving Python imports ``vllm`` from must hold that manifest, baked from
this repo's series and base, with every touched file unmodified (the same
re-hash ``bakery check`` does).
"""

from __future__ import annotations

from pathlib import Path

from bakery.bake import manifest
from bakery.errors import BakeryError
from bakery.launch.errors import Problem
from bakery.series.series import Series

__all__ = ["installed_problems"]

_REINSTALL = "pip install the wheel `make bake` writes (build/dist/) into this Python"


def installed_problems(series: Series, base: str, vllm_file: str) -> tuple[Path | None, list]:
    """The manifest of the installed patched wheel (None if there is none) and its problems."""
    site = Path(vllm_file).resolve().parent.parent
    try:
        path = manifest.find(site)
        data = manifest.load(path)
    except BakeryError as exc:
        problem = Problem(
            "the serving Python has no patched wheel installed",
            str(exc),
            str(site),
            _REINSTALL + ", or drop --installed",
        )
        return None, [problem]
    out = []
    baked_from = data.series.sha256
    if baked_from != series.sha256:
        out.append(
            Problem(
                "the installed patched wheel is from another series",
                f"baked from series {baked_from[:8]}, the repo has {series.sha256[:8]}",
                str(path),
                _REINSTALL,
            )
        )
    try:
        pinned = series.base(base)
    except BakeryError as exc:
        return path, [Problem("unknown base", str(exc), base, "use --base default|cpu")]
    if data.base.sha256 != pinned.sha256:
        out.append(
            Problem(
                "the installed patched wheel is from another base",
                f"the profile's base is {pinned.requirement}",
                data.base.requirement,
                _REINSTALL + ", or pass --base",
            )
        )
    drift = manifest.drift(site, data)
    changed = [*drift.modified, *drift.missing, *drift.extra]
    if changed:
        out.append(
            Problem(
                "the installed patched wheel was modified",
                f"{len(changed)} touched file(s) differ from its BAKED.json",
                changed[0],
                _REINSTALL + " again",
            )
        )
    return path, out
