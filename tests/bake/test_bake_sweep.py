"""Fast: a bake sweeps what killed bakes left in the build folder and in build/dist
(partial wheels, staging trees), and only theirs (a live writer's file stays).

The slow ``test_bake.py`` kills a real bake mid-write to make the leftovers; here they
are laid down directly, named as a dead process would leave them, so the check does
not depend on when a kill lands. Runs on the synthetic release (tiny real wheels)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests._synthetic_release import make_loop


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_bake_sweeps_dead_bakes_leftovers_in_build_and_dist(tmp_path):
    _, build, cli, _, _ = make_loop(tmp_path)
    dist, dead = build / "dist", _dead_pid()
    wheels = sorted(dist.glob("*.whl"))
    leftovers = [
        dist / f".{wheels[0].name}.tmp-{dead}",  # a partial wheel
        build / f".baked.new-{dead}",  # a staging tree
    ]
    leftovers[0].write_bytes(b"half a wheel")
    leftovers[1].mkdir()
    (leftovers[1] / "x.py").write_text("")
    live = dist / f".other.whl.tmp-{os.getpid()}"  # a live writer's file stays
    live.write_bytes(b"in progress")
    proc = cli("bake")
    assert proc.returncode == 0, proc.stderr
    assert [p for p in leftovers if p.exists()] == []
    assert sorted(dist.glob(".*")) == [live]
