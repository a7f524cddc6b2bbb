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
from pathlib import Path

import pytest

from bakery.bake import bake as bake_mod
from bakery.bake import pristine as pristine_mod
from bakery.bake.bake import bake
from bakery.bake.pristine import pristine, pristine_edits
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
    assert proc.returncode == 2 and UNTOUCHED in proc.stderr  # a bake would drop the edit
    proc = run_cli("bake", "--base", "cpu", "--build", str(build), "--discard-edits", env=env)
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
    monkeypatch.setattr(
        bake_mod, "own_pristine", lambda wheel, sha256, cache, build: pristine(wheel, sha256, cache)
    )
    with pytest.raises(AssertionError, match="reached the shared pristine cache"):
        _append_leaves_the_cache_intact(tmp_path, series, private)


UNTOUCHED = "vllm/__init__.py"  # not patched: linked from the build folder's own copy


def test_status_reports_an_append_as_this_trees_edit_and_the_cache_keeps_none(tmp_path):
    series, build, cli, _, _ = make_loop(tmp_path)
    tree = build / "baked"
    cache = tmp_path / "cache"
    clean = json.loads(cli("status", "--json").stdout)["bases"]["default"]
    assert clean["stale"] == [] and clean["pending"] == []
    with open(tree / UNTOUCHED, "ab") as handle:  # `echo ... >> file`
        handle.write(b"# appended\n")
    state = json.loads(cli("status", "--json").stdout)["bases"]["default"]
    assert f"modified since the bake: {UNTOUCHED}" in state["stale"]
    # The append reached the build folder's own copy, and one bake filled no cache.
    assert state["pending"] is None and "no intact pristine tree" in state["why"], state
    other = tmp_path / "other-build"  # a second build folder fills the cache ...
    env = {"BAKERY_CACHE": str(cache)}
    assert run_cli("bake", "--series", str(series), "--build", str(other), env=env).returncode == 0
    state = json.loads(cli("status", "--json").stdout)["bases"]["default"]
    assert [p["action"] for p in state["pending"]] == ["add"], state  # ... compared with
    proc = cli("bake", "--discard-edits")  # a plain bake refuses to drop the edit
    assert proc.returncode == 0 and "copied again from the cache" in proc.stderr
    (cached,) = (cache / "pristine").glob(f"*/{UNTOUCHED}")
    assert os.stat(tree / UNTOUCHED).st_ino != os.stat(cached).st_ino
    assert cached.read_bytes() == b"" and pristine_edits(cached.parents[1].name, cache) == []
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
    pristine_mod._stamp_path(source).write_bytes(pristine_mod.stamp_bytes(source))  # cached
    build = tmp_path / "build"
    with pytest.raises(OSError, match="No space left"):
        pristine_mod.own_pristine(None, source.name, tmp_path / "cache", build)  # type: ignore[arg-type]
    assert len(started) < 400  # the queue was dropped, not copied to the end
    assert list((build / ".pristine").iterdir()) == []  # no copy, no staging folder


def _bake_another(tmp_path, series, name) -> Path:
    """A bake of ``series`` into a new build folder of the loop's cache; its wheel."""
    build = tmp_path / name
    args = ("bake", "--series", str(series), "--build", str(build))
    proc = run_cli(*args, env={"BAKERY_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr
    (wheel,) = (build / "dist").glob("*.whl")
    return wheel


def test_the_first_bake_extracts_into_its_build_folder_and_the_second_fills_the_cache(tmp_path):
    """A first bake on a machine writes the tree once (docs/benchmarks.md: cold bake); the
    next build folder fills the shared cache, and later ones copy from it. Every way gives
    the same wheel, byte for byte."""
    series, build, _, _, _ = make_loop(tmp_path)  # the first bake
    cache = tmp_path / "cache" / "pristine"
    (own,) = (build / ".pristine").glob(f"*/{UNTOUCHED}")
    sha256 = own.parents[1].name
    assert not (cache / sha256).exists(), "the first bake filled the cache"
    assert (cache / f"{sha256}.asked").is_file()
    assert (build / ".pristine" / f"{sha256}.record.json").is_file()
    (first,) = (build / "dist").glob("*.whl")
    second = _bake_another(tmp_path, series, "build-2")
    cached = cache / sha256 / UNTOUCHED
    assert cached.is_file(), "the second build folder did not fill the cache"
    filled = os.stat(cached).st_ino
    assert pristine_edits(sha256, tmp_path / "cache") == []  # stamped as extracted
    third = _bake_another(tmp_path, series, "build-3")
    assert os.stat(cached).st_ino == filled  # copied from, not extracted again
    copies = [own, cached, *tmp_path.glob(f"build-*/.pristine/*/{UNTOUCHED}")]
    assert len({os.stat(p).st_ino for p in copies}) == 4  # four real copies, none linked
    assert first.read_bytes() == second.read_bytes() == third.read_bytes()


def test_a_folder_where_the_cache_note_goes_is_read_as_asked(tmp_path):
    """A folder at ``pristine/<sha>.asked`` (the hostile round: every first bake failed,
    naming a temp file): the bake reads it as a note already left and fills the cache."""
    series, build, _, _, _ = make_loop(tmp_path)
    cache = tmp_path / "cache" / "pristine"
    (note,) = cache.glob("*.asked")
    note.unlink()
    note.mkdir()
    _bake_another(tmp_path, series, "build-2")
    assert (cache / note.name.removesuffix(".asked") / UNTOUCHED).is_file()
    assert note.is_dir()  # left as it was


@pytest.mark.parametrize("plant", ["never fills", "always fills"])
def test_planted_cache_rules_fail_it(tmp_path, monkeypatch, plant):
    if plant == "never fills":  # the second asker extracts straight too
        monkeypatch.setattr(pristine_mod, "pristine", lambda *args: None)
    else:
        monkeypatch.setattr(pristine_mod, "_shared_source", pristine)
    expected = {"never fills": "did not", "always fills": "the first bake filled"}[plant]
    with pytest.raises(AssertionError, match=expected):
        test_the_first_bake_extracts_into_its_build_folder_and_the_second_fills_the_cache(tmp_path)
