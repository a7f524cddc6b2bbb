"""The suite needs nothing beside the repository: the oracle bundles are vendored."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from _verify_support import LICENSE, MTP, NOMTP, ORACLE

from tests.conftest import REPO

# A path built from the repo's parent, or a literal ../shared, reads outside a clone.
_OUTSIDE = re.compile(r"""parents\[\d\]\.parent|\.\./shared|["']shared["']""")


def test_oracle_bundles_are_vendored_with_their_notice():
    assert ORACLE.resolve().is_relative_to(REPO / "tests" / "data")
    assert "MIT License" in (ORACLE / LICENSE).read_text()
    assert "jasl/vllm-ds4-sm120-harness" in (ORACLE / "README.md").read_text()
    for bundle in (NOMTP, MTP):
        assert len(list(bundle.glob("completion_*_logprobs20.json"))) == 5, bundle
        assert len(list(bundle.glob("tokenize_completion_*_logprobs20.json"))) == 5, bundle


def test_no_test_reads_outside_the_repository():
    offenders = [
        f"{path.name}:{n}"
        for path in sorted((REPO / "tests").rglob("*.py"))  # tests/lab/emulate too
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if _OUTSIDE.search(line) and path.name != Path(__file__).name
    ]
    assert offenders == []


def _files_of_a_clone() -> list[str]:
    """What a clone holds: tracked files plus new ones git would commit (not ignored)."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    return [name for name in out.decode().split("\0") if name and (REPO / name).is_file()]


def test_golden_parity_runs_from_a_bare_copy_of_the_repo(tmp_path):
    clone = tmp_path / "alone" / "bakery"  # nothing beside it: no ../shared
    for name in _files_of_a_clone():
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, clone / name)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/verify/test_verify_golden.py",
        ],
        cwd=clone,
        env={**os.environ, "PYTHONPATH": str(clone)},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout
