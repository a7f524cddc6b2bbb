"""Issue 24, item 5: an in-place edit to an untouched file of a baked tree never reaches
the pristine cache, which other checkouts share. The baked tree links to its build
folder's own copy; the test bakes the real cpu base with a private cache (never the real
one), appends with the shell's `>>`, and a plant of the old linking fails it.

Fast: an append (``>>``) to an untouched file of a baked tree stays in that tree.

The tree links to its build folder's own copy of the pristine tree, never to the shared
cache: ``status`` shows the file as modified since the bake and as an edit refresh would
pick up, the cache's stamp still holds, and the next bake puts the file back. Synthetic
release, private cache.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess

import pytest

from bakery.bake import bake as bake_mod
from bakery.bake import pristine as pristine_mod
from bakery.bake.bake import bake
from bakery.bake.pristine import pristine_edits
from tests._synthetic_release import make_loop
from tests.conftest import run_cli

UNTOUCHED = "vllm/envs.py"


def _private_cache(tmp_path, pin, cache):
    """The real wheel (a link to the session's copy) and nothing else: a fresh pristine."""
    private = tmp_path / "cache"
    (private / "wheels" / pin.sha256).mkdir(parents=True)
    os.symlink(
        cache / "wheels" / pin.sha256 / pin.wheel, private / "wheels" / pin.sha256 / pin.wheel
    )
    return private


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _append_leaves_the_cache_intact(tmp_path, series, private) -> None:
    pin = series.base("cpu")
    build, other = tmp_path / "build", tmp_path / "other-checkout"
    bake(series, "cpu", build=build, cache=private)
    bake(series, "cpu", build=other, cache=private)
    cached = private / "pristine" / pin.sha256 / UNTOUCHED
    before = _digest(cached)
    edited = build / "baked-cpu" / UNTOUCHED
    subprocess.run(["bash", "-c", f"echo >> '{edited}'"], check=True)
    assert _digest(edited) != before  # the edit is in this checkout's tree ...
    assert _digest(cached) == before, "the append reached the shared pristine cache"
    assert pristine_edits(pin.sha256, private) == []
    assert _digest(other / "baked-cpu" / UNTOUCHED) == before  # ... and in no other


@pytest.mark.slow
def test_an_append_to_an_untouched_file_never_reaches_the_cache(tmp_path, series, cache):
    pin = series.base("cpu")
    private = _private_cache(tmp_path, pin, cache)
    _append_leaves_the_cache_intact(tmp_path, series, private)
    env = {"BAKERY_CACHE": str(private)}
    build = tmp_path / "build"
    checks = (["bake", "--check", "--base", "cpu", "--build", str(build)],
              ["check", str(build / "baked-cpu")])  # fmt: skip
    for args in checks:  # this checkout sees its own edit
        proc = run_cli(*args, env=env)
        assert proc.returncode == 1 and UNTOUCHED in proc.stdout, (args, proc.stdout)
    proc = run_cli("bake", "--base", "cpu", "--build", str(build), env=env)
    assert proc.returncode == 0 and "copied again from the cache" in proc.stderr, proc.stderr
    cached = private / "pristine" / pin.sha256 / UNTOUCHED
    assert _digest(build / "baked-cpu" / UNTOUCHED) == _digest(cached)
    for args in checks:
        assert run_cli(*args, env=env).returncode == 0, args


@pytest.mark.slow
def test_planted_linking_into_the_cache_fails_it(tmp_path, series, cache, monkeypatch):
    """The old bake: untouched files linked straight to the shared cache."""
    pin = series.base("cpu")
    private = _private_cache(tmp_path, pin, cache)
    monkeypatch.setattr(bake_mod, "own_pristine", lambda source, build: source)
    with pytest.raises(AssertionError, match="reached the shared pristine cache"):
        _append_leaves_the_cache_intact(tmp_path, series, private)


UNTOUCHED = "vllm/__init__.py"  # not patched: linked from the build folder's own copy


def test_status_reports_an_append_as_this_trees_edit_and_the_cache_keeps_none(tmp_path):
    _, build, cli, _, _ = make_loop(tmp_path)
    tree = build / "baked"
    cache = tmp_path / "cache"
    (cached,) = (cache / "pristine").glob(f"*/{UNTOUCHED}")
    assert os.stat(tree / UNTOUCHED).st_ino != os.stat(cached).st_ino
    clean = json.loads(cli("status", "--json").stdout)["bases"]["default"]
    assert clean["stale"] == [] and clean["pending"] == []
    with open(tree / UNTOUCHED, "ab") as handle:  # `echo ... >> file`
        handle.write(b"# appended\n")
    state = json.loads(cli("status", "--json").stdout)["bases"]["default"]
    assert f"modified since the bake: {UNTOUCHED}" in state["stale"]
    assert [p["action"] for p in state["pending"]] == ["add"], state["pending"]
    assert cached.read_bytes() == b"" and pristine_edits(cached.parents[1].name, cache) == []
    proc = cli("bake")
    assert proc.returncode == 0 and "copied again from the cache" in proc.stderr
    assert (tree / UNTOUCHED).read_bytes() == b""
    assert json.loads(cli("status", "--json").stdout)["bases"]["default"]["stale"] == []


def test_a_copy_that_fails_midway_leaves_no_copy_and_starts_no_more_files(tmp_path, monkeypatch):
    """The build folder's copy is made by several threads: a full disk at one file is
    raised, the files not yet started are not copied, and no partial copy stays behind
    (the next command copies again)."""
    source = tmp_path / "cache" / "pristine" / ("ab" * 32)
    for i in range(400):
        (source / f"d{i % 9}").mkdir(parents=True, exist_ok=True)
        (source / f"d{i % 9}" / f"f{i}.py").write_bytes(b"x" * 4096)
    real, started = pristine_mod._clone_file, []

    def full_disk_at_the_20th(src, dst, reflink):
        started.append(src)
        if len(started) == 20:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(src, dst, reflink)

    monkeypatch.setattr(pristine_mod, "_clone_file", full_disk_at_the_20th)
    build = tmp_path / "build"
    with pytest.raises(OSError, match="No space left"):
        pristine_mod.own_pristine(source, build)
    assert len(started) < 400  # the queue was dropped, not copied to the end
    assert list((build / ".pristine").iterdir()) == []  # no copy, no staging folder
