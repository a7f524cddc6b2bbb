"""Fast: ``refresh`` refuses when only the series' apply settings changed after the bake.

The bake records the series sha256 (settings included); a fuzz or rename change alone
leaves every patch's bytes as they were, so a check that compares patches only would
let refresh rewrite the series from a tree baked under other settings."""

from __future__ import annotations

import pytest

from tests._synthetic_release import make_loop


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("max_fuzz = 0", "max_fuzz = 1"),
        ("[policy]\n", '[renames]\n"gone/" = "elsewhere/"\n\n[policy]\n'),
    ],
    ids=["fuzz", "renames"],
)
def test_refresh_refuses_a_series_whose_apply_settings_alone_changed(tmp_path, old, new):
    series, build, cli, _, _ = make_loop(tmp_path)
    toml = series / "series.toml"
    edited = build / "baked" / "vllm" / "a.py"
    edited.write_bytes(edited.read_bytes() + b"# an edit refresh would pick up\n")
    assert cli("refresh", "--dry-run").returncode == 0  # the same series: refresh may go
    before = {p.name: p.read_bytes() for p in series.iterdir()}
    assert old in toml.read_text()
    toml.write_text(toml.read_text().replace(old, new, 1))
    proc = cli("refresh", "--yes")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "changed: the series' apply settings (renames, strip, fuzz)" in proc.stderr
    assert "error: the series changed after" in proc.stderr
    after = {p.name: p.read_bytes() for p in series.iterdir()}
    assert after == {**before, "series.toml": toml.read_bytes()}  # no patch rewritten
