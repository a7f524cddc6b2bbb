#!/usr/bin/env python3
"""Benchmarks, as ratios against baselines measured in the same run (`make bench`).

- cold bake (wheel cached, pristine not, a new build folder) vs `unzip -q` + GNU
  `patch -p1` of the series;
- warm rebake (pristine cached, the base wheel trusted by its stat after its first full
  hash, the patched wheel kept as its inputs made it) vs the same baseline; its target is
  its absolute time; and a rebake of a changed series, which writes the wheel anew;
- the first bake of a new build folder (pristine cached: it copies its own once);
- the hunk engine (in process) vs GNU `patch` (a process) on the same series;
- the engine on one large case (tools/big_diff.py: a 300k-line file, an ~8 MB diff of 30k
  hunks) vs GNU `patch --dry-run`: time (in process) and peak memory (a process each);
- refresh's walk over a tree with a 7-byte edit to a .so vs GNU `diff -rq`;
- `bakery --help` vs `python -c "import click"`;
- `rebase-matrix`, one release at a time (wheels cached), vs its floor (see `_matrix_row`).

This machine is noisy, so every number is a median of repeated runs.
"""

from __future__ import annotations

import itertools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bakery import (
    markdown,  # noqa: E402
    project,  # noqa: E402
)
from bakery.bake.bake import bake, up_to  # noqa: E402
from bakery.bake.fetch import cache_dir, fetch  # noqa: E402
from bakery.bake.pristine import own_copy, unpacked  # noqa: E402
from bakery.cli.boundary import run_command  # noqa: E402
from bakery.errors import UnsafePathError  # noqa: E402
from bakery.maintain.edits import differing_files  # noqa: E402
from bakery.maintain.matrix import matrix  # noqa: E402
from bakery.maintain.rebase import release_pin  # noqa: E402
from bakery.series import apply  # noqa: E402
from bakery.series.diff import parse_patch, read_patch  # noqa: E402
from bakery.series.series import Series, load_series  # noqa: E402
from tools.big_diff import big_case  # noqa: E402

__all__ = ["main"]


def _median(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _gnu_baseline(series: Series, wheel: Path, work: Path) -> None:
    """What a shell script would do: unzip the wheel, then GNU patch each diff."""
    out = work / "unzipped"
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run(["unzip", "-q", str(wheel), "-d", str(out)], check=True)
    _gnu_patch_series(series, out / series.package)


def _gnu_patch_series(series: Series, tree: Path, dry_run: bool = False) -> None:
    for entry in series.entries:
        cmd = [
            "patch",
            "-s",
            "-p1",
            "-d",
            str(tree),
            "-i",
            str((series.root / entry.file).resolve()),
        ]
        subprocess.run(cmd + (["--dry-run"] if dry_run else []), check=True)


def _row(name: str, ours: float, base: float, base_name: str, target: str) -> tuple[str, ...]:
    return (name, f"{ours:.3f} s", f"{base_name} {base:.3f} s", f"{ours / base:.2f}x", target)


# The engine alone in a fresh interpreter, for its peak memory: read, parse, place. Only its
# own modules: apply.plan's tree checks import more (bakery.tree) than the diff holds.
_ENGINE_PROCESS = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from bakery.series.diff import parse_patch, read_patch
from bakery.series.engine import apply_file_patch
(file_patch,) = parse_patch(read_patch(Path(sys.argv[3])), "big.diff").files
apply_file_patch("big.diff", file_patch, (Path(sys.argv[2]) / file_patch.path).read_bytes(), 0)
"""


TIME = "/usr/bin/time"  # GNU time, for a process's peak memory


def _peak_rss(cmd: list[str]) -> int:
    """A command's peak resident memory in bytes, as GNU time reports it. Not this process's
    own rusage of a child: Linux counts a child's memory from before its exec too, which
    here is this (large) process; time's own small process stands between them."""
    proc = subprocess.run([TIME, "-f", "%M", *cmd], capture_output=True, text=True, check=True)
    return int(proc.stderr.split()[-1]) * 1024


def _big_rows(work: Path, hunks: int = 30_000) -> list[tuple[str, ...]]:
    """The engine on tools/big_diff.py's case vs GNU `patch --dry-run`: time and memory."""
    target, diff = big_case(hunks)
    tree, patch = work / "big", work / "big.diff"
    (tree / "pkg").mkdir(parents=True, exist_ok=True)
    (tree / "pkg" / "big.py").write_bytes(target)
    patch.write_bytes(diff)
    gnu = ["patch", "-s", "--dry-run", "-p1", "-d", str(tree), "-i", str(patch)]
    base_times, ours_times = [], []
    for _ in range(7):  # alternated: a burst of load on this shared machine hits both
        base_times.append(_median(lambda: subprocess.run(gnu, check=True), 1))
        ours_times.append(
            _median(lambda: apply.plan(tree, [parse_patch(read_patch(patch), patch.name)]), 1)
        )
    base, ours = statistics.median(base_times), statistics.median(ours_times)
    engine = [sys.executable, "-c", _ENGINE_PROCESS, str(project.root()), str(tree), str(patch)]
    lines = target.count(b"\n")
    what = f"{hunks // 1000}k hunks, {len(diff) / 1e6:.1f} MB diff, {lines // 1000}k-line file"
    rows = [_row(f"engine: parse + place ({what})", ours, base, "GNU patch --dry-run", "<= 2.0x")]
    if not os.access(TIME, os.X_OK):
        return [*rows, ("engine: peak memory, same case", "n/a", f"needs {TIME}", "", "<= 4.0x")]
    gnu_rss = statistics.median(_peak_rss(gnu) for _ in range(3))
    our_rss = statistics.median(_peak_rss(engine) for _ in range(3))
    return [
        *rows,
        (
            "engine: peak memory, same case (a process importing the engine alone)",
            f"{our_rss / 2**20:.1f} MiB",
            f"GNU patch --dry-run {gnu_rss / 2**20:.1f} MiB",
            f"{our_rss / gnu_rss:.2f}x",
            "<= 4.0x",
        ),
    ]


def _matrix_row(series: Series, version: str, work: Path) -> tuple[str, ...]:
    """One release's `rebase-matrix` column (wheel cached, in process) vs its floor: the
    work the column cannot skip, done by the C tools: `unzip` of the members the series
    touches out of the cached wheel, then GNU `patch --dry-run -F3` of each patch on them.
    What the matrix adds on top (the release index, the wheel's trust check, the report)
    is bakery's overhead; hashing the 330 MB wheel on every run once made it ~45x."""
    pin = release_pin(series, "default", version, cache_dir())
    wheel = fetch(pin, cache=cache_dir())
    members = [f"{series.package}/{p}" for p in series.touched]
    out = work / f"members-{version}"

    def baseline() -> None:
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run(["unzip", "-q", "-o", str(wheel), *members, "-d", str(out)], check=False)
        for entry in series.entries:
            patch = (series.root / entry.file).resolve()
            cmd = ["patch", "-s", "--dry-run", "-p1", "-F3", "-d", str(out / series.package)]
            subprocess.run([*cmd, "-i", str(patch)], capture_output=True, check=False)

    ours_times, base_times = [], []
    for _ in range(7):  # alternated: a burst of load on this shared machine hits both
        base_times.append(_median(baseline, 1))
        ours_times.append(_median(lambda: matrix(series, [version], linkcheck=False), 1))
    base, ours = statistics.median(base_times), statistics.median(ours_times)
    return _row(
        f"rebase-matrix, one release ({version}, no linkcheck)",
        ours,
        base,
        "floor: unzip members+patch",
        "<= 2.0x",
    )


def _help_row() -> tuple[str, ...]:
    """`bakery --help` (a fresh interpreter) vs `python -c "import click"`: the CLI's own
    start-up cost over the library it stands on."""

    def run(*args: str) -> None:
        subprocess.run([sys.executable, *args], capture_output=True, check=True)

    base = _median(lambda: run("-c", "import click"), 10)
    ours = _median(lambda: run("-m", "bakery", "--help"), 10)
    return _row("bakery --help", ours, base, 'python -c "import click"', "<= 2.0x")


def _binary_edit_row(pristine: Path, tree: Path) -> tuple[str, ...]:
    """refresh's tree walk with a 7-byte edit to the base's largest .so under 64 MiB (it
    must refuse it at once: it once took 43 s to diff) vs GNU `diff -rq` of the trees."""
    sos = [p for p in pristine.rglob("*.so") if p.stat().st_size < 64 << 20]
    target = max(sos, key=lambda p: p.stat().st_size)
    edited = tree / target.relative_to(pristine)
    data = bytearray(target.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 7] = b"EDITED!"
    edited.unlink()  # a new file: never written through a link
    edited.write_bytes(bytes(data))

    def ours() -> None:
        try:
            differing_files(pristine, tree)
        except UnsafePathError:
            return
        raise AssertionError("refresh did not refuse the binary edit")

    base = _median(lambda: subprocess.run(["diff", "-rq", str(pristine), str(tree)],
                                          capture_output=True, check=False), 3)  # fmt: skip
    return _row(
        f"refresh walk, 7-byte edit to {target.name} ({target.stat().st_size >> 10} KiB)",
        _median(ours, 3),
        base,
        "diff -rq",
        "report",
    )


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--base", "base_key", type=click.Choice(["default", "cpu"]), default="default")
@click.option("--engine-only", is_flag=True, help="Only the engine rows (seconds, not minutes).")
def main(base_key: str, engine_only: bool) -> int:
    """Benchmarks as ratios against baselines measured in the same run (`make bench`)."""
    series = load_series(project.root() / project.SERIES)
    pin = series.base(base_key)
    wheel = fetch(pin, cache=cache_dir())
    rows = []
    with tempfile.TemporaryDirectory(prefix="bakery-bench-") as tmp:
        work = Path(tmp)
        cold_cache = work / "cache"

        def cold() -> None:
            shutil.rmtree(cold_cache, ignore_errors=True)
            shutil.rmtree(work / "build", ignore_errors=True)
            (cold_cache / "wheels" / pin.sha256).mkdir(parents=True)
            os.symlink(wheel, cold_cache / "wheels" / pin.sha256 / pin.wheel)
            bake(series, base_key, build=work / "build", cache=cold_cache)

        def new_checkout() -> None:  # pristine cached; the build folder copies it once
            shutil.rmtree(work / "build-new", ignore_errors=True)
            bake(series, base_key, build=work / "build-new", cache=cold_cache)

        if engine_only:
            cold()
        else:
            baseline = _median(lambda: _gnu_baseline(series, wheel, work), 3)
            cold_time = _median(cold, 3)
            warm_time = _median(
                lambda: bake(series, base_key, build=work / "build", cache=cold_cache), 7
            )
            rows.append(
                _row("cold bake (wheel cached)", cold_time, baseline, "unzip+patch", "<= 1.0x")
            )
            rows.append(_row("warm rebake", warm_time, baseline, "unzip+patch", "<= 0.5 s"))
            # The warm rebake keeps the wheel its inputs already made; a changed series
            # writes it anew (the last patch dropped and restored by turns).
            turns = itertools.cycle([up_to(series, str(series.entries[-2].number)), series])
            changed_time = _median(
                lambda: bake(next(turns), base_key, build=work / "build", cache=cold_cache), 6
            )
            rows.append(
                _row(
                    "rebake, series changed (wheel written anew)",
                    changed_time,
                    baseline,
                    "unzip+patch",
                    "report",
                )  # fmt: skip
            )
            unpacked(pin, cache=cold_cache)  # a cold bake leaves the cache to the next asker
            first = _median(new_checkout, 3)
            rows.append(
                _row(
                    "first bake of a build folder (pristine cached)",
                    first,
                    baseline,
                    "unzip+patch",
                    "report",
                )  # fmt: skip
            )

        tree = own_copy(work / "build", pin.sha256) / series.package
        gnu = _median(lambda: _gnu_patch_series(series, tree, dry_run=True), 20)
        engine = _median(
            lambda: apply.plan(tree, load_series(series.root).patches, max_fuzz=series.max_fuzz), 20
        )
        parsed = series.patches
        placing = _median(lambda: apply.plan(tree, parsed, max_fuzz=series.max_fuzz), 20)
        rows.append(
            _row("engine: parse + place series", engine, gnu, "GNU patch --dry-run", "<= 1.0x")
        )
        rows.append(
            _row("engine: place only (parsed)", placing, gnu, "GNU patch --dry-run", "report")
        )
        rows.extend(_big_rows(work))
        if not engine_only:
            baked = work / "build" / ("baked" if base_key == "default" else f"baked-{base_key}")
            # Against the cache's separate copy (every file read), not the build folder's
            # hard-linked one: the walk's worst case.
            cached = cold_cache / "pristine" / pin.sha256 / series.package
            rows.append(_binary_edit_row(cached, baked / series.package))
            for version in ("0.31.0", "0.32.0", "0.33.0"):
                rows.append(_matrix_row(series, version, work))
    rows.append(_help_row())
    print(f"# bakery bench ({base_key} base, {len(series.entries)} patches)\n")
    print(markdown.table(("what", "ours", "baseline", "ratio", "target"), rows))
    return 0


if __name__ == "__main__":
    sys.exit(run_command(main, sys.argv[1:], "tools/bench.py"))
