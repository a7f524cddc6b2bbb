"""Import every module the series touches from a baked tree, for real.

Each module is imported in a fresh interpreter with the baked tree first on
``PYTHONPATH``, and the check fails unless ``vllm.__file__`` lies inside that
tree: passing by importing an unpatched site-packages copy is the failure
this exists to catch.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import msgspec

from bakery.schema import try_decode_json
from bakery.series.series import Series

__all__ = ["ImportResult", "touched_modules", "import_check"]

# One fresh interpreter imports every module in turn; each gets its own verdict.
_PROBE = """
import importlib, json, sys
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        import vllm
        print(json.dumps({"module": name, "ok": True, "vllm": vllm.__file__}), flush=True)
    except BaseException as exc:
        print(json.dumps({"module": name, "ok": False, "error": f"{type(exc).__name__}: {exc}"}),
              flush=True)
"""


class ImportVerdict(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One line of ``_PROBE``: whether ``module`` imported, and from where ``vllm`` came
    (``ok``) or the error (not ``ok``)."""

    module: str
    ok: bool
    vllm: str = ""
    error: str = ""


@dataclass(frozen=True)
class ImportResult:
    module: str
    ok: bool
    detail: str  # vllm.__file__ when ok, else the error


def touched_modules(series: Series) -> list[str]:
    """Dotted names of the touched .py files (``vllm.models....``)."""
    names = []
    for path in series.touched:
        if path.endswith(".py"):
            dotted = f"{series.package}/{path[:-3]}".replace("/", ".")
            names.append(dotted.removesuffix(".__init__"))
    return names


def import_check(
    tree: Path, modules: list[str], python: str = sys.executable
) -> list[ImportResult]:
    tree = Path(tree).resolve()
    path = os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [python, "-c", _PROBE, *modules],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
        cwd=tree,
        timeout=900,
    )
    verdicts = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            verdict, _ = try_decode_json(line.encode(), ImportVerdict)
            if verdict is not None:  # else a line the imported code printed, no verdict
                verdicts[verdict.module] = verdict
    results = []
    for module in modules:
        found = verdicts.get(module)
        if found is None:
            results.append(ImportResult(module, False, f"interpreter died: {proc.stderr[-500:]}"))
        elif not found.ok:
            results.append(ImportResult(module, False, found.error))
        elif not Path(found.vllm).resolve().is_relative_to(tree):
            results.append(
                ImportResult(module, False, f"vllm imported from {found.vllm}, not from {tree}")
            )
        else:
            results.append(ImportResult(module, True, found.vllm))
    return results
