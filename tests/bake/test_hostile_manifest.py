"""Hostile BAKED.json: `bakery check` refuses a wrong shape or an escaping path with one
clear error (exit 2), and never reads a file outside the tree it checks."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from bakery.cli.root import main

SHA = hashlib.sha256(b"secret\n").hexdigest()
GOOD = {
    "series": {"sha256": "a" * 64},
    "base": {"sha256": "b" * 64, "requirement": "vllm==0.32.0"},
    "patches": [{"file": "01-x.py.diff", "sha256": "c" * 64}],
    "files": {"vllm/x.py": {"pre": None, "post": hashlib.sha256(b"x\n").hexdigest()}},
}


def _tree(tmp_path, manifest) -> str:
    """tree/ with vllm/x.py and BAKED.json; beside it outside/secret (the bait)."""
    tree = tmp_path / "tree"
    (tree / "vllm").mkdir(parents=True)
    (tree / "vllm" / "x.py").write_bytes(b"x\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_bytes(b"secret\n")
    os.symlink(tmp_path / "outside", tree / "vllm" / "link")
    text = manifest if isinstance(manifest, (str, bytes)) else json.dumps(manifest)
    (tree / "BAKED.json").write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(tree)


def _with(**changes):
    return {**GOOD, **changes}


ESCAPES = {"pre": None, "post": SHA}  # the bait's real hash: reading it would say "ok"
CASES = {
    "files-list": (
        _with(files=[["vllm/x.py", GOOD["files"]["vllm/x.py"]]]),
        "$.files: expected a table",
    ),
    "files-str": (_with(files="vllm/x.py"), "$.files: expected a table"),
    "entry-str": (_with(files={"vllm/x.py": "sha"}), "$.files.vllm/x.py: expected a table"),
    "entry-int-hash": (_with(files={"vllm/x.py": {"pre": None, "post": 5}}), "post: expected str"),
    "entry-extra-key": (
        _with(files={"vllm/x.py": {"pre": None, "post": SHA, "x": 1}}),
        "unknown field (known: pre, post)",
    ),
    "dotdot": (_with(files={"../outside/secret": ESCAPES}), "path leaves the tree"),
    "dotdot-inner": (_with(files={"vllm/../../outside/secret": ESCAPES}), "leaves the tree"),
    "absolute": (_with(files={"/etc/hostname": ESCAPES}), "path leaves the tree"),
    "symlink": (_with(files={"vllm/link/secret": ESCAPES}), "through a symlink"),
    "nul": (_with(files={"vllm/x\u0000.py": ESCAPES}), "path leaves the tree"),
    "no-series": ({k: v for k, v in GOOD.items() if k != "series"}, "$.series: missing"),
    "series-int": (_with(series={"sha256": 1}), "series.sha256"),
    "top-list": ([GOOD], "$: expected a table/object"),
    "patches-str": (_with(patches=["01-x.py.diff"]), "$.patches[0]: expected a table"),
    "patches-no-sha": (_with(patches=[{"file": "01-x.py.diff"}]), "$.patches[0].sha256: missing"),
    "no-requirement": (_with(base={"sha256": "b" * 64}), "base.requirement"),
    "not-json": ("{", "unreadable manifest"),
    "not-utf8": (b"\xff\xfe{}", "unreadable manifest"),
    "deep": ("[" * 100_000 + "]" * 100_000, "unreadable manifest"),
}


@pytest.mark.parametrize("manifest, phrase", CASES.values(), ids=CASES.keys())
def test_bad_manifest_is_one_clear_error_exit_2(tmp_path, capsys, manifest, phrase):
    code = main(["check", _tree(tmp_path, manifest)])
    err = capsys.readouterr().err.splitlines()
    assert code == 2, err
    assert err[0].startswith("error: ") and phrase in err[0], err
    assert len(err) <= 2 and all(line.startswith("hint: ") for line in err[1:]), err


def test_a_sound_manifest_still_checks(tmp_path, capsys):
    tree = _tree(tmp_path, GOOD)
    assert main(["check", tree]) == 0
    (tmp_path / "tree" / "vllm" / "x.py").write_bytes(b"edited\n")
    assert main(["check", tree]) == 1
    assert "modified: vllm/x.py" in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["missing", "devzero", "fifo", "folder"])
def test_no_readable_manifest_is_exit_2_without_a_hang(tmp_path, capsys, kind):
    tree = tmp_path / "tree"
    tree.mkdir()
    target = tree / "BAKED.json"
    if kind == "devzero":
        os.symlink("/dev/zero", target)  # reading it would never end
    elif kind == "fifo":
        os.mkfifo(target)  # reading it would block forever
    elif kind == "folder":
        target.mkdir()
    assert main(["check", str(tree)]) == 2
    assert "no BAKED.json" in capsys.readouterr().err
