"""BAKED.json's own functions (fast): the atomic write (under a real write fault), the
stable bytes, finding it, loading it back, and drift through a symlink. How a plan becomes
a manifest, and each kind of drift, are in test_identity_manifest.py; hostile manifests
through the CLI in test_hostile_manifest.py."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from bakery.bake import manifest
from bakery.errors import ManifestError, UnsafePathError
from tests._faults import assert_atomic_under_fault

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
