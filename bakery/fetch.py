"""Fetch a hash-pinned wheel into the cache, or take one given by path.

Downloads go through pip (``pip download --no-deps --require-hashes``), land in
a temp folder inside the cache and are moved in only once their sha256 is the
pinned one. A cached file that no longer matches is discarded and fetched again.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.utils import parse_wheel_filename

from .errors import FetchError, HashMismatch
from .series import Pin

__all__ = ["cache_dir", "sha256_file", "fetch", "fetch_release"]


def cache_dir() -> Path:
    return Path(os.environ.get("BAKERY_CACHE") or Path.home() / ".cache" / "bakery")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _pip_download(pin: Pin, dest: Path, verbose: bool) -> Path:
    _, _, _, tags = parse_wheel_filename(pin.wheel)
    platform = sorted({t.platform for t in tags})[0]
    requirements = dest / "requirements.txt"
    requirements.write_text(f"{pin.requirement} --hash=sha256:{pin.sha256}\n")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--require-hashes",
        "--disable-pip-version-check",
        "--dest",
        str(dest),
        "-r",
        str(requirements),
    ]
    if platform != "any":
        cmd += ["--platform", platform]
    if not verbose:
        cmd.append("--quiet")
    proc = subprocess.run(
        cmd, stdout=None if verbose else subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    path = dest / pin.wheel
    if proc.returncode != 0 or not path.exists():
        tail = (proc.stdout or "").strip().splitlines()[-3:]
        raise FetchError(
            f"pip could not download the pinned wheel ({' | '.join(tail) or 'no output'}): "
            f"{pin.wheel!r}",
            hint="check the network, or pass --wheel PATH to use a local copy",
        )
    return path


def _check(path: Path, pin: Pin) -> None:
    actual = sha256_file(path)
    if actual != pin.sha256:
        raise HashMismatch(
            f"wheel is not the pinned one (sha256 expected {pin.sha256}, got {actual}): "
            f"{str(path)!r}"
        )


def fetch(
    pin: Pin, *, wheel: Path | None = None, cache: Path | None = None, verbose: bool = False
) -> Path:
    """Path to a wheel whose sha256 is ``pin.sha256``; downloads on a cache miss."""
    if wheel is not None:
        if not Path(wheel).is_file():
            raise FetchError(f"no such wheel file: {str(wheel)!r}")
        _check(Path(wheel), pin)
        return Path(wheel)
    folder = (cache or cache_dir()) / "wheels" / pin.sha256
    cached = folder / pin.wheel
    if cached.exists():
        try:
            _check(cached, pin)
            return cached
        except HashMismatch:
            cached.unlink()  # corrupt or tampered cache entry: fetch it again
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as tmp:
        downloaded = _pip_download(pin, Path(tmp), verbose)
        _check(downloaded, pin)
        os.replace(downloaded, cached)
    return cached


def fetch_release(requirement: str, platform: str, cache: Path | None = None) -> Pin:
    """Fetch an unpinned release and pin it by the sha256 seen (recorded in the cache's
    index, so later runs verify against the first download instead of trusting again)."""
    cache = cache or cache_dir()
    index_path = cache / "index.json"
    index = json.loads(index_path.read_text()) if index_path.is_file() else {}
    key = f"{requirement} {platform}"
    if key in index:
        pin = Pin.parse(key, {"requirement": requirement, **index[key]}, str(index_path))
        return (
            pin if (cache / "wheels" / pin.sha256 / pin.wheel).is_file() else _download(pin, cache)
        )
    with tempfile.TemporaryDirectory(dir=cache, prefix=".release-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "--quiet",
            "--dest",
            tmp,
            requirement,
        ]
        if platform != "any":
            cmd += ["--platform", platform]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or len(wheels) != 1:
            tail = " | ".join(proc.stderr.strip().splitlines()[-2:]) or "no wheel"
            raise FetchError(f"pip could not download the release ({tail}): {requirement!r}")
        pin = Pin.parse(
            key,
            {"requirement": requirement, "wheel": wheels[0].name, "sha256": sha256_file(wheels[0])},
            requirement,
        )
        folder = cache / "wheels" / pin.sha256
        folder.mkdir(parents=True, exist_ok=True)
        os.replace(wheels[0], folder / pin.wheel)
    index[key] = {"wheel": pin.wheel, "sha256": pin.sha256}
    index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return pin


def _download(pin: Pin, cache: Path) -> Pin:
    fetch(pin, cache=cache)
    return pin
