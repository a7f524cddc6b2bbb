"""The house's rules for the DCP lab (lab/), which stands apart from the tool (bakery/):

- bakery/ imports nothing of the lab, nor the lab's heavy dependencies (torch, Triton,
  safetensors, transformers): the tool installs and runs without them;
- the lab has no import circle, the emulation (lab/emulate, imported as ``bakery_emulate``)
  included;
- the lab takes none of bakery's private names (it may use the tool's public ground, e.g.
  ``bakery.markdown``);
- the tests' root holds only the shared helpers listed here: a driver of the lab lives
  beside its tests in tests/lab/;
- tools/gpu_*.py are doors: a few lines that import the run's module under lab/gpu and
  call its ``main``.

Read from the source with ``ast``, as tests/test_house.py does (imports inside functions
count). Each rule is also run on a copy with the violation planted, or on the real graph
with one planted edge, to show it fails.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

from test_house import cycle, is_private, module_edges

REPO = Path(__file__).resolve().parents[1]
BAKERY = REPO / "bakery"
LAB = REPO / "lab"
TESTS = REPO / "tests"
TOOLS = REPO / "tools"
EMULATE = "emulate"  # lab/emulate: a PYTHONPATH folder; its modules import as bakery_emulate.*

# What bakery/ may not import (top-level names): the lab, and what the lab needs that the
# tool does not install (torch is the `dcp` extra's; Triton, safetensors and transformers
# come with vLLM on the hosts that run the lab).
NOT_IN_THE_TOOL = {"lab", "bakery_emulate", "torch", "triton", "safetensors", "transformers"}

# The helpers at the tests' root, each shared by tests of several rooms (the reason).
ROOT_HELPERS = {
    "_synthetic_release.py": "tiny real wheels and a three-patch series (series, bake, "
    "maintain, cli, the schema's readers)",
    "_launch_support.py": "launcher processes read from /proc (launch, parity, confinement)",
    "_verify_support.py": "the B200 oracle bundles (verify, parity, launch, cli, the schema)",
    "_planting.py": "planted-bug re-bakes (the lab's DCP tests, parity, launch, verify)",
    "_faults.py": "a real write fault (bake, check, the tree)",
}
# The lines a tools/gpu_*.py door may hold (docstring, imports, the call).
MAX_DOOR_LINES = 20


def _names(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [node.module]
    return []


def forbidden_imports(package: Path = BAKERY) -> list[str]:
    """``module:line name`` for each import in bakery/ of what NOT_IN_THE_TOOL names."""
    out = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for name in _names(node):
                if name.split(".")[0] in NOT_IN_THE_TOOL:
                    out.append(f"{path.relative_to(package.parent)}:{node.lineno} {name}")
    return out


def lab_module_name(path: Path, lab: Path = LAB) -> str:
    """``lab.dcp.merge`` for lab/dcp/merge.py; ``bakery_emulate.hooks`` under lab/emulate."""
    emulate = lab / EMULATE
    base = emulate if path.is_relative_to(emulate) else lab.parent
    parts = path.relative_to(base).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def lab_files(lab: Path = LAB) -> dict[str, Path]:
    files = {lab_module_name(p, lab): p for p in sorted(lab.rglob("*.py"))}
    files.pop("sitecustomize", None)  # the emulation's entry: nothing imports it
    return files


def lab_graph(lab: Path = LAB) -> dict[str, set[str]]:
    """Module -> the lab modules it imports, the emulation's and the lab's in one graph."""
    files = lab_files(lab)
    return {name: module_edges(name, path, files) for name, path in files.items()}


def bakery_privates_taken(lab: Path = LAB) -> list[str]:
    """``lab module takes bakery.x._y`` for each private name of bakery's a lab module
    imports, or reaches through a bakery module it imported."""
    out = []
    for name, path in lab_files(lab).items():
        tree = ast.parse(path.read_text(), str(path))
        modules: dict[str, str] = {}  # local name -> the bakery module bound to it
        taken: set[tuple[str, str]] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules |= {
                    (a.asname or a.name): a.name
                    for a in node.names
                    if a.name.split(".")[0] == "bakery"
                }
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bakery"):
                for alias in node.names:
                    if is_private(alias.name):
                        taken.add((node.module or "", alias.name))
                    else:
                        modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in modules
                and is_private(node.attr)
            ):
                taken.add((modules[node.value.id], node.attr))
        out += [f"{name} takes {module}.{private}" for module, private in sorted(taken)]
    return out


def root_helpers_unlisted(tests: Path = TESTS) -> list[str]:
    """Python files at the tests' root that are no test, no conftest and no listed helper;
    and listed helpers that are gone."""
    here = {p.name for p in tests.glob("*.py")}
    out = [
        f"tests/{name}: a helper of one room's tests lives beside them (tests/lab/... for "
        "the lab's), or list it in ROOT_HELPERS with the rooms that share it"
        for name in sorted(here)
        if not name.startswith("test_") and name != "conftest.py" and name not in ROOT_HELPERS
    ]
    out += [f"tests/{name}: listed, yet missing" for name in sorted(ROOT_HELPERS.keys() - here)]
    return out


def fat_doors(tools: Path = TOOLS) -> list[str]:
    """tools/gpu_*.py that hold more than a door: over MAX_DOOR_LINES lines, a function or
    class of their own, or no ``from lab.gpu... import`` and call of ``main``."""
    out = []
    for path in sorted(tools.glob("gpu_*.py")):
        text = path.read_text()
        tree = ast.parse(text, str(path))
        lines = len(text.splitlines())
        defined = [n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)]
        imports_lab = any(
            isinstance(n, ast.ImportFrom) and (n.module or "").startswith("lab.gpu")
            for n in ast.walk(tree)
        )
        calls_main = "main(" in text
        if lines > MAX_DOOR_LINES or defined or not (imports_lab and calls_main):
            out.append(
                f"tools/{path.name}: {lines} lines, defines {defined}, imports lab.gpu: "
                f"{imports_lab}, calls main: {calls_main}"
            )
    return out


# --- bakery imports nothing of the lab, nor its dependencies --------------------------------


def test_the_tool_imports_nothing_of_the_lab_nor_torch():
    assert forbidden_imports() == []


def test_a_lab_or_torch_import_planted_in_the_tool_is_seen(tmp_path):
    copy = tmp_path / "bakery"
    shutil.copytree(BAKERY, copy)
    status = copy / "maintain" / "status.py"
    status.write_text(
        status.read_text()
        + "\n\ndef planted():\n    import torch  # noqa\n"
        + "    from lab.dcp import merge  # noqa\n"
        + "    import triton.language  # noqa\n"
    )
    lines = len(status.read_text().splitlines())
    assert forbidden_imports(copy) == [
        f"bakery/maintain/status.py:{lines - 2} torch",
        f"bakery/maintain/status.py:{lines - 1} lab.dcp",
        f"bakery/maintain/status.py:{lines} triton.language",
    ]


# --- no import circle in the lab ----------------------------------------------------------


def test_the_lab_has_no_import_circle():
    graph = lab_graph()
    # the graph sees the emulation, the lab, and the edge between them (the shared merge)
    assert {"bakery_emulate.patches", "lab.dcp.merge", "lab.tiny_v41"} <= graph.keys()
    assert "lab.dcp.merge" in graph["bakery_emulate.dcp_combine"]
    assert "bakery_emulate.hooks" in graph["bakery_emulate.patches"]
    assert cycle(graph) == []


def test_a_circle_planted_in_the_lab_is_seen():
    graph = lab_graph()
    planted = {k: set(v) for k, v in graph.items()}
    planted["bakery_emulate.hooks"].add("bakery_emulate.patches")  # the circle it had
    assert {"bakery_emulate.hooks", "bakery_emulate.patches"} <= set(cycle(planted))
    planted = {k: set(v) for k, v in graph.items()}
    planted["lab.dcp.merge"].add("lab.dcp.reference.combine")  # across the shared math
    assert {"lab.dcp.merge", "lab.dcp.reference.combine"} <= set(cycle(planted))


def test_a_circle_planted_in_a_copy_of_the_emulation_is_seen(tmp_path):
    """The edge read from the source, a relative import included."""
    copy = tmp_path / "lab"
    shutil.copytree(LAB, copy, ignore=shutil.ignore_patterns("__pycache__"))
    hooks = copy / EMULATE / "bakery_emulate" / "hooks.py"
    hooks.write_text(hooks.read_text() + "\nfrom . import patches  # noqa\n")
    assert {"bakery_emulate.hooks", "bakery_emulate.patches"} <= set(cycle(lab_graph(copy)))


# --- the lab takes none of bakery's private names -------------------------------------------


def test_the_lab_takes_no_private_name_of_the_tool():
    assert bakery_privates_taken() == []


def test_a_private_name_of_the_tool_taken_by_the_lab_is_seen(tmp_path):
    copy = tmp_path / "lab"
    shutil.copytree(LAB, copy, ignore=shutil.ignore_patterns("__pycache__"))
    merge = copy / "dcp" / "merge.py"
    merge.write_text(
        merge.read_text()
        + "\nfrom bakery.launch.plan import _dcp_args  # noqa\n"
        + "from bakery import project  # noqa\n"
        + "from bakery import __version__ as planted_version  # noqa\n"
        + "project._planted(planted_version, project.ROOT_MARKER)\n"
    )
    assert bakery_privates_taken(copy) == [
        "lab.dcp.merge takes bakery.launch.plan._dcp_args",
        "lab.dcp.merge takes bakery.project._planted",
    ]


# --- no drivers at the tests' root ---------------------------------------------------------


def test_only_the_listed_shared_helpers_sit_at_the_tests_root():
    assert root_helpers_unlisted() == []


def test_a_driver_dropped_at_the_tests_root_is_seen(tmp_path):
    copy = tmp_path / "tests"
    copy.mkdir()
    for path in TESTS.glob("*.py"):
        shutil.copy(path, copy / path.name)
    (copy / "_dcp_planted_driver.py").write_text("")
    (copy / "_faults.py").unlink()
    assert root_helpers_unlisted(copy) == [
        "tests/_dcp_planted_driver.py: a helper of one room's tests lives beside them "
        "(tests/lab/... for the lab's), or list it in ROOT_HELPERS with the rooms that "
        "share it",
        "tests/_faults.py: listed, yet missing",
    ]


# --- tools/gpu_*.py are doors onto lab/gpu ---------------------------------------------------


def test_the_gpu_tools_are_doors():
    assert sorted(p.name for p in TOOLS.glob("gpu_*.py")) == [
        "gpu_candidate_blocks.py",
        "gpu_combine_copies.py",
        "gpu_dcp_bench.py",
        "gpu_triton_kernels.py",
    ]
    assert fat_doors() == []


def test_a_body_planted_in_a_gpu_door_is_seen(tmp_path):
    copy = tmp_path / "tools"
    shutil.copytree(TOOLS, copy, ignore=shutil.ignore_patterns("__pycache__"))
    door = copy / "gpu_dcp_bench.py"
    door.write_text(door.read_text() + "\n\ndef planted():\n    return 1\n")
    (copy / "gpu_planted.py").write_text("import torch\n\nprint(torch.ones(1))\n")
    assert fat_doors(copy) == [
        "tools/gpu_dcp_bench.py: 15 lines, defines ['planted'], imports lab.gpu: True, "
        "calls main: True",
        "tools/gpu_planted.py: 3 lines, defines [], imports lab.gpu: False, calls main: False",
    ]
