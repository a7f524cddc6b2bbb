"""The source names the series' ``stages.toml`` points at, resolved in the patched tree.

``[gates] heads_source = "<file>:<name>"`` names the head set the launcher reads from
the baked tree (``bakery.launch.host.read_heads``: a top-level assignment in that very
file, parsed, never imported). The name must be assigned there, not merely importable
from there. Findings name stages.toml and the line of the field.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from bakery.check.linkcheck.findings import Finding
from bakery.check.linkcheck.index import ModuleIndex
from bakery.check.linkcheck.symbols import Missing
from bakery.series.stages import read_stages_doc

STAGES = "stages.toml"


def stage_findings(index: ModuleIndex, series_root: Path, package: str) -> list[Finding]:
    """Findings for the names ``series_root/stages.toml`` points at (none without one)."""
    path = Path(series_root) / STAGES
    if not path.is_file():
        return []
    gates = read_stages_doc(series_root).gates
    heads = gates.heads if gates is not None else None
    if heads is None:
        return []  # a malformed or missing field is the schema's (bakery stages) finding
    shown = "/".join([*Path(series_root).resolve().parts[-2:], STAGES])  # patches/dcp2/...
    line = _field_line(path.read_text(encoding="utf-8"), "heads_source")
    heads_file, name = heads
    subject = f"gates.heads_source.{name}"
    module = ".".join([package, *heads_file.removesuffix(".py").split("/")])
    info = index.module(module) if heads_file.endswith(".py") else None
    if info is None or info.tree is None:
        why = "not found in the patched tree" if info is None else (info.error or "compiled")
        return [Finding(shown, line, f"heads_source names no module {module}", why, subject)]
    if any(_assigns(stmt, name) for stmt in info.tree.body):
        return []
    found = index.resolve(module, name)
    where = f"the launcher reads a top-level assignment in {info.source.rel}"
    if isinstance(found, Missing):
        missing = f"heads_source names {name!r}, which {heads_file} does not define"
    else:
        missing = f"heads_source names {name!r}, which {heads_file} imports but never assigns"
    return [Finding(shown, line, missing, where, subject)]


def _assigns(stmt: ast.stmt, name: str) -> bool:
    return isinstance(stmt, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == name for t in stmt.targets
    )


def _field_line(text: str, field: str) -> int:
    match = re.search(rf"^\s*{re.escape(field)}\s*=", text, re.M)
    return text.count("\n", 0, match.start()) + 1 if match else 0
