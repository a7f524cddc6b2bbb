"""tree.write_text_atomic / schema.write_json_atomic: exact bytes, and nothing left on failure."""

import json
import math
import stat

import pytest

from bakery.schema import write_json_atomic
from bakery.tree import write_text_atomic


def test_json_is_indented_utf8_with_a_final_newline(tmp_path):
    path = tmp_path / "sub" / "report.json"
    write_json_atomic(path, {"b": [1, 2], "a": "ü"}, sort_keys=True)
    assert path.read_bytes() == b'{\n  "a": "\xc3\xbc",\n  "b": [\n    1,\n    2\n  ]\n}\n'
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # readable like every other output


def test_key_order_is_kept_unless_asked(tmp_path):
    path = tmp_path / "response.json"
    write_json_atomic(path, {"z": 1, "a": 2})
    assert path.read_text() == '{\n  "z": 1,\n  "a": 2\n}\n'


def test_strict_refuses_nan_and_leaves_the_old_file_and_no_temp(tmp_path):
    path = tmp_path / "gates.json"
    write_text_atomic(path, "old\n")
    with pytest.raises(ValueError):
        write_json_atomic(path, {"kl": math.nan}, strict=True)
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gates.json"]


def test_default_serializes_what_json_cannot(tmp_path):
    path = tmp_path / "summary.json"
    write_json_atomic(path, {"bundle": tmp_path / "b"}, default=str)
    assert path.read_text() == f'{{\n  "bundle": "{tmp_path / "b"}"\n}}\n'


def test_ascii_only_json_holds_undecodable_environment_bytes(tmp_path):
    # os.environ gives an undecodable byte as a lone surrogate; UTF-8 cannot encode one.
    value = {"HF_HOME": "/data/caf\udce9"}
    with pytest.raises(UnicodeEncodeError):
        write_json_atomic(tmp_path / "utf8.json", value)
    assert not list(tmp_path.iterdir())  # the failed write left nothing behind
    write_json_atomic(tmp_path / "env.json", value, ascii_only=True)
    assert json.loads((tmp_path / "env.json").read_text()) == value
