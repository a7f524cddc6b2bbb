"""The wheel cache after faults: partial downloads of killed fetches are swept (only
when their pid is dead), and a damaged release index is one clear error."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest
from packaging.requirements import Requirement

from bakery.errors import FetchError
from bakery.fetch import fetch, fetch_release
from bakery.series import Pin

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
