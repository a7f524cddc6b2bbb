"""edits.differing_files: byte comparison (filecmp) of a pristine and a baked tree; and
edits.check_reproduced, the one proof that a series reproduces a tree."""

import os

import pytest

from bakery.errors import BakeryError
from bakery.maintain.edits import check_reproduced, differing_files


def _trees(tmp_path):
    pristine, baked = tmp_path / "pristine", tmp_path / "baked"
    for root in (pristine, baked):
        (root / "pkg").mkdir(parents=True)
        (root / "pkg" / "a.py").write_bytes(b"x = 1\n")
    (pristine / "pkg" / "linked.py").write_bytes(b"same inode\n")
    os.link(pristine / "pkg" / "linked.py", baked / "pkg" / "linked.py")
    return pristine, baked


def test_only_files_whose_bytes_differ_are_listed(tmp_path):
    pristine, baked = _trees(tmp_path)
    assert differing_files(pristine, baked) == {}
    (baked / "pkg" / "a.py").write_bytes(b"x = 2\n")  # same size, other bytes
    assert differing_files(pristine, baked) == {"pkg/a.py": (b"x = 1\n", b"x = 2\n")}


def test_an_edit_that_keeps_size_and_mtime_is_still_seen(tmp_path):
    """filecmp remembers verdicts by size and mtime; a second call must not reuse one."""
    pristine, baked = _trees(tmp_path)
    target = baked / "pkg" / "a.py"
    before = target.stat()
    assert differing_files(pristine, baked) == {}
    target.write_bytes(b"x = 3\n")
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert differing_files(pristine, baked) == {"pkg/a.py": (b"x = 1\n", b"x = 3\n")}


def test_the_proof_names_every_file_the_tree_does_not_have_as_expected(tmp_path):
    _, baked = _trees(tmp_path)
    check_reproduced({"pkg/a.py": b"x = 1\n", "pkg/gone.py": None}, baked, "re-bake")
    expected = {"pkg/gone.py": b"y\n", "pkg/a.py": b"x = 2\n", "pkg/linked.py": b"same inode\n"}
    with pytest.raises(BakeryError) as caught:
        check_reproduced(expected, baked, "re-bake does not reproduce the edits")
    assert str(caught.value).splitlines()[0] == (
        "re-bake does not reproduce the edits (a bug): ['pkg/a.py', 'pkg/gone.py']"
    )
