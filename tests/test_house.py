"""The house: rooms import downward only, no import circle, no module grows past ~500 lines.

The import graph is read from the source with ``ast`` (imports inside functions count: they
run too), never by importing the package. Each check is also run on the real graph with one
planted edge, to show it fails.
"""

from __future__ import annotations

import ast
import graphlib
import importlib.util
import shutil
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "bakery"
GROUND = "ground"
# Which rooms each room may import (besides itself). The ground is every top-level module.
ALLOWED = {
    GROUND: {GROUND},
    "series": {GROUND},
    "bake": {GROUND, "series"},
    "check": {GROUND, "series", "bake"},
    "verify": {GROUND},
    "dcp": {GROUND},
    "launch": {GROUND, "series", "bake", "verify"},
    # status reports the launcher's runs beside the bake and the rebase.
    "maintain": {GROUND, "series", "bake", "check", "launch"},
    "cli": {GROUND, "series", "bake", "check", "verify", "launch", "maintain", "cli"},
}
# Entry points that run the command line: the only importers of bakery.cli outside it.
CLI_DOORS = {"bakery.__main__", "bakery.launch.__main__"}
MAX_LINES = 500
# Modules allowed past MAX_LINES, with the reason.
LONG_MODULES: dict[str, str] = {}


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the bakery modules it imports (a ``from pkg import name`` that names a
    submodule is an edge to the submodule)."""
    files = {module_name(p, package): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                # ruff bans relative imports; resolved anyway, so one cannot hide an edge
                package = name if path.name == "__init__.py" else name.rpartition(".")[0]
                module = importlib.util.resolve_name(
                    "." * node.level + (node.module or ""), package
                )
                targets = [
                    f"{module}.{alias.name}" if f"{module}.{alias.name}" in files else module
                    for alias in node.names
                ]
            else:
                continue
            edges |= {t for t in targets if t in files and t != name}
        graph[name] = edges
    return graph


def room_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) >= 3 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()):
        return parts[1]
    return GROUND


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for module, edges in sorted(graph.items()):
        if module in CLI_DOORS or module == "bakery":
            continue
        mine = room_of(module)
        for target in sorted(edges):
            theirs = room_of(target)
            if theirs != mine and theirs not in ALLOWED[mine]:
                out.append(f"{module} ({mine}) imports {target} ({theirs})")
    return out


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle (graphlib's CycleError names it), or [] when there is none."""
    try:
        list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        return exc.args[1]
    return []


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def test_every_folder_is_a_known_room(graph):
    rooms = {room_of(m) for m in graph}
    assert rooms <= set(ALLOWED), f"a room without import rules: {rooms - set(ALLOWED)}"
    assert {"series", "bake", "check", "maintain", "launch", "verify", "dcp", "cli"} <= rooms


def test_rooms_import_downward_only(graph):
    assert layer_violations(graph) == []


def test_the_diff_and_engine_rooms_know_nothing_of_wheels(graph):
    for module in ("bakery.series.diff", "bakery.series.engine"):
        assert not {t for t in graph[module] if room_of(t) == "bake"}
    planted = {k: set(v) for k, v in graph.items()}
    planted["bakery.series.diff"].add("bakery.bake.wheel")
    assert layer_violations(planted) == [
        "bakery.series.diff (series) imports bakery.bake.wheel (bake)"
    ]


def test_no_import_circle(graph):
    assert cycle(graph) == []
    planted = {k: set(v) for k, v in graph.items()}
    planted["bakery.errors"].add("bakery.cli.root")  # root reaches errors: a circle
    assert {"bakery.errors", "bakery.cli.root"} <= set(cycle(planted))


def test_only_the_doors_import_the_command_line(graph):
    importers = {m for m, edges in graph.items() if any(room_of(t) == "cli" for t in edges)}
    assert {m for m in importers if room_of(m) != "cli"} == CLI_DOORS


def test_no_module_over_the_size_limit():
    sizes = {module_name(p): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    long = {m: n for m, n in sizes.items() if n > MAX_LINES and m not in LONG_MODULES}
    assert long == {}, f"split these (or name the reason in LONG_MODULES): {long}"


def test_a_relative_import_is_an_edge_too(tmp_path):
    """A planted ``from ..bake import wheel`` in a copy of the series room is seen."""
    copy = tmp_path / "bakery"
    shutil.copytree(PACKAGE, copy)
    diff = copy / "series" / "diff.py"
    diff.write_text(diff.read_text() + "\nfrom ..bake import wheel  # noqa\n")
    assert "bakery.series.diff (series) imports bakery.bake.wheel (bake)" in layer_violations(
        import_graph(copy)
    )
