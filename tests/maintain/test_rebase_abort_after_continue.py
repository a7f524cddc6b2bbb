"""Fast: ``rebase --abort`` after a ``--continue`` that failed part-way puts back the
series files that ``--continue`` had already rewritten (pins moved, patches refreshed,
one removed), byte for byte, and the tree. Synthetic release pair; the failure is a bake
that raises after the series was written (as a full disk or a killed pip would)."""

from __future__ import annotations

import pytest

from bakery.errors import BakeryError
from bakery.maintain import rebase_loop
from tests._synthetic_release import make_loop
from tests.maintain.test_rebase_loop import snapshot


def test_abort_after_a_failed_continue_restores_the_rewritten_series(tmp_path, monkeypatch):
    series, build, cli, _, _ = make_loop(tmp_path)
    before = snapshot(series, build / "baked")
    assert cli("rebase", "--to", "vllm==0.2.0", "--checkout").returncode == 1
    (build / "baked" / "vllm" / "b.py").write_bytes(b"B = 1\nLIMIT = 24\nNAME = 'b'\n")

    def failing_bake(*args, **kwargs):
        raise BakeryError("the re-bake failed (planted)")

    monkeypatch.setattr(rebase_loop, "bake", failing_bake)
    with pytest.raises(BakeryError, match="planted"):
        rebase_loop.resume(build, tmp_path / "cache", series)
    rewritten = snapshot(series)
    assert rewritten != {k: v for k, v in before.items() if k.startswith(str(series))}
    assert not (series / "03-c.py.diff").exists()  # --continue got as far as the series
    proc = cli("rebase", "--abort")
    assert proc.returncode == 0, proc.stderr
    assert snapshot(series, build / "baked") == before
    assert cli("bake", "--check").returncode == 0
