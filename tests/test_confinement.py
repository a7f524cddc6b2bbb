"""Path confinement: a sibling whose name starts with the root's name is outside the root.

Every check that a path lies inside a folder (the safe-path helper, the import check,
the launcher's preflight and doctor) gets a path in ``<root>-old``: a check done as a
string prefix (``str(path).startswith(str(root))``) passes it as inside and fails here.
"""

from __future__ import annotations

import dataclasses
import sys

import msgspec
import pytest
from _launch_support import PROFILES, PYTHON, SERIES, canned_probe

from bakery.check.importcheck import import_check
from bakery.errors import UnsafePathError
from bakery.launch import doctor, preflight
from bakery.launch.gates import load_gate_table
from bakery.launch.host import ProbeAnswer
from bakery.launch.plan import make_plan
from bakery.launch.profiles import load_profile
from bakery.tree import inside
from tests.conftest import REPO


def _sibling(tmp_path, name="baked-cpu"):
    """(root, a file in ``<root>-old``): same prefix, another folder."""
    root, other = tmp_path / name, tmp_path / f"{name}-old"
    (root / "vllm").mkdir(parents=True)
    (other / "vllm").mkdir(parents=True)
    (other / "vllm" / "__init__.py").write_text("")
    (other / "vllm" / "touched.py").write_text("")
    return root, other / "vllm" / "__init__.py"


def test_a_symlink_into_a_sibling_with_the_roots_prefix_is_refused(tmp_path):
    root, outside = _sibling(tmp_path)
    (root / "vllm" / "link").symlink_to(outside.parent)
    with pytest.raises(UnsafePathError, match="through a symlink"):
        inside(root, "vllm/link/touched.py")
    assert inside(root, "vllm/touched.py") == root / "vllm" / "touched.py"


def test_import_check_refuses_vllm_from_a_sibling_with_the_trees_prefix(tmp_path, monkeypatch):
    tree, elsewhere = _sibling(tmp_path)
    (tree / "vllm").rmdir()  # the tree has no vllm: the sibling on PYTHONPATH is imported
    monkeypatch.setenv("PYTHONPATH", str(elsewhere.parent.parent))
    (result,) = import_check(tree, ["vllm.touched"], python=sys.executable)
    assert not result.ok and result.detail == f"vllm imported from {elsewhere}, not from {tree}"


def _plan(tree):
    profile = load_profile("cpu-tiny", PROFILES, load_gate_table(SERIES))
    return make_plan(profile, python=PYTHON, tree=tree, root=REPO, artifacts=tree.parent / "a")


def test_preflight_refuses_vllm_from_a_sibling_with_the_trees_prefix(tmp_path):
    tree, elsewhere = _sibling(tmp_path)
    plan = _plan(tree)
    probe = canned_probe()(plan)
    assert not preflight._probe_problems(plan, probe, None, None)  # from the tree: fine
    probe = msgspec.structs.replace(probe, vllm_file=str(elsewhere))
    problems = preflight._probe_problems(plan, probe, None, None)
    assert [p.what for p in problems] == ["vLLM would not come from the baked tree"]


def test_doctor_refuses_vllm_from_a_sibling_with_the_trees_prefix(tmp_path, monkeypatch):
    tree, elsewhere = _sibling(tmp_path)
    answer = ProbeAnswer(vllm_file=str(tree / "vllm" / "__init__.py"), vllm_version="0.32.0")
    monkeypatch.setattr(doctor, "_vllm", lambda *_: answer)
    assert doctor._from_tree(PYTHON, tmp_path, tree).ok
    moved = msgspec.structs.replace(answer, vllm_file=str(elsewhere))
    monkeypatch.setattr(doctor, "_vllm", lambda *_: moved)
    check = doctor._from_tree(PYTHON, tmp_path, tree)
    assert not check.ok and str(elsewhere.parent) in dataclasses.asdict(check)["detail"]
