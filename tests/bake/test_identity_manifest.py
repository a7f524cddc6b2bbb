"""Series identity and BAKED.json on synthetic series and trees (fast: no wheel, no bake).

Expected hashes come from ``hashlib`` over the bytes on disk, and expected placements from
how each target was built, never from the code under test.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from bakery.bake import manifest
from bakery.series.apply import plan, write
from bakery.series.diff import render_file_diff
from bakery.series.series import load_series

PIN = """
[bases.default]
requirement = "vllm==0.32.0"
wheel = "vllm-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"
sha256 = "{sha}"
"""


def _series(
    root: Path, patches: dict[str, bytes], *, fuzz=0, strip=1, renames=None, package="pkg"
) -> Path:
    """A series folder: series.toml plus the given patch files (bytes as they are)."""
    root.mkdir(parents=True, exist_ok=True)
    for old in root.glob("*.diff"):
        old.unlink()
    toml = f'name = "syn"\npackage = "{package}"\n[policy]\nstrip = {strip}\nmax_fuzz = {fuzz}\n'
    if renames:
        toml += "[renames]\n" + "".join(f'"{a}" = "{b}"\n' for a, b in renames.items())
    toml += PIN.format(sha="0" * 64)
    for name, data in patches.items():
        (root / name).write_bytes(data)
        toml += f'[[patches]]\nfile = "{name}"\nsummary = "s"\nstage = 1\n'
    (root / "series.toml").write_text(toml)
    return root


def _sha(tmp_path: Path, patches: dict[str, bytes], **settings) -> str:
    return load_series(_series(tmp_path / "s", patches, **settings)).sha256


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
    root = _series(tmp_path / "s", BASE)
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
    series = load_series(_series(tmp_path / "series", diffs))
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
