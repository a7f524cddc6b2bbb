"""Issue 22: refresh never reads through a symlink out of the tree, never writes a series it
cannot bake, and writes its files all or nothing under a write fault or a kill (findings 7,
11, 12, 13), through the CLI on the synthetic release."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests._synthetic_release import make_loop
from tests.conftest import REPO
from tests.maintain.test_rebase_loop import snapshot


@pytest.fixture
def loop(tmp_path):
    return make_loop(tmp_path)


def secret(tmp_path: Path) -> Path:
    path = tmp_path / "secret.txt"
    path.write_bytes(b"TOP SECRET do not copy\n")
    return path


@pytest.mark.parametrize("where", ["new.py", "a.py"])
def test_refresh_never_reads_through_a_symlink_out_of_the_tree(loop, tmp_path, where):
    series, build, cli, _, _ = loop
    before = snapshot(series)
    link = build / "baked" / "vllm" / where
    link.unlink(missing_ok=True)  # a tracked file replaced by the symlink, or a new one
    link.symlink_to(secret(tmp_path))
    proc = cli("refresh", "--no-bake")
    assert proc.returncode == 2, proc.stderr
    assert f"'{where}': a symlink (refresh never reads through one)" in proc.stderr
    assert snapshot(series) == before
    assert not any(b"TOP SECRET" in data for data, _ in snapshot(series).values())


def test_a_symlinked_folder_in_the_tree_is_refused_too(loop, tmp_path):
    series, build, cli, _, _ = loop
    before = snapshot(series)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.py").write_bytes(b"SECRET = 1\n")
    (build / "baked" / "vllm" / "sub").symlink_to(outside)
    proc = cli("refresh", "--no-bake")
    assert proc.returncode == 2 and "'sub': a symlink" in proc.stderr, proc.stderr
    assert snapshot(series) == before


@pytest.mark.parametrize(
    "name, why",
    [
        ("tab\there.py", "a control character or a backslash"),
        ("new\nline.py", "a control character or a backslash"),
        ("back\\slash.py", "a control character or a backslash"),
    ],
)
def test_refresh_refuses_a_name_no_patch_can_carry(loop, name, why):
    series, build, cli, _, _ = loop
    before = snapshot(series)
    (build / "baked" / "vllm" / name).write_bytes(b"X = 1\n")
    proc = cli("refresh", "--no-bake")
    assert proc.returncode == 2 and why in proc.stderr, proc.stderr
    assert len(proc.stderr.splitlines()) == 2  # one error line (the name is escaped), a hint
    assert snapshot(series) == before


def test_refresh_refuses_a_tracked_file_turned_into_a_folder(loop):
    series, build, cli, _, _ = loop
    before = snapshot(series)
    target = build / "baked" / "vllm" / "b.py"
    target.unlink()
    target.mkdir()
    (target / "inner.py").write_bytes(b"Y = 2\n")
    proc = cli("refresh", "--no-bake")
    assert proc.returncode == 2 and "'b.py': a file of the base is a folder" in proc.stderr
    assert snapshot(series) == before


@pytest.mark.parametrize(
    "name, data",
    [
        ("ext.abi3.so", b"\x7fELF\x02\x01\x01\x00" + b"\x00" * 4000 + b"EDITED!"),
        ("a.py", b"x = 1\n" * 2000 + b"y = '\x00'\n"),  # the NUL past git's 8000 bytes
    ],
    ids=["so", "nul-past-8000-bytes"],
)
def test_a_binary_file_is_refused_at_once_never_diffed(loop, name, data):
    """Finding 18: a 7-byte edit to a .so became a 43 s diff (and a patch no tool applies)."""
    series, build, cli, _, _ = loop
    before = snapshot(series)
    (build / "baked" / "vllm" / name).write_bytes(data)
    proc = cli("refresh", "--no-bake")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and len(proc.stderr.splitlines()) == 2
    assert f"'{name}': a binary file (a NUL byte), which no text diff carries" in proc.stderr
    assert snapshot(series) == before


def test_a_fifo_in_the_tree_neither_hangs_nor_becomes_a_patch(loop):
    series, build, cli, _, _ = loop
    before = snapshot(series)
    os.mkfifo(build / "baked" / "vllm" / "pipe.py")
    proc = cli("refresh", "--no-bake")  # run_cli has no timeout: a hang fails the suite
    assert proc.returncode == 2 and "'pipe.py': not a regular file" in proc.stderr
    assert snapshot(series) == before


# The CLI in a child with a file size limit: the kernel refuses a write part-way (EFBIG),
# a real write fault wherever it falls, as a full disk would.
_UNDER_LIMIT = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024, resource.RLIM_INFINITY))
from bakery.cli.root import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_write_fault_mid_refresh_leaves_the_series_whole(loop, tmp_path):
    series, build, cli, _, _ = loop
    package = build / "baked" / "vllm"
    (package / "a.py").write_bytes(b"A = 3\n")  # an update, written first by the old code
    (package / "c.py").write_bytes(b"C = 1\nD = 2\nE = 3\n")  # 03 goes: a removal
    (package / "big.py").write_bytes(b"x = 1\n" * 8000)  # its new patch is over the limit
    before = snapshot(series)
    proc = subprocess.run(
        [sys.executable, "-c", _UNDER_LIMIT, "refresh", "--no-bake", "--yes",
         "--series", str(series), "--build", str(build)],
        capture_output=True, text=True, cwd=REPO,
        env={**os.environ, "BAKERY_CACHE": str(tmp_path / "cache")},
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("error: File too large") and ": None" not in proc.stderr
    assert "Traceback" not in proc.stderr
    assert snapshot(series) == before  # no patch updated, none removed, none orphaned
    assert not [p.name for p in tmp_path.iterdir() if ".new-" in p.name]
    proc = cli("refresh", "--no-bake", "--yes")  # the retry works: nothing half-done
    assert proc.returncode == 0, proc.stderr
    assert (series / "04-big.py.diff").exists() and not (series / "03-c.py.diff").exists()


# refresh in a child that SIGKILLs itself at its argv[1]-th rename, unlink or exchange in
# bakery.tree: every step of the multi-file write, wherever it is.
_KILLED = """
import os, signal, sys
from bakery import tree
count = [0]
def counted(real):
    def wrapper(*args, **kwargs):
        count[0] += 1
        if count[0] == int(sys.argv[1]):
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)
    return wrapper
for name in ("replace", "rename", "unlink"):
    setattr(tree.os, name, counted(getattr(os, name)))
tree._exchange = counted(tree._exchange)
from bakery.cli.root import main
sys.exit(main(sys.argv[2:]))
"""


def test_a_refresh_killed_at_any_step_leaves_the_old_or_the_new_series(loop, tmp_path):
    series, build, cli, _, _ = loop
    package = build / "baked" / "vllm"
    (package / "a.py").write_bytes(b"A = 3\n")
    (package / "c.py").write_bytes(b"C = 1\nD = 2\nE = 3\n")
    (package / "new.py").write_bytes(b"N = 1\n")
    old = snapshot(series)
    seen = set()
    for step in range(1, 40):
        proc = subprocess.run(
            [sys.executable, "-c", _KILLED, str(step), "refresh", "--no-bake", "--yes",
             "--series", str(series), "--build", str(build)],
            capture_output=True, text=True, cwd=REPO,
            env={**os.environ, "BAKERY_CACHE": str(tmp_path / "cache")},
        )  # fmt: skip
        now = snapshot(series)
        if proc.returncode == 0:
            break
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        assert now == old or sorted(p.name for p in series.iterdir()) == [
            "01-a.py.diff", "02-b.py.diff", "04-new.py.diff", "series.toml",
        ], f"step {step}: a half-written series: {sorted(p.name for p in series.iterdir())}"
        seen.add(now == old)
        if now != old:  # the new series is whole: put the old back for the next step
            for path in series.iterdir():
                path.unlink()
            for name, (data, _) in old.items():
                Path(name).write_bytes(data)
    else:
        raise AssertionError("refresh never finished")
    assert seen == {True, False}, seen  # kills fell on both sides of the exchange
    assert cli("refresh", "--check").returncode in (0, 1)  # the series reads back
    assert not [p.name for p in series.iterdir() if p.name.startswith(".")]
    proc = cli("refresh", "--no-bake", "--yes")  # a later run sweeps the killed clones
    assert not [p.name for p in tmp_path.iterdir() if ".new-" in p.name], proc.stderr
