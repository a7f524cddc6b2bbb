"""The typed schema layer: every file kind refuses an unknown field and a wrong type, at the
top and nested, through the real CLI: one ``error:`` line naming the file and the field
path, one ``hint:`` line, exit 2, no traceback."""

from __future__ import annotations

import json
import shutil
import tempfile
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import pytest
from _verify_support import MTP, NOMTP, copy_bundle, edit_case, logprobs_of
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec import Meta

from bakery import schema
from bakery.cli.root import main
from bakery.errors import BakeryError, SeriesError
from bakery.launch.errors import ProfileError
from bakery.launch.gates import gate_table_of, load_gate_table
from bakery.launch.profiles import profile_from_data
from bakery.parity.matrix import matrix_from_data
from bakery.schema import Document, decode, encode_json
from bakery.series.series import Pin, validate
from bakery.series.stages import StagesDoc
from bakery.verify.bundle import case_from_document, teacher_from_document
from bakery.verify.compare import load_gates
from bakery.verify.errors import BundleError, GatesError, SuiteError
from bakery.verify.suite import load_suite
from tests.conftest import REPO

SERIES = REPO / "patches" / "dcp2"


def _run(capsys, argv: list[str]) -> tuple[int, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _one_error(code: int, out: str, *phrases: str) -> str:
    """Exit 2; the output ends in exactly one error line and one hint line; no traceback."""
    lines = out.splitlines()
    assert code == 2, out
    assert "Traceback" not in out, out
    assert lines[-2].startswith("error: ") and lines[-1].startswith("hint: "), out
    for phrase in phrases:
        assert phrase in lines[-2], (phrase, out)
    return lines[-2]


# --- the layer itself ----------------------------------------------------------------


class _Pin(Document, frozen=True):
    sha256: str
    kind: Literal["wheel", "sdist"] = "wheel"


class _Doc(Document, frozen=True):
    bases: dict[str, _Pin]
    items: list[_Pin] = []
    count: int = 0


def _problem(data: Any) -> str:
    with pytest.raises(SeriesError) as caught:
        decode(data, _Doc, where="x.toml", error=SeriesError, hint="h")
    assert caught.value.exit_code == 2 and caught.value.hint == "h"
    return str(caught.value)


def test_a_map_key_is_named_where_msgspec_says_only_dots():
    bad = {"bases": {"default": {"sha256": "a"}, "cpu": {"sha256": 5}}}
    with pytest.raises(msgspec.ValidationError, match=r"\[\.\.\.\]"):  # what msgspec alone says
        msgspec.convert(bad, _Doc)
    assert _problem(bad) == "x.toml: $.bases.cpu.sha256: expected str, got int"


@pytest.mark.parametrize(
    "data, message",
    [
        ({"bases": {}, "count": True}, "$.count: expected int, got bool"),  # bool is no int
        ({"bases": {}, "count": "3"}, "$.count: expected int, got str"),  # no coercion
        ({"bases": {}, "colour": 1}, "$.colour: unknown field (known: bases, items, count)"),
        ({}, "$.bases: missing"),
        ({"bases": {}, "items": [{"sha256": "a"}, {"sha": "b"}]}, "$.items[1].sha: unknown"),
        ({"bases": {"d": {"sha256": "a", "kind": "egg"}}}, "$.bases.d.kind: must be one of"),
        ({"bases": []}, "$.bases: expected a table/object, got an array"),
        ([], "$: expected a table/object, got an array"),
    ],
)
def test_each_problem_names_its_path(data, message):
    assert message in _problem(data)


def test_every_problem_is_named_at_once():
    message = _problem({"bases": {"a": {}}, "count": 1.5, "x": 0})
    assert message.startswith("x.toml: 3 problems: ")
    for phrase in ("$.x: unknown field", "$.bases.a.sha256: missing", "$.count: expected int"):
        assert phrase in message


class _Ranged(Document, frozen=True):
    fuzz: Annotated[int, Meta(ge=0, le=3)] = 0
    sha256: Annotated[str, Meta(pattern="^[0-9a-f]{4}$", description="4 hex digits")] = "abcd"
    pins: Annotated[tuple[_Pin, ...], Meta(min_length=1)] = (_Pin("a"),)


def test_every_constraint_in_a_type_is_named_at_once_with_its_value():
    # Annotated[..., Meta(...)]: the walker goes into the inner type (a bad pin inside the
    # tuple is named), then judges the constraint, in the Meta's words where it has some.
    data = {"fuzz": 5, "sha256": "xyz", "pins": [{"sha256": "a"}, {"sha256": 1}]}
    with pytest.raises(SeriesError) as caught:
        decode(data, _Ranged, where="x.toml", error=SeriesError, hint="h")
    assert str(caught.value) == (
        "x.toml: 3 problems: $.fuzz: expected int <= 3, not 5; "
        "$.sha256: must be 4 hex digits, not 'xyz'; $.pins[1].sha256: expected str, got int"
    )
    assert schema.problems({"pins": []}, _Ranged) == [
        "$.pins: expected an array of length >= 1, not []"
    ]
    assert schema.problems({"fuzz": "5"}, _Ranged) == ["$.fuzz: expected int, got str"]
    long = schema.problems({"sha256": "z" * 500}, _Ranged)[0]  # a hostile value stays short
    assert long.startswith("$.sha256: must be 4 hex digits, not 'zzz") and len(long) < 130


class _LeftOut(Document, frozen=True):
    fuzz: Annotated[int, Meta(ge=0, le=3, description="0..3")] | msgspec.UnsetType = msgspec.UNSET
    pins: list[_Pin] | None | msgspec.UnsetType = msgspec.UNSET


def test_a_field_that_may_be_left_out_is_walked_into_when_given():
    """``X | UnsetType``: a value given is judged as an ``X`` (constraint words, inner paths)."""
    assert schema.problems({"fuzz": 5, "pins": [{"sha256": 1}]}, _LeftOut) == [
        "$.fuzz: must be 0..3, not 5",
        "$.pins[0].sha256: expected str, got int",
    ]
    assert schema.problems({"fuzz": None}, _LeftOut) == ["$.fuzz: expected int, got null"]
    assert schema.problems({"pins": None}, _LeftOut) == schema.problems({}, _LeftOut) == []


def test_a_good_document_decodes_to_its_values():
    doc = decode({"bases": {"d": {"sha256": "a"}}}, _Doc, where="x", error=SeriesError, hint="")
    assert doc == _Doc(bases={"d": _Pin("a")}) and doc.items == [] and doc.count == 0


# --- stages.toml (bakery stages; the launcher's [gates] and [env.*] live in it) ------------


def _stages_copy(tmp_path: Path, old: str, new: str) -> Path:
    copy = tmp_path / "dcp2"
    shutil.copytree(SERIES, copy)
    toml = copy / "stages.toml"
    text = toml.read_text()
    assert old in text
    toml.write_text(text.replace(old, new, 1))
    return copy


@pytest.mark.parametrize(
    "old, new, phrase",
    [
        (
            "[gates]\n",
            "colour = 1\n[gates]\n",
            "$.colour: unknown field (known: stages, gates, env)",
        ),
        ("stage_min = 1\n", 'stage_min = "1"\n', "$.gates.stage_min: expected int, got str"),
        ("stage_min = 1\n", "stage_min = 1\nstage_mni = 1\n", "$.gates.stage_mni: unknown field"),
        ('default = "ag_rs"\n', "default = 1\n", "$.env.DSV41_DCP_COMBINE.default: expected str"),
        ('number = "positive"\n', 'number = "negative"\n', "number: must be one of 'positive'"),
        ('read_by = ["09', 'raed_by = ["09', "$.env.DSV41_DCP_TIMING.raed_by: unknown field"),
        ("number = 1\n", "number = 1\nstatsu = 1\n", "$.stages[0].statsu: unknown field"),
        ("number = 2\n", 'number = "2"\n', "$.stages[1].number: expected int, got str"),
        ('status = "implemented"', 'status = "done"', "$.stages[0].status: must be one of"),
    ],
    ids=[
        "unknown-top",
        "gates-type",
        "gates-unknown",
        "env-type",
        "env-literal",
        "env-unknown",
        "stage-unknown",
        "stage-type",
        "stage-literal",
    ],
)
def test_bad_stages_toml_is_one_error_exit_2(capsys, tmp_path, old, new, phrase):
    series = _stages_copy(tmp_path, old, new)
    code, out = _run(capsys, ["stages", "--series", str(series)])
    _one_error(code, out, f"error: {series / 'stages.toml'}: ", phrase)


def test_the_launcher_refuses_a_bad_gate_table_the_same_way(capsys, tmp_path):
    series = _stages_copy(tmp_path, "dcp_min_stage = 3\n", "dcp_min_stage = 3.0\n")
    code, out = _run(
        capsys, ["launch", "start", "--profile", "cpu-tiny", "--dry-run", "--series", str(series)]
    )
    _one_error(code, out, "$.gates.dcp_min_stage: expected int, got float")
    series = _stages_copy(tmp_path / "b", 'heads_source = "models', 'heads_source = "x:y:models')
    code, out = _run(
        capsys, ["launch", "start", "--profile", "cpu-tiny", "--dry-run", "--series", str(series)]
    )
    _one_error(code, out, "$.gates.heads_source: expected '<file>:<name>'")


# --- matrix.toml (bakery launch matrix: refused before any server boots) ------------------

MATRIX_CPU = (REPO / "launcher" / "dcp2" / "matrix-cpu.toml").read_text()


@pytest.mark.parametrize(
    "old, new, phrase",
    [
        ("top_n = 20", "top_m = 20", "$.top_m: unknown field (known: baseline, candidates,"),
        ("top_n = 20", 'top_n = "20"', "$.top_n: expected int, got str"),
        ('profile = "cpu-tiny"\n', 'profile = "cpu-tiny"\nflags = { tpp = 2 }\n', "flags.tpp"),
        ('name = "tiny-same"', 'name = "tiny-same"\nflags = { dcp = "2" }', "flags.dcp: expected"),
        ('name = "tiny-same"', "name = 5", "$.candidates[0].name: expected str, got int"),
        # a flag over a profile keeps the profile's ranges (an inf timeout never times out)
        ('name = "tiny-same"', 'name = "tiny-same"\nflags = { port = 0 }', "flags.port: must be"),
        (
            'name = "tiny-same"',
            'name = "tiny-same"\nflags = { startup_timeout_s = inf }',
            "flags.startup_timeout_s: expected int, got float",
        ),
        (
            'name = "tiny-same"',
            'name = "tiny-same"\nflags = { startup_timeout_s = -5 }',
            "$.candidates[0].flags.startup_timeout_s: must be at least 1, not -5",
        ),
    ],
    ids=[
        "unknown-top",
        "type-top",
        "unknown-flag",
        "type-flag",
        "type-entry",
        "port-range",
        "timeout-inf",
        "timeout-range",
    ],
)
def test_bad_matrix_toml_is_one_error_exit_2(capsys, tmp_path, old, new, phrase):
    matrix = tmp_path / "matrix.toml"
    assert old in MATRIX_CPU
    matrix.write_text(MATRIX_CPU.replace(old, new, 1))
    out_dir = tmp_path / "out"
    code, out = _run(capsys, ["launch", "matrix", "--matrix", str(matrix), "--out", str(out_dir)])
    _one_error(code, out, f"error: {matrix}: ", phrase)
    assert not out_dir.exists()


# --- suite jsonl (bakery verify capture: the suite is read before the server is asked) ----


@pytest.mark.parametrize(
    "line, phrase",
    [
        ('{"case": "a", "prompt": "x", "max_tokens": 1, "tag": []}', ":1: $.tag: unknown field"),
        ('{"case": "a", "prompt": "x", "max_tokens": "1"}', ":1: $.max_tokens: expected int"),
        ('{"case": "a", "prompt": "x", "max_tokens": 1, "tags": [1]}', ":1: $.tags[0]: expected"),
        ('{"case": "a", "prompt": "x", "max_tokens": 1, "why": 3}', ":1: $.why: expected str"),
    ],
    ids=["unknown", "type", "nested-type", "why-type"],
)
def test_bad_suite_is_one_error_exit_2(capsys, tmp_path, line, phrase):
    suite = tmp_path / "bad.jsonl"
    suite.write_text(line + "\n")
    out_dir = tmp_path / "bundle"
    argv = ["verify", "capture", "--url", "http://127.0.0.1:9", "--out", str(out_dir)]
    code, out = _run(capsys, [*argv, "--suite", str(suite)])
    _one_error(code, out, f"{suite}{phrase}")
    assert not out_dir.exists()


# --- bundle JSON (bakery verify compare) --------------------------------------------------

MATH = "completion_short_math_logprobs20"


def _set_elapsed(doc: dict[str, Any]) -> None:
    doc["elapsed_seconds"] = "slow"


@pytest.mark.parametrize(
    "change, phrase",
    [
        (lambda doc: doc.update(colour=1), "$.colour: unknown field (known: name, path, status,"),
        (lambda doc: doc.update(status="200"), "$.status: expected int, got str"),
        (_set_elapsed, "$.elapsed_seconds: expected float, got str"),
        (lambda doc: logprobs_of(doc).update(tokens=5), "logprobs.tokens: expected an array"),
        (lambda doc: doc["response"].update(choices={}), "$.response.choices: expected an array"),
    ],
    ids=["unknown-top", "type-top", "type-optional", "type-nested", "type-choices"],
)
def test_bad_bundle_case_is_one_error_exit_2(capsys, tmp_path, change, phrase):
    candidate = copy_bundle(NOMTP, tmp_path / "candidate")
    edit_case(candidate, MATH, change)
    code, out = _run(capsys, ["verify", "compare", str(NOMTP), str(candidate)])
    _one_error(code, out, f"bundle case {candidate / MATH}.json: ", phrase)


def test_the_servers_own_fields_may_grow(capsys, tmp_path):
    """vLLM adds response fields between releases: inside ``response`` they are not refused."""
    candidate = copy_bundle(NOMTP, tmp_path / "candidate")
    edit_case(candidate, MATH, lambda doc: doc["response"]["choices"][0].update(new_field=1))
    code, out = _run(capsys, ["verify", "compare", str(NOMTP), str(candidate)])
    assert code == 0, out


def test_bad_gates_file_is_one_error_exit_2(capsys, tmp_path):
    gates = tmp_path / "gates.json"
    gates.write_text(json.dumps({"gates": {}, "sorces": {}}))
    code, out = _run(capsys, ["verify", "compare", str(NOMTP), str(MTP), "--gates", str(gates)])
    _one_error(code, out, f"gates file {gates}: $.sorces: unknown field")


def test_a_flood_of_problems_stays_one_short_line():
    message = _problem({"bases": {}, "items": [{"sha256": i} for i in range(5000)]})
    assert message.startswith("x.toml: 5000 problems: $.items[0].sha256: expected str, got int")
    assert message.endswith("; and 4988 more") and len(message) < 1000


# --- any value anywhere: a refusal, never a traceback ------------------------------------

_JSONISH = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats()  # NaN and infinities included
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


def _paths(value: Any, at: tuple = ()) -> list[tuple]:
    """The places in a parsed document a value can be put: every field, but only the first
    two items of a list or of a map of many (a bundle has thousands of alike logprobs)."""
    found = [at]
    if isinstance(value, dict):
        items = list(value.items())
        items = items if len(items) <= 16 else items[:2]  # a top-20 logprobs map
    else:
        items = list(enumerate(value))[:2] if isinstance(value, list) else []
    for key, sub in items:
        found += _paths(sub, (*at, key))
    return found


def _planted(document: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    copy = json.loads(json.dumps(document))  # a deep copy of plain JSON data
    table = copy
    for key in path[:-1]:
        table = table[key]
    table[path[-1]] = value
    return copy


def _toml(path: Path) -> dict[str, Any]:
    return tomllib.loads(path.read_text())


def _load_series_doc(data: Any) -> None:
    doc = validate(data, "series.toml")
    for key, pin in doc.bases.items():
        Pin.from_doc(key, pin, "series.toml")


def _load_stages_doc(data: Any) -> None:
    where = Path("stages.toml")
    gate_table_of(decode(data, StagesDoc, where=str(where), error=SeriesError, hint="h"), where)


def _load_via_file(loader, suffix: str, text) -> Any:
    """For loaders that take a file: the planted document written to a temporary one."""

    def load(data: Any) -> None:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / f"planted{suffix}"
            path.write_text(text(data))
            loader(path)

    return load


def _suite_line(data: Any) -> str:
    return json.dumps(data) + "\n"


PROFILE = {
    **_toml(REPO / "launcher/dcp2/profiles/dsv41-sm120-2node-tp4-dcp4.toml"),
    "env": {"HF_HUB_OFFLINE": "1"},
}
SUITE_CASE = json.loads((REPO / "bakery/verify/suites/dcp2.jsonl").read_text().splitlines()[-1])
GATE_TABLE = load_gate_table(SERIES)
TEACHER = {  # as capture writes one (no fixture bundle has teacher-forced scores)
    "name": "teacher_x",
    "case": "completion_x",
    "path": "/v1/completions",
    "status": 200,
    "scored_from": "self",
    "sequence": [5, 7, 9],
    "completion_start": 2,
    "request": {"prompt": [5, 7, 9], "max_tokens": 1, "prompt_logprobs": 20, "echo": True},
    "response": {
        "choices": [{"prompt_logprobs": [None, {"7": {"logprob": -0.5, "rank": 1}}, {"9": -1.0}]}]
    },
}
# file kind -> (a real document of that kind, its loader from parsed data, its error)
KINDS: dict[str, tuple[Any, Any, type[BakeryError]]] = {
    "series": (_toml(SERIES / "series.toml"), _load_series_doc, SeriesError),
    "stages": (_toml(SERIES / "stages.toml"), _load_stages_doc, SeriesError),
    "profile": (PROFILE, lambda d: profile_from_data(d, Path("p.toml"), GATE_TABLE), ProfileError),
    "matrix": (_toml(REPO / "launcher/dcp2/matrix.toml"), lambda d: matrix_from_data(d, Path("m")),
               ProfileError),
    "suite": (SUITE_CASE, _load_via_file(lambda p: load_suite(str(p)), ".jsonl", _suite_line),
              SuiteError),
    "bundle case": (json.loads((NOMTP / f"{MATH}.json").read_text()),
                    lambda d: case_from_document(d, Path("completion_x.json")), BundleError),
    "teacher case": (TEACHER, lambda d: teacher_from_document(d, Path("teacher_x.json")),
                     BundleError),
    "gates file": ({"gates": {"max_tf_kl": 0.1, "fail_on_high_margin_mismatch": True},
                    "sources": {"max_tf_kl": "calibration"}},
                   _load_via_file(load_gates, ".json", json.dumps), GatesError),
}  # fmt: skip
PLACES = [(kind, where) for kind, (doc, _, _) in KINDS.items() for where in _paths(doc)]
# Every field of every kind is tried (not a random sample of them), with a few random values.
# Derandomized under CI=true by the profile in conftest.py; `make test-props` gives fresh seeds.
_FEW = settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _refused_in_one_line_or_loaded(kind: str, where: tuple, value: Any) -> None:
    document, load, error = KINDS[kind]
    try:
        load(_planted(document, where, value))
    except error as exc:
        assert exc.exit_code == 2 and "\n" not in str(exc) and exc.hint, str(exc)


@pytest.mark.parametrize("kind, where", PLACES, ids=[f"{k}:{w}" for k, w in PLACES])
@_FEW
@given(value=_JSONISH)
def test_any_value_anywhere_is_refused_in_one_line_or_loaded(kind, where, value):
    _refused_in_one_line_or_loaded(kind, where, value)


def test_an_env_value_with_a_newline_is_refused_in_one_line():
    """Found by the property above (fresh seeds): an accepted value holding a newline
    reached the "must be one of ..." message and split it."""
    places = [
        ("env", "DSV41_DCP_PREFILL_GATHER", "values", 0),
        ("env", "DSV41_DCP_COMBINE", "default"),
    ]
    for where in places:
        _refused_in_one_line_or_loaded("stages", where, "a\nb")
        with pytest.raises(SeriesError, match="without control characters"):
            KINDS["stages"][1](_planted(KINDS["stages"][0], where, "a\rb"))


def test_the_property_catches_a_planted_two_line_refusal(monkeypatch):
    real = schema.refuse

    def two_lines(found, **kw):  # the bug the property guards: a refusal over two lines
        real([f"{problem}\nplanted" for problem in found], **kw)

    monkeypatch.setattr(schema, "refuse", two_lines)
    with pytest.raises(AssertionError):
        _refused_in_one_line_or_loaded("gates file", ("gates",), 3)
    with pytest.raises(msgspec.ValidationError):  # and one that escapes as a traceback
        monkeypatch.setattr(schema, "problems", lambda data, kind: [])
        monkeypatch.setattr(schema, "_reword", _raise_validation_error)
        _refused_in_one_line_or_loaded("series", ("name",), 3)


def _raise_validation_error(message: str) -> str:
    raise msgspec.ValidationError(message)


def test_every_kind_loads_its_own_real_document():
    for document, load, _ in KINDS.values():
        load(document)


def test_encode_json_writes_structs_as_json_dumps_writes_their_dicts():
    """The one encoder: a Struct (nested, in a free-form dict) gives the bytes json.dumps
    gives its dict in field order, so typed writers keep their files' bytes."""

    class Row(msgspec.Struct, frozen=True):
        z: int
        a: tuple
        name: str | None = None

    value = {"rows": [Row(1, (Row(2, ()),), "ü")], "x": 0.1}
    as_dicts = {"rows": [{"z": 1, "a": [{"z": 2, "a": [], "name": None}], "name": "ü"}], "x": 0.1}
    assert encode_json(value) == (json.dumps(as_dicts, indent=2) + "\n").encode()
    assert (
        encode_json(value, sort_keys=True, ascii_only=False)
        == (json.dumps(as_dicts, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()
    )
    with pytest.raises(TypeError, match="not JSON serializable"):
        encode_json({"p": object()})
