"""`bakery linkcheck` as the user runs it: exit codes and finding lines."""

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.slow
SEED = "09-models_deepseek_v41_nvidia_flashinfer_sparse.py.diff"


@pytest.mark.parametrize("base", ["default", "cpu"])
def test_full_series_has_no_findings(base):
    proc = run_cli("linkcheck", "--base", base)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_seed_alone_reports_the_seven_known_faults():
    proc = run_cli("linkcheck", "--base", "cpu", "--only", SEED)
    assert proc.returncode == 1
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 7 and all(line.startswith("models/deepseek_v41/") for line in lines)
    for name in (
        "dsv41_dcp_combine",  # patch 02's, since patch 09 reads --dcp-comm-backend
        "_PREFILL_TIMING",
        "_PrefillTimer",
        "prefill_acc_add",
        "self.dcp_world_size",
        "self.dcp_rank",
        "self.cp_kv_cache_interleave_size",
    ):
        assert sum(name in line for line in lines) == 1, name
    assert proc.stderr.startswith("error: 7 unresolved name(s)")
