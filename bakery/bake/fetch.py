"""Fetch a hash-pinned wheel into the cache, or take one given by path; ask the index
which releases it has. This is the one place that talks to the package index, always
through pip, so pip's configuration (``PIP_INDEX_URL``, pip.conf) says which index.

Downloads go through pip (``pip download --no-deps --require-hashes``), land in
a temp folder inside the cache and are moved in only once their sha256 is the
pinned one. A cached file that no longer matches is discarded and fetched again.

Once a cached wheel's sha256 has been checked, the cache keeps a trust record beside it
(``verified.json``, see ``trust``): later commands trust the wheel without hashing its
330 MB while its device, inode, size, mtime and ctime still match.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from packaging.utils import parse_wheel_filename
from packaging.version import InvalidVersion, Version

from bakery.bake import trust
from bakery.errors import FetchError, HashMismatch, IndexUnreachable, UnreadableInput
from bakery.progress import note
from bakery.schema import Document, encode_json, try_decode
from bakery.series.series import Pin
from bakery.tree import sha256_file, sweep_dead, write_atomic

__all__ = ["cache_dir", "fetch", "fetch_release", "release_versions", "wheel_platform"]


def cache_dir() -> Path:
    return Path(os.environ.get("BAKERY_CACHE") or Path.home() / ".cache" / "bakery")


# pip's failure, for a release fetched by version: once downloaded, it is read from the cache.
_RELEASE_HINT = "check the network (a release is downloaded once, then read from the cache)"


def _pin_hint(pin: Pin, cached: Path) -> str:
    """pip's failure, for a pinned wheel: the way to put a local copy in the cache once,
    for every later command. `bake --wheel` checks its file against the base pin it bakes,
    so it can take only a base; any other pin (a dependency, a release being rebased
    onto) is taken from its cache path, where ``fetch`` checks its sha256 before use."""
    if pin.is_base:
        hint = (
            "check the network, or put a local copy of the pinned wheel in the cache once "
            f"with `bakery bake --base {pin.key} --wheel PATH`"
        )
    else:
        hint = (
            f"check the network, or copy the pinned wheel (sha256 {pin.sha256}) "
            f"to {str(cached)!r} once"
        )
    return hint


def _pip_download(
    args: list[str], dest: Path, platform: str, verbose: bool, hint: str = _RELEASE_HINT
) -> list[Path]:
    """``pip download --no-deps`` of binary wheels into ``dest``; the wheels it wrote."""
    cmd = _pip_download_cmd(args, dest, platform)
    if not verbose:
        cmd.append("--quiet")
    proc = subprocess.run(
        cmd, stdout=None if verbose else subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = " | ".join((proc.stdout or "").strip().splitlines()[-3:]) or "no output"
        raise FetchError(
            f"pip could not download ({tail}): {' '.join(args)!r}",
            hint=hint,
        )
    return wheels


def _pip_download_cmd(args: list[str], dest: Path, platform: str) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--dest",
        str(dest),
        *args,
    ]
    if platform != "any":
        cmd += ["--platform", platform]
    return cmd


def wheel_platform(wheel_name: str) -> str:
    _, _, _, tags = parse_wheel_filename(wheel_name)
    return sorted({t.platform for t in tags})[0]


def _verify_pin(path: Path, pin: Pin) -> None:
    actual = sha256_file(path)
    if actual != pin.sha256:
        raise HashMismatch(
            f"wheel is not the pinned one (sha256 expected {pin.sha256}, got {actual}): "
            f"{str(path)!r}"
        )


_TRUST_RECORD = "verified.json"  # beside the wheel, in its wheels/<sha256>/ folder


def _verify_cached(cached: Path, pin: Pin, cache: Path) -> None:
    """Hash the cached wheel against the pin (``HashMismatch`` if it is not the pinned
    one), then record its stat as taken before the hash: a write since moves the mtime."""
    started = time.time_ns()
    before = trust.seen(cached, pin.sha256)
    _verify_pin(cached, pin)
    trust.remember(cached.with_name(_TRUST_RECORD), before, cache, started)


def _keep(wheel: Path, cached: Path) -> None:
    """A wheel given by path (already verified) joins the cache under its sha256, so every
    later command that needs this pin (refresh --check, linkcheck, rebase) works offline."""
    if cached.is_file():
        return
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_name(f".{cached.name}.tmp-{os.getpid()}")
    try:
        try:
            os.link(wheel, tmp)
        except OSError:  # another filesystem
            shutil.copyfile(wheel, tmp)
        os.replace(tmp, cached)
    finally:
        tmp.unlink(missing_ok=True)


def fetch(
    pin: Pin, *, wheel: Path | None = None, cache: Path | None = None, verbose: bool = False
) -> Path:
    """Path to a wheel whose sha256 is ``pin.sha256``; downloads on a cache miss."""
    cache = cache or cache_dir()
    if wheel is not None:
        if not Path(wheel).is_file():  # missing, a folder, /dev/null: bad input, exit 2
            raise UnreadableInput(
                f"--wheel is not a regular file: {str(wheel)!r}",
                hint=f"give the path of the pinned wheel, {pin.wheel}",
            )
        _verify_pin(Path(wheel), pin)
        _keep(Path(wheel), cache / "wheels" / pin.sha256 / pin.wheel)
        return Path(wheel)
    folder = cache / "wheels" / pin.sha256
    sweep_dead(folder)  # downloads of killed fetches (named for their pid, as below)
    cached = folder / pin.wheel
    if cached.exists():
        if trust.trusted(cached.with_name(_TRUST_RECORD), cached, pin.sha256):
            note(f"{pin.wheel}: sha256 not recomputed (same device, inode, size, mtime "
                 "and ctime as when it was verified)")  # fmt: skip
            return cached
        try:
            _verify_cached(cached, pin, cache)
            return cached
        except HashMismatch:
            cached.unlink()  # corrupt or tampered cache entry: fetch it again
            with contextlib.suppress(OSError):
                cached.with_name(_TRUST_RECORD).unlink()
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(
        dir=folder, prefix=".download-", suffix=f".tmp-{os.getpid()}"
    ) as tmp:
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text(f"{pin.requirement} --hash=sha256:{pin.sha256}\n")
        args = ["--require-hashes", "-r", str(requirements)]
        platform = wheel_platform(pin.wheel)
        _pip_download(args, Path(tmp), platform, verbose, _pin_hint(pin, cached))
        downloaded = Path(tmp) / pin.wheel
        if not downloaded.is_file():
            raise FetchError(f"pip fetched another file than the pinned wheel: {pin.wheel!r}")
        _verify_pin(downloaded, pin)
        os.replace(downloaded, cached)
    return cached


class ReleaseEntry(Document, frozen=True):
    """One release the cache pinned by the sha256 it saw first (index.json's values)."""

    wheel: str
    sha256: str


ReleaseIndex = dict[str, ReleaseEntry]  # "<requirement> <platform>" -> its entry


def _release_index(path: Path) -> ReleaseIndex:
    """The cache's record of first-seen release hashes (index.json)."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        data = None
    index, problems = try_decode(data, ReleaseIndex)
    if index is None or problems:
        raise FetchError(
            f"release index is not an object of {{wheel, sha256}} entries: {str(path)!r}",
            hint="delete it; the next fetch pins each release by the sha256 it sees again",
        )
    return index


def fetch_release(requirement: str, platform: str, cache: Path | None = None) -> Pin:
    """Fetch an unpinned release and pin it by the sha256 seen (recorded in the cache's
    index, so later runs verify against the first download instead of trusting again)."""
    cache = cache or cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    index_path = cache / "index.json"
    index = _release_index(index_path)
    key = f"{requirement} {platform}"
    if key in index:
        seen = index[key]
        table = {"requirement": requirement, "wheel": seen.wheel, "sha256": seen.sha256}
        pin = Pin.parse(key, table, str(index_path))
        fetch(pin, cache=cache)  # verifies against the hash seen first, refetches if needed
        return pin
    sweep_dead(cache)
    with tempfile.TemporaryDirectory(
        dir=cache, prefix=".release-", suffix=f".tmp-{os.getpid()}"
    ) as tmp:
        wheels = _pip_download([requirement], Path(tmp), platform, verbose=False)
        pin = Pin.parse(
            key,
            {"requirement": requirement, "wheel": wheels[0].name, "sha256": sha256_file(wheels[0])},
            requirement,
        )
        folder = cache / "wheels" / pin.sha256
        folder.mkdir(parents=True, exist_ok=True)
        os.replace(wheels[0], folder / pin.wheel)
    index[key] = ReleaseEntry(pin.wheel, pin.sha256)
    write_atomic(index_path, encode_json(index, sort_keys=True))
    return pin


# pip's words when it could not reach an index (it then goes on as if the index were
# empty, so "no matching distribution" alone cannot tell offline from unknown).
_UNREACHABLE = re.compile(
    r"connection broken by|Could not fetch URL|Failed to establish|NameResolutionError|"
    r"Max retries exceeded|ConnectTimeoutError|ReadTimeoutError|SSLError"
)
_VERSIONS = re.compile(r"\(from versions: ([^)]*)\)")
# Arbitrary equality (===) with a string no version is: pip lists what it could take.
_NO_VERSION = "===bakery-asks-which-versions"


def release_versions(name: str, platform: str = "any") -> list[Version]:
    """Every final release of ``name`` with a wheel for ``platform`` that the package
    index lists, newest first: what ``pip download`` (as ``fetch`` runs it) could take,
    as pip lists it for a version none is. IndexUnreachable when pip could not reach an
    index; FetchError when the index has no such release."""
    with tempfile.TemporaryDirectory(prefix="bakery-versions-") as tmp:
        cmd = _pip_download_cmd([f"{name}{_NO_VERSION}", "--retries", "1"], Path(tmp), platform)
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    output = proc.stdout + proc.stderr
    if _UNREACHABLE.search(output):
        line = next(ln for ln in output.splitlines() if _UNREACHABLE.search(ln))
        reason = re.search(r"\[Errno -?\d+\] ([^'\")]+)", line) or re.search(r"(\w+Error)", line)
        where = f" ({reason.group(1).strip()})" if reason else ""
        raise IndexUnreachable(
            f"the package index could not be reached{where}: asking for {name!r}",
            hint="check the network, or point pip at a reachable index (PIP_INDEX_URL); "
            "`bakery rebase-matrix --releases X.Y.Z,...` works offline from the cache",
        )
    found = _VERSIONS.search(output)
    versions = []
    for text in found.group(1).split(",") if found else ():
        try:
            versions.append(Version(text.strip()))
        except InvalidVersion:
            continue
    if not versions:
        tail = " | ".join(output.strip().splitlines()[-2:]) or "no output"
        raise FetchError(
            f"the package index lists no release of {name!r} ({tail})",
            hint="check the name, and that PIP_INDEX_URL points at the index that has it",
        )
    return sorted((v for v in versions if not v.is_prerelease), reverse=True)
