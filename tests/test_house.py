"""The house: rooms import downward only, no import circle, no module grows past ~500 lines,
no room reaches into another's private names, the command line's functions stay doors
(a flow lives in its room, the command parses options, calls it and prints), and every JSON
output goes through the one encoder, from its frozen type or listed with why it is a dict.

The import graph is read from the source with ``ast`` (imports inside functions count: they
run too), never by importing the package. Each check is also run on the real graph with one
planted edge (or on a copy of the package with the violation planted), to show it fails.
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
    "launch": {GROUND, "series", "bake"},
    # launch serves, verify captures and compares; parity conducts both (the matrix)
    "parity": {GROUND, "series", "bake", "launch", "verify"},
    # Not launch: `bakery status` gets the running servers from the command line.
    "maintain": {GROUND, "series", "bake", "check"},
    "cli": {GROUND, "series", "bake", "check", "verify", "launch", "parity", "maintain", "cli"},
}
# Entry points that run the command line: the only importers of bakery.cli outside it.
CLI_DOORS = {"bakery.__main__", "bakery.launch.__main__"}
MAX_LINES = 500
# Modules allowed past MAX_LINES, with the reason.
LONG_MODULES: dict[str, str] = {}
# Lines of a function's body in bakery/cli (past its docstring): more is a flow, whose
# place is its room.
MAX_CLI_FUNCTION_LINES = 50


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_module(node: ast.ImportFrom, name: str, path: Path) -> str:
    """The module a ``from ... import`` reads from, relative imports resolved."""
    # ruff bans relative imports; resolved anyway, so one cannot hide an edge
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return importlib.util.resolve_name("." * node.level + (node.module or ""), package)


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the bakery modules it imports (a ``from pkg import name`` that names a
    submodule is an edge to the submodule)."""
    files = {module_name(p, package): p for p in package.rglob("*.py")}
    return {name: module_edges(name, path, files) for name, path in files.items()}


def module_edges(name: str, path: Path, files: dict[str, Path]) -> set[str]:
    """The modules of ``files`` that module ``name`` (at ``path``) imports."""
    edges: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = imported_module(node, name, path)
            targets = [
                f"{module}.{alias.name}" if f"{module}.{alias.name}" in files else module
                for alias in node.names
            ]
        else:
            continue
        edges |= {t for t in targets if t in files and t != name}
    return edges


def room_of(module: str, package: Path = PACKAGE) -> str:
    parts = module.split(".")
    if len(parts) >= 3 or (len(parts) == 2 and (package / parts[1]).is_dir()):
        return parts[1]
    return GROUND


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_names_across_rooms(package: Path = PACKAGE) -> list[str]:
    """Each private name a module takes from a module of another room: imported
    (``from bakery.x.y import _z``) or reached through an imported module (``y._z``)."""
    files = {module_name(p, package): p for p in package.rglob("*.py")}
    out = []
    for name, path in sorted(files.items()):
        tree = ast.parse(path.read_text(), str(path))
        modules: dict[str, str] = {}  # local name -> the bakery module it is bound to
        taken: list[tuple[str, str]] = []  # (module, private name)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules |= {a.asname or a.name: a.name for a in node.names if a.name in files}
            elif isinstance(node, ast.ImportFrom):
                module = imported_module(node, name, path)
                for alias in node.names:
                    if f"{module}.{alias.name}" in files:
                        modules[alias.asname or alias.name] = f"{module}.{alias.name}"
                    elif module in files and is_private(alias.name):
                        taken.append((module, alias.name))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in modules
                and is_private(node.attr)
            ):
                taken.append((modules[node.value.id], node.attr))
        out += [
            f"{name} ({room_of(name, package)}) takes {module}.{private} "
            f"({room_of(module, package)})"
            for module, private in sorted(set(taken))
            if room_of(module, package) != room_of(name, package)
        ]
    return out


def long_cli_functions(package: Path = PACKAGE) -> dict[str, int]:
    """Function -> lines of its body (past the docstring), for those of bakery/cli over
    MAX_CLI_FUNCTION_LINES."""
    out = {}
    for path in sorted((package / "cli").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            body = node.body[1:] if ast.get_docstring(node) is not None else node.body
            lines = body[-1].end_lineno - body[0].lineno + 1 if body else 0
            if lines > MAX_CLI_FUNCTION_LINES:
                out[f"{module_name(path, package)}.{node.name}"] = lines
    return out


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
    assert {
        "series",
        "bake",
        "check",
        "maintain",
        "launch",
        "parity",
        "verify",
        "cli",
    } <= rooms


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


LAYOUT_DOC = PACKAGE.parent / "docs" / "layout.md"
ROOMS_START = "<!-- rooms: rendered from tests/test_house.py ALLOWED -->"
ROOMS_END = "<!-- /rooms -->"


def rooms_table(allowed: dict[str, set[str]] = ALLOWED) -> str:
    """The Markdown table of ``allowed``, as docs/layout.md shows it."""
    rows = ["| room | may import |", "|---|---|"]
    for room, others in allowed.items():
        if room != GROUND:
            names = [GROUND] + sorted(others - {GROUND, room})
            rows.append(f"| {room} | {', '.join(n for n in names if n in others)} |")
    return "\n".join(rows)


def documented_rooms(doc: Path = LAYOUT_DOC) -> str:
    text = doc.read_text()
    return text[text.index(ROOMS_START) + len(ROOMS_START) : text.index(ROOMS_END)].strip()


def test_the_layout_doc_states_the_house_rules():
    assert documented_rooms() == rooms_table(), "paste rooms_table() into docs/layout.md"
    # a rule changed in one place only is seen
    planted = {**ALLOWED, "maintain": ALLOWED["maintain"] | {"launch"}}
    assert documented_rooms() != rooms_table(planted)


def test_maintain_knows_nothing_of_the_launcher(graph):
    maintain = [m for m in graph if room_of(m) == "maintain"]
    assert not {t for m in maintain for t in graph[m] if room_of(t) == "launch"}
    planted = {k: set(v) for k, v in graph.items()}
    planted["bakery.maintain.status"].add("bakery.launch.lifecycle")
    assert layer_violations(planted) == [
        "bakery.maintain.status (maintain) imports bakery.launch.lifecycle (launch)"
    ]


def test_no_room_takes_another_rooms_private_names():
    assert private_names_across_rooms() == []


def test_a_private_name_taken_across_rooms_is_seen(tmp_path):
    """Planted in a copy: an import of a private name, and one reached through a module;
    a private name taken within its own room, and a dunder, are no violation."""
    copy = tmp_path / "bakery"
    shutil.copytree(PACKAGE, copy)
    status = copy / "maintain" / "status.py"
    status.write_text(
        status.read_text()
        + "\nfrom bakery.series.diff import _planted  # noqa\n"
        + "from bakery.bake import wheel as planted_wheel  # noqa\n"
        + "from bakery.maintain.refresh import _planted_here  # noqa\n"
        + "from bakery import __version__ as planted_version  # noqa\n"
        + "planted_wheel._reach(planted_version, _planted_here)\n"
    )
    assert private_names_across_rooms(copy) == [
        "bakery.maintain.status (maintain) takes bakery.bake.wheel._reach (bake)",
        "bakery.maintain.status (maintain) takes bakery.series.diff._planted (series)",
    ]


def test_the_command_line_holds_no_flow():
    assert long_cli_functions() == {}, (
        f"move the flow into its room, the command calls it: {long_cli_functions()}"
    )


def test_a_flow_planted_in_the_command_line_is_seen(tmp_path):
    copy = tmp_path / "bakery"
    shutil.copytree(PACKAGE, copy)
    flow = "\n".join(f"    step_{i} = {i}" for i in range(MAX_CLI_FUNCTION_LINES + 1))
    maintain = copy / "cli" / "maintain.py"
    maintain.write_text(maintain.read_text() + f'\n\ndef planted():\n    """Doc."""\n{flow}\n')
    assert long_cli_functions(copy) == {"bakery.cli.maintain.planted": MAX_CLI_FUNCTION_LINES + 1}


# --- one type per document ----------------------------------------------------------------
# A document's type is also its value (bakery.schema): a frozen dataclass beside it holding
# the same fields is a second copy to keep in step. Kept only where the value adds fields
# that no property of the document can give (named here with the reason).
TWO_TYPES = {
    "bakery.series.series.Pin": "its key and is_base come from the table it sits in (or, for "
    "a release, from the cache index's key), not from the pin's own fields",
    "bakery.launch.profiles.ParallelLayout": "one value from two tables ([parallel], [nodes]) "
    "that start's flags and a matrix entry's overrides replace fields of",
    "bakery.launch.profiles.StageGates": "stage and combine come from the gate table when the "
    "profile leaves them out",
    "bakery.verify.bundle.Completion": "the server's logprobs judged step by step and re-keyed, "
    "with ids joined from the request, /tokenize and the answer",
    "bakery.launch.profiles.Profile": "the file's name and path, its [parallel] and [nodes] "
    "tables as one layout, its gates completed from the stage table, and start's flags over it",
    "bakery.series.series.Series": "its folder and name (the folder's when the file gives "
    "none), its pins as Pin values keyed by their table, and linkcheck's allowlist flattened",
    "bakery.launch.run_record.Running": "a pid file read back beside the live process it names "
    "(or why it could not be read), not the file's fields",
}


def _fields(node: ast.ClassDef) -> set[str]:
    annotated = [s.target for s in node.body if isinstance(s, ast.AnnAssign)]
    return {t.id for t in annotated if isinstance(t, ast.Name)}


def _is_document(node: ast.ClassDef) -> bool:
    names = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
    return node.name.endswith("Doc") or bool(names & {"Document", "Struct"})


def _is_dataclass(node: ast.ClassDef) -> bool:
    return any(
        "dataclass" in ast.unparse(d.func if isinstance(d, ast.Call) else d)
        for d in node.decorator_list
    )


# A dataclass holding this share of a document type's fields (and at least 3 of them, or
# all of a smaller one) is a copy of it: `Matrix` once copied 10 of MatrixDoc's 11.
COPY_SHARE = 0.6


def _copies(doc: set[str], value: set[str]) -> bool:
    held = len(doc & value)
    return held == len(doc) or (held >= 3 and held >= COPY_SHARE * len(doc))


def document_copies(package: Path = PACKAGE) -> list[str]:
    """``module.Value copies module.Doc`` for each dataclass holding most of the fields of
    a document type of its module (``COPY_SHARE``)."""
    found = []
    for path in sorted(package.rglob("*.py")):
        classes = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)]
        documents = [c for c in classes if _is_document(c) and _fields(c)]
        for value in (c for c in classes if _is_dataclass(c)):
            for doc in documents:
                if _copies(_fields(doc), _fields(value)):
                    found.append(f"{module_name(path, package)}.{value.name} copies {doc.name}")
    return found


def test_one_type_per_document(tmp_path):
    found = [f for f in document_copies() if f.split(" ")[0] not in TWO_TYPES]
    assert found == [], "make the document type the value (frozen, properties for derived data)"
    copy = tmp_path / "bakery"
    shutil.copytree(PACKAGE, copy)
    planted = copy / "series" / "stages.py"
    planted.write_text(
        planted.read_text()
        + "\n\n@dataclass(frozen=True)\nclass StageValue:\n"
        + "".join(f"    {name}: str\n" for name in ("number", "name", "status", "enables"))
        + "".join(f"    {name}: str\n" for name in ("env", "requires", "patches", "on_cpu"))
    )
    assert "bakery.series.stages.StageValue copies Stage" in document_copies(copy)
    # a partial copy too: 7 of Stage's 8 fields, and the name of the matrix's one before
    planted.write_text(
        planted.read_text()
        + "\n\n@dataclass(frozen=True)\nclass StagePart:\n"
        + "".join(f"    {name}: str\n" for name in ("number", "name", "status", "enables"))
        + "".join(f"    {name}: str\n" for name in ("env", "requires", "patches"))
    )
    assert "bakery.series.stages.StagePart copies Stage" in document_copies(copy)
    assert _copies(set("abcdefghijk"), set("abcdefghij") | {"source"})


# --- the tests mirror the rooms -----------------------------------------------------------
# tests/<room>/ holds the tests of bakery/<room>/; a test of a top-level module sits directly
# in tests/ and is named after it (test_tree*.py for bakery/tree.py). Besides those, only the
# tests of the house as a whole sit there (named here with the reason).
TESTS = Path(__file__).resolve().parent
HOUSE_TESTS = {
    "test_house.py": "the layering of every room",
    "test_house_lab.py": "the lab (lab/) apart from the tool: its own rules",
    "test_self_contained.py": "the suite as a whole needs nothing beside the repository",
    "test_confinement.py": "one rule (a path stays inside its folder) checked in every room",
    "test_shipping.py": "the Dockerfile, which installs the whole package",
}
# Folders of tests/ that are no room: the test data, and the lab's tests (tests/lab/ mirrors
# lab/: the DCP reference, the emulation, the tiny models; tests/test_house_lab.py).
NOT_ROOMS = {"data", "lab"}


def misplaced_tests(tests: Path = TESTS, package: Path = PACKAGE) -> list[str]:
    rooms = {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    modules = {p.stem for p in package.glob("*.py") if not p.stem.startswith("_")}
    out = [
        f"tests/{p.name}: no room of bakery/ (rooms: {', '.join(sorted(rooms))})"
        for p in sorted(tests.iterdir())
        if p.is_dir() and not p.name.startswith((".", "_")) and p.name not in rooms | NOT_ROOMS
    ]
    for path in sorted(tests.glob("test_*.py")):
        named = path.stem.removeprefix("test_")
        if path.name not in HOUSE_TESTS and not any(
            named == m or named.startswith(f"{m}_") for m in modules
        ):
            out.append(f"tests/{path.name}: move it into the tests/<room>/ of what it tests")
    return out


def test_the_tests_mirror_the_rooms():
    assert misplaced_tests() == []


def test_a_misplaced_test_is_seen(tmp_path):
    """A copy of tests/ with a test file dropped at the top and a folder that is no room."""
    copy = tmp_path / "tests"
    shutil.copytree(TESTS, copy, ignore=shutil.ignore_patterns("data", "__pycache__"))
    (copy / "test_planted.py").write_text("")
    (copy / "test_tree_more.py").write_text("")  # named after bakery/tree.py: in place
    (copy / "rebase").mkdir()
    assert misplaced_tests(copy) == [
        "tests/rebase: no room of bakery/ (rooms: bake, check, cli, launch, maintain, "
        "parity, series, verify)",
        "tests/test_planted.py: move it into the tests/<room>/ of what it tests",
    ]


# --- one encoder; typed outputs -------------------------------------------------------------
# Every JSON output goes through bakery.schema's one encoder (encode_json, write_json_atomic),
# from a frozen type where bakery owns the shape. Each call of it is named here by the
# function that makes it: the type it writes, or why it writes dicts. A new writer fails
# this test until it is listed, so an untyped one is a decision, not an accident.
TYPED_WRITERS = {
    "bakery.bake.fetch.fetch_release": "ReleaseIndex",
    "bakery.bake.manifest.dumps": "BakedManifest",
    "bakery.bake.pristine.stamp_bytes": "TreeStamp",
    "bakery.bake.pristine._write_errata": "RecordErrata",
    "bakery.cli.maintain.rebase_matrix_cmd": "MatrixTable",
    "bakery.cli.maintain.status_cmd": "StatusReport",
    "bakery.launch.run_record.write_record": "RunEnvironment",
    "bakery.launch.run_record.write_pid": "PidRecord",
    "bakery.maintain.rebase.rebase": "RebaseReport",
    "bakery.maintain.rebase_state.write_state": "RebaseState",
    "bakery.parity.matrix.run_matrix": "MatrixSummary",
    "bakery.verify.calibrate.write_calibration": "GatesFileDoc",
    "bakery.verify.report.write_reports": "ParityReport",
    "bakery.cli.verify.compare": "ParityReport",
    "bakery.cli.launch.status_cmd": "ServerRow",
    "bakery.verify.bundle.write_bundle_meta": "BundleMeta",
    "bakery.parity.serving.write_figures": "FiguresDoc",
    "bakery.bake.trust.remember": "Record",
}
UNTYPED_WRITERS = {
    "bakery.verify.bundle.write_case_file": "the server's answer kept verbatim (key order is "
    "meaningful, fields vLLM adds are kept); CaseDoc/TeacherDoc judge it before it is written",
}
# JSON made outside the encoder: none of it is an output file of bakery's own shape.
OTHER_JSON = {
    "bakery.bake.bake._wheel_inputs": "a digest's input",
    "bakery.series.series.sha256": "a digest's input",
    "bakery.cli.launch.start_cmd": "printed (--json)",
    "bakery.cli.launch.doctor_cmd": "printed (--json)",
    "bakery.cli.series.apply_cmd": "printed (--json)",
    "bakery.launch.probe.main": "one line to the launcher from the serving Python",
    "bakery.parity.plots._save": "a PNG's metadata text",
    "bakery.verify.report.code": "a token shown JSON-quoted in Markdown",
}
ENCODER = {"encode_json", "write_json_atomic"}
OTHER_ENCODERS = {"json.dumps", "json.dump", "msgspec.json.encode", "msgspec.json.Encoder"}


def json_writers(package: Path = PACKAGE) -> dict[str, list[tuple[str, ast.Call]]]:
    """``module.function`` -> each call of a JSON encoder in it (bakery.schema left out)."""
    found: dict[str, list[tuple[str, ast.Call]]] = {}
    for path in sorted(package.rglob("*.py")):
        if path == package / "schema.py":
            continue
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Call):
                    called = ast.unparse(node.func)
                    if called.rpartition(".")[2] in ENCODER or called in OTHER_ENCODERS:
                        key = f"{module_name(path, package)}.{fn.name}"
                        found.setdefault(key, []).append((called, node))
    return found


def _looks_untyped(call: ast.Call) -> bool:
    """The value written is built as a dict or list right there."""
    args = call.args[1:] if ast.unparse(call.func).endswith("write_json_atomic") else call.args
    value = args[0] if args else None
    plain = (ast.Dict, ast.DictComp, ast.List, ast.ListComp)
    built = isinstance(value, ast.Call) and ast.unparse(value.func).endswith(
        ("dict", "as_dict", "asdict")
    )
    return isinstance(value, plain) or built or "__dict__" in ast.unparse(value or call)


def output_problems(package: Path = PACKAGE) -> list[str]:
    out = []
    found = json_writers(package)
    for key, calls in sorted(found.items()):
        for called, call in calls:
            if called in OTHER_ENCODERS:
                if key not in OTHER_JSON:
                    out.append(f"{key}: {called}: write JSON through bakery.schema.encode_json")
            elif key in TYPED_WRITERS:
                if _looks_untyped(call):
                    out.append(f"{key}: writes a dict, not its {TYPED_WRITERS[key]}")
            elif key not in UNTYPED_WRITERS:
                out.append(f"{key}: a new JSON writer: give it a frozen type (TYPED_WRITERS)")
    listed = TYPED_WRITERS.keys() | UNTYPED_WRITERS.keys() | OTHER_JSON.keys()
    out += [f"{key}: listed, yet it writes no JSON" for key in sorted(listed - found.keys())]
    return out


def test_every_json_output_goes_through_the_one_encoder_from_its_type():
    assert output_problems() == []


def test_an_untyped_or_unlisted_json_writer_is_seen(tmp_path):
    copy = tmp_path / "bakery"
    shutil.copytree(PACKAGE, copy)
    record = copy / "launch" / "run_record.py"
    text = record.read_text()
    assert "    write_json_atomic(\n        record.pid_file, data," in text
    text = text.replace(
        "    write_json_atomic(\n        record.pid_file, data,",
        "    write_json_atomic(\n        record.pid_file, {'pgid': proc.pid},",
    )
    text += (
        "\n\ndef planted(path):\n    write_json_atomic(path, {'a': 1})\n"
        "\n\ndef planted_too(path):\n    path.write_text(json.dumps({'a': 1}))\n"
    )
    record.write_text(text)
    # the two writers typed last: serving.json from a dict again, a trust record by msgspec
    for module, typed, untyped in [
        ("parity/serving.py", "FIGURES, figures,", "FIGURES, asdict(figures),"),
        ("bake/trust.py", "encode_json(what, one_line=True)", "msgspec.json.encode(what)"),
    ]:
        source = copy / module
        assert typed in source.read_text()
        source.write_text(source.read_text().replace(typed, untyped))
    assert output_problems(copy) == [
        "bakery.bake.trust.remember: msgspec.json.encode: write JSON through "
        "bakery.schema.encode_json",
        "bakery.launch.run_record.planted: a new JSON writer: give it a frozen type "
        "(TYPED_WRITERS)",
        "bakery.launch.run_record.planted_too: json.dumps: write JSON through "
        "bakery.schema.encode_json",
        "bakery.launch.run_record.write_pid: writes a dict, not its PidRecord",
        "bakery.parity.serving.write_figures: writes a dict, not its FiguresDoc",
    ]
