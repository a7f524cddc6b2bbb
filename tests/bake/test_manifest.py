"""BAKED.json's own functions (fast): the atomic write (under a real write fault), the
stable bytes, finding it, loading it back, and drift through a symlink. Then how a plan
becomes a manifest and each kind of drift, and last hostile manifests through the CLI.

Series identity and BAKED.json on synthetic series and trees (fast: no wheel, no bake).

Expected hashes come from ``hashlib`` over the bytes on disk, and expected placements from
how each target was built, never from the code under test.

Hostile BAKED.json: `bakery check` refuses a wrong shape or an escaping path with one
clear error (exit 2), and never reads a file outside the tree it checks.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from bakery.bake import manifest
from bakery.cli.root import main
from bakery.errors import ManifestError, UnsafePathError
from bakery.series.apply import plan, write
from bakery.series.diff import render_file_diff
from bakery.series.series import load_series
from tests._faults import assert_atomic_under_fault
from tests._synthetic_release import series_folder

A = b"a = 1\n"
SOUND = {
    "tool": {"name": "bakery", "version": "0"},
    "base": {"key": "default", "requirement": "vllm==0.32.0", "sha256": "b" * 64},
    "series": {"name": "syn", "sha256": "c" * 64},
    "patches": [{"file": "01-a.py.diff", "sha256": "d" * 64, "status": "applied"}],
    "files": {
        "pkg/a.py": {"pre": None, "post": hashlib.sha256(A).hexdigest()},
        "pkg/gone.py": {"pre": "e" * 64, "post": None},
    },
    "wheel": "pkg-1.0+syn.c-py3-none-any.whl",
}
TYPED = manifest.parse(SOUND, "SOUND")


def test_write_under_a_write_fault_keeps_the_old_manifest_and_no_temp(tmp_path):
    assert_atomic_under_fault("manifest.write", tmp_path)


def test_planted_write_without_cleanup_is_caught(tmp_path):
    # manifest.write as it was before it used tree.write_atomic
    with pytest.raises(AssertionError, match="left behind"):
        assert_atomic_under_fault("planted no-cleanup", tmp_path)


def test_written_bytes_are_stable_and_read_back_with_json(tmp_path):
    path = tmp_path / manifest.MANIFEST
    manifest.write(path, TYPED)
    data = path.read_bytes()
    reordered = dict(reversed(list(SOUND.items())))
    assert data == manifest.dumps(manifest.parse(reordered, "reordered"))  # order: not in bytes
    assert data.endswith(b"}\n") and json.loads(data)["files"] == SOUND["files"]
    assert manifest.parse(json.loads(data), "again") == TYPED
    assert [p.name for p in tmp_path.iterdir()] == [manifest.MANIFEST]


def test_load_gives_back_what_write_wrote(tmp_path):
    path = tmp_path / manifest.MANIFEST
    manifest.write(path, TYPED)
    assert manifest.load(path) == TYPED


def test_find_a_baked_tree_or_one_installed_patched_wheel(tmp_path):
    baked, site = tmp_path / "baked", tmp_path / "site"
    manifest.write(baked / manifest.MANIFEST, TYPED)
    assert manifest.find(baked) == baked / manifest.MANIFEST
    manifest.write(site / "pkg-1.0+syn.c.dist-info" / manifest.MANIFEST, TYPED)
    assert manifest.find(site) == site / "pkg-1.0+syn.c.dist-info" / manifest.MANIFEST
    manifest.write(site / "pkg-2.0+syn.c.dist-info" / manifest.MANIFEST, TYPED)
    with pytest.raises(ManifestError, match="several patched installs") as caught:
        manifest.find(site)
    assert caught.value.exit_code == 2
    with pytest.raises(ManifestError, match="no BAKED.json"):
        manifest.find(tmp_path / "empty")


def test_drift_of_a_sound_tree_and_of_a_changed_one(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_bytes(A)
    assert manifest.drift(tmp_path, TYPED).clean
    (tmp_path / "pkg" / "gone.py").write_bytes(b"back\n")
    (tmp_path / "pkg" / "a.py").write_bytes(b"a = 2\n")
    assert manifest.drift(tmp_path, TYPED) == manifest.Drift(("pkg/a.py",), (), ("pkg/gone.py",))


def test_drift_refuses_a_path_that_leaves_through_a_symlink(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "a.py").write_bytes(A)
    (root / "pkg").symlink_to(outside)  # would read outside/a.py and call it clean
    with pytest.raises(UnsafePathError, match="through a symlink"):
        manifest.drift(root, TYPED)


def test_planted_plain_join_would_read_outside_and_call_it_clean(tmp_path, monkeypatch):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "a.py").write_bytes(A)
    (root / "pkg").symlink_to(outside)
    monkeypatch.setattr(manifest, "inside", lambda base, rel: Path(base) / rel)
    assert manifest.drift(root, TYPED).clean  # what the symlink refusal above prevents


def _sha(tmp_path: Path, patches: dict[str, bytes], **settings) -> str:
    return load_series(series_folder(tmp_path / "s", patches, **settings)).sha256


BASE = {"01-a.py.diff": b"AAAA", "02-b.py.diff": b"BBBB"}
FRAMED = {"01-a.py.diff": b"A", "02-b.py.diff": b"02-c.py.diff\0B"}


@pytest.mark.parametrize(
    "change",
    [
        {"settings": {"fuzz": 1}},
        {"settings": {"strip": 2}},
        {"settings": {"renames": {"x/": "y/"}}},
        {"settings": {"package": "pkg/sub"}},  # the same diffs land in another folder
        {"patches": {"01-c.py.diff": b"AAAA", "02-b.py.diff": b"BBBB"}},  # a renamed patch
        {"patches": {"01-a.py.diff": b"AAA", "02-b.py.diff": b"ABBBB"}},  # a byte moved across
        {"patches": {"01-a.py.diff": b"AAAAB", "02-b.py.diff": b"BBB"}},  # ... either way
        {"patches": {"03-a.py.diff": b"AAAA", "02-b.py.diff": b"BBBB"}},  # reordered
        {"patches": {"01-a.py.diff": b"AAAA", "02-b.py.diff": b"BBBC"}},  # one byte edited
        # Unframed, these two streams would be the same bytes: name, NUL, data, name, ...
        {"patches": {"01-a.py.diff": b"A02-b.py.diff\0", "02-c.py.diff": b"B"}},
    ],
    ids=[
        "fuzz",
        "strip",
        "renames",
        "package",
        "renamed",
        "moved-left",
        "moved-right",
        "reorder",
        "edit",
        "framing",
    ],
)
def test_series_sha_changes(tmp_path, change):
    base = FRAMED if "02-c.py.diff" in change.get("patches", {}) else BASE
    same = _sha(tmp_path, base)
    assert _sha(tmp_path, base) == same  # deterministic, so the differences below mean it
    changed = _sha(tmp_path, change.get("patches", base), **change.get("settings", {}))
    assert changed != same


def test_series_sha_ignores_summaries(tmp_path):
    root = series_folder(tmp_path / "s", BASE)
    before = load_series(root).sha256
    toml = (root / "series.toml").read_text()
    (root / "series.toml").write_text(toml.replace('summary = "s"', 'summary = "other"'))
    assert load_series(root).sha256 == before


# A synthetic tree: one file modified by two patches, one created, one deleted.
MOD_OLD = b"".join(b"line %d\n" % i for i in range(30))
MOD_MID = MOD_OLD.replace(b"line 5\n", b"five\n")
MOD_NEW = MOD_MID.replace(b"line 25\n", b"twenty-five\n")
DRIFT = b"upstream 1\nupstream 2\nupstream 3\n"  # the tree has 3 lines the diffs never saw
GONE = b"to be deleted\n"
NEW = b"created\n"


@pytest.fixture
def baked(tmp_path):
    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "mod.py").write_bytes(DRIFT + MOD_OLD)
    (tree / "pkg" / "gone.py").write_bytes(GONE)
    diffs = {
        "01-mod.py.diff": render_file_diff("mod.py", MOD_OLD, MOD_MID),
        "02-mod.py.diff": render_file_diff("mod.py", MOD_MID, MOD_NEW)
        + render_file_diff("new.py", None, NEW)
        + render_file_diff("gone.py", GONE, None),
    }
    series = load_series(series_folder(tmp_path / "series", diffs))
    result = plan(tree / "pkg", series.patches)
    write(result)
    data = manifest.build(series, series.base("default"), result, "w.whl")
    return tree, diffs, series, data


def _hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_manifest_pre_and_post_are_the_real_bytes(baked):
    tree, _, _, typed = baked
    data = json.loads(manifest.dumps(typed))
    assert (tree / "pkg" / "mod.py").read_bytes() == DRIFT + MOD_NEW
    assert data["files"] == {
        "pkg/gone.py": {"pre": _hash(GONE), "post": None},
        "pkg/mod.py": {"pre": _hash(DRIFT + MOD_OLD), "post": _hash(DRIFT + MOD_NEW)},
        "pkg/new.py": {"pre": None, "post": _hash(NEW)},
    }


def test_manifest_patches_hashes_and_placements(baked):
    _, diffs, series, typed = baked
    data = json.loads(manifest.dumps(typed))
    assert data["series"]["sha256"] == series.sha256
    assert [p["file"] for p in data["patches"]] == list(diffs)
    assert [p["sha256"] for p in data["patches"]] == [_hash(d) for d in diffs.values()]
    assert [p["status"] for p in data["patches"]] == ["applied", "applied"]
    # line 5 is line 6 of the old file; each hunk starts 3 lines above, moved by DRIFT (3).
    first, second = data["patches"]
    assert first["files"] == [
        {"path": "pkg/mod.py", "hunks": [{"hunk": 1, "line": 6, "offset": 3, "fuzz": 0}]}
    ]
    # A created or deleted file's one hunk sits at line 1.
    at_top = [{"hunk": 1, "line": 1, "offset": 0, "fuzz": 0}]
    assert second["files"] == [
        {"path": "pkg/mod.py", "hunks": [{"hunk": 1, "line": 26, "offset": 3, "fuzz": 0}]},
        {"path": "pkg/new.py", "hunks": at_top},
        {"path": "pkg/gone.py", "hunks": at_top},
    ]


def test_drift_is_clean_then_sees_each_kind(baked):
    tree, _, _, data = baked
    assert manifest.drift(tree, data) == manifest.Drift((), (), ())
    (tree / "pkg" / "mod.py").write_bytes(DRIFT + MOD_NEW + b"#\n")
    (tree / "pkg" / "new.py").unlink()
    (tree / "pkg" / "gone.py").write_bytes(GONE)
    drift = manifest.drift(tree, data)
    assert drift == manifest.Drift(("pkg/mod.py",), ("pkg/new.py",), ("pkg/gone.py",))
    assert not drift.clean


def test_drift_sees_a_one_byte_edit_of_the_same_length(baked):
    tree, _, _, data = baked
    path = tree / "pkg" / "new.py"
    path.write_bytes(NEW.replace(b"c", b"C"))
    assert manifest.drift(tree, data).modified == ("pkg/new.py",)


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
