"""Byte parity with GNU patch: the seed, and synthetic diffs of real vLLM files."""

import random
import re
import subprocess
from pathlib import Path

import pytest

from bakery.errors import HunkFailed
from bakery.series.diff import parse_patch, render_file_diff
from bakery.series.engine import apply_file_patch
from tests.conftest import SEED

pytestmark = pytest.mark.needs("patch")  # fails under CI=true when missing
_HUNK = re.compile(
    r"Hunk #(\d+) succeeded at \d+(?: with fuzz (\d+))?(?: \(offset (-?\d+) lines?\))?"
)


def gnu_patch(target: bytes, diff: bytes, tmp: Path, fuzz: int):
    """(output bytes or None on failure, {hunk: (offset, fuzz)}) from GNU patch."""
    src, out = tmp / "target", tmp / "out"
    src.write_bytes(target)
    out.unlink(missing_ok=True)
    proc = subprocess.run(
        ["patch", "--forward", "--batch", f"--fuzz={fuzz}", "-r", "-", "-o", str(out), str(src)],
        input=diff,
        capture_output=True,
    )
    text = proc.stdout.decode(errors="replace")
    if proc.returncode != 0:
        return None, {}
    placements = {int(m[1]): (int(m[3] or 0), int(m[2] or 0)) for m in _HUNK.finditer(text)}
    return out.read_bytes(), placements


def ours(target: bytes, diff: bytes, fuzz: int, renames=()):
    patch = parse_patch(diff, "p", renames=renames)
    try:
        result = apply_file_patch("p", patch.files[0], target, fuzz)
    except HunkFailed:
        return None, {}
    placed = {p.hunk: (p.offset, p.fuzz) for p in result.placements if p.offset or p.fuzz}
    return result.after, placed


def test_seed_with_fuzz_2_equals_gnu_patch(pristine_cpu, tmp_path):
    rel = "vllm/models/deepseek_v41/nvidia/flashinfer_sparse.py"
    target = (pristine_cpu / rel).read_bytes()
    seed = SEED.read_bytes()
    # GNU patch needs the seed's final newline back; bakery takes the seed as it is.
    expected, gnu_places = gnu_patch(target, seed + b"\n", tmp_path, fuzz=2)
    got, our_places = ours(target, seed, 2, (("models/deepseek_v4_1/", "models/deepseek_v41/"),))
    assert expected is not None and got == expected
    assert our_places == gnu_places
    assert gnu_places[1] == (0, 1) and gnu_places[4] == (25, 2)


def _drift(lines: list[bytes], rng: random.Random) -> list[bytes]:
    """Unrelated upstream churn: insertions, deletions and edited lines anywhere."""
    out = list(lines)
    for _ in range(rng.randint(0, 8)):
        at = rng.randrange(len(out) + 1)
        op = rng.choice(["insert", "insert", "delete", "edit"])
        if op == "insert":
            out[at:at] = [b"# upstream %d\n" % rng.randrange(1000)] * rng.randint(1, 4)
        elif at < len(out) and op == "delete":
            del out[at]
        elif at < len(out):
            out[at] = b"# edited upstream\n"
    return out


def test_synthetic_diffs_of_real_vllm_files_match_gnu_patch(pristine_cpu, tmp_path):
    files = sorted((pristine_cpu / "vllm" / "v1").rglob("*.py"))
    files = [f for f in files if 40 < f.stat().st_size < 60_000]
    rng = random.Random(20261130)
    outcomes = {"applied": 0, "failed": 0, "fuzzed": 0, "offset": 0}
    for case in range(60):
        original = rng.choice(files).read_bytes()
        lines = original.splitlines(keepends=True)
        edited = list(lines)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(edited))
            edited[at : at + rng.randint(0, 2)] = [b"patched %d\n" % case]
        diff = render_file_diff("f.py", original, b"".join(edited))
        target = b"".join(_drift(lines, rng))
        fuzz = rng.choice([0, 1, 2])
        expected, gnu_places = gnu_patch(target, diff, tmp_path, fuzz)
        got, our_places = ours(target, diff, fuzz)
        assert got == expected, f"case {case}: output differs from GNU patch"
        assert our_places == gnu_places, f"case {case}: placements differ"
        if expected is None:
            outcomes["failed"] += 1
            continue
        outcomes["applied"] += 1
        outcomes["fuzzed"] += any(f for _, f in our_places.values())
        outcomes["offset"] += any(o for o, _ in our_places.values())
    # The cases must exercise every branch, or the comparison proves little.
    assert all(outcomes.values()), outcomes
