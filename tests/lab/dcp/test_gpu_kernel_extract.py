"""lab/dcp/baked_kernels.py and tools/gpu_triton_kernels.py on CPU: the ast extraction, the
namespace, the loud failures.

The kernels themselves run on the GPU (docs/gpu-dcp.md); here Triton only builds the
JIT functions, and one slow test runs a few cases under Triton's CPU interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from lab.dcp import baked_kernels as bk
from lab.dcp import reference as ref

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.needs("triton")  # fails under CI=true when missing


from lab.gpu import triton_kernels as gtk  # noqa: E402

SYNTHETIC = textwrap.dedent(
    '''\
    import math

    from vllm.logger import init_logger
    from vllm.triton_utils import tl, triton
    from vllm.utils.math_utils import cdiv

    logger = init_logger(__name__)
    SCALE = 2


    def _helper(x):
        return x * SCALE


    def root(x):
        """Reaches _helper and SCALE, not unused()."""
        return _helper(x) + math.floor(0.5)


    def uses_logger():
        logger.info("x")


    def uses_cdiv():
        return cdiv(3, 2)


    def unused():
        return 0


    @triton.jit
    def add_kernel(x_ptr, N: tl.constexpr):
        offs = tl.arange(0, N)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs) + 1)
    '''
)


@pytest.fixture
def synthetic(tmp_path) -> Path:
    path = tmp_path / "mod.py"
    path.write_text(SYNTHETIC)
    return path


def test_closure_picks_reached_definitions_in_file_order(synthetic):
    ex = bk.extract(synthetic, ["root"])
    assert ex.names() == ["SCALE", "_helper", "root"]
    assert set(ex.vllm_names) == {"init_logger", "tl", "triton", "cdiv"}
    assert ex.referenced_vllm() == set()


def test_segment_is_the_exact_file_slice(synthetic):
    ex = bk.extract(synthetic, ["root", "add_kernel"])
    text = synthetic.read_text()
    for node in ex.nodes:
        seg = ex.segment(node)
        assert seg in text
        assert seg.splitlines()[-1] == text.splitlines()[node.end_lineno - 1]
    kernel = ex.segment(ex.nodes[-1])
    assert kernel.startswith("@triton.jit\ndef add_kernel(")


def test_missing_name_raises_a_clear_error(synthetic):
    with pytest.raises(bk.ExtractError, match=r"mod\.py: no top-level definition of nope"):
        bk.extract(synthetic, ["root", "nope"])


def test_namespace_runs_baked_code_and_unbound_vllm_names_fail_loudly(synthetic):
    ex = bk.extract(synthetic, ["root", "uses_cdiv", "add_kernel"])
    ns = bk.build_namespace(ex, bk.standins())
    assert ns["root"](3) == 6
    assert ns["root"].__code__.co_filename == str(synthetic)
    with pytest.raises(RuntimeError, match="vllm.utils.math_utils.cdiv is not available"):
        ns["uses_cdiv"]()
    assert bk.verify_verbatim(ex, ns) == {"add_kernel": True}


def test_module_level_use_of_vllm_fails_at_build(synthetic):
    ex = bk.extract(synthetic, ["uses_logger"])
    assert ex.names() == ["logger", "uses_logger"]
    with pytest.raises(RuntimeError, match="vllm.logger.init_logger is not available"):
        bk.build_namespace(ex, bk.standins())


def test_interpreted_kernel_relaunches_with_the_launchers_arity(synthetic):
    """Under TRITON_INTERPRET=1 ``kernel[grid](...)`` returns a compiled-kernel handle, as
    on a GPU: relaunching it takes every argument (the constexpr too), and fewer raise."""
    script = textwrap.dedent(
        f"""
        import torch
        from pathlib import Path
        from lab.dcp import baked_kernels as bk
        ns, _ = bk.load_file(Path({str(synthetic.parent)!r}), "mod.py", ["add_kernel"])
        x = torch.zeros(4)
        handle = ns["add_kernel"][(1,)](x, N=4)
        handle[(1,)](x, 4)
        assert x.tolist() == [2.0] * 4, x
        try:
            handle[(1,)](x)
        except TypeError as exc:
            assert "takes 2 kernel arguments" in str(exc), exc
        else:
            raise AssertionError("relaunch without the constexpr slot passed")
        """
    )
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_verbatim_check_catches_a_kernel_that_is_not_the_file(synthetic):
    ex = bk.extract(synthetic, ["add_kernel"])
    ns = bk.build_namespace(ex, bk.standins())
    ex.text = ex.text.replace("+ 1)", "+ 2)")  # the file as the check reads it differs
    assert bk.verify_verbatim(ex, ns) == {"add_kernel": False}


def test_filter_comparison_flags_a_wrong_row():
    gen = torch.Generator().manual_seed(0)
    layout = ref.ShardLayout(2, 2, 16)
    ids = gtk.filter_rows(gen, layout, 64, 4)
    assert (ids == -1).all(dim=1).any(), "an all -1 row"
    owners = ref.owner_rank(ids.long().clamp_min(0), 2, 2)
    single = [(owners[t][ids[t] >= 0] == 0).all() for t in range(ids.shape[0])]
    assert any(single), "a row owned by rank 0 alone"
    token_to_req = torch.zeros(ids.shape[0], dtype=torch.int32)
    table = torch.arange(8, dtype=torch.int32).reshape(1, 8)
    out, counts = ref.filter_and_convert(ids, token_to_req, table, layout, 0)
    assert gtk._compare_filter(out, counts, out, counts)["bad_rows"] == []
    bad = out.clone()
    bad[0, 0] += 1
    assert gtk._compare_filter(bad, counts, out, counts)["bad_rows"] == [0]


def test_error_measure_requires_matching_infinities():
    ref_lse = torch.tensor([1.0, -float("inf"), ref.EMPTY_LSE])
    assert gtk._err(ref_lse.clone(), ref_lse, gtk.LSE_TOL) == (0.0, True)
    shifted = ref_lse.clone()
    shifted[1] = ref.EMPTY_LSE
    assert not gtk._err(shifted, ref_lse, gtk.LSE_TOL)[1]


def test_main_exits_nonzero_on_mismatch(monkeypatch, tmp_path):
    fake = {
        "environment": {"utc": "now", "torch": "t", "triton": "t"},
        "baked": "b",
        "ok": False,
        "loaded": {},
        "filter": [],
        "combine": [],
    }
    monkeypatch.setattr(gtk, "run", lambda baked, device: fake)
    assert gtk.main(["b", "--out", str(tmp_path)]) == 1
    assert (tmp_path / "gpu_triton_kernels.json").is_file()


@pytest.mark.slow
def test_baked_kernels_extract_verbatim(cpu_bake):
    loaded = gtk.load(cpu_bake.tree)
    sparse = loaded.report[gtk.SPARSE_UTILS]
    assert "triton_filter_and_convert_dcp_index" in sparse["definitions"]
    assert sparse["kernels_verbatim"] == {
        "ConvertReqIndexToGlobalIndexKernel.sparse_mla_index_remap_kernel": True
    }
    dcp = loaded.report[gtk.DCP_OPS]
    assert set(dcp["kernels_verbatim"]) == {
        "CorrectAttnCPOutKernel.kernel",
        "_dcp_a2a_pack_send_kernel",
        "_dcp_a2a_unpack_combine_kernel",
    }
    assert all(dcp["kernels_verbatim"].values())
    # The launch path needs no vLLM name beyond the stand-ins.
    assert {"get_dcp_group", "dbo_current_ubatch_id"}.isdisjoint(dcp["unavailable"])


@pytest.mark.slow
def test_baked_kernels_match_reference_under_triton_interpreter(cpu_bake):
    """A few cases on CPU through TRITON_INTERPRET=1 (the whole suite takes ~9 min)."""
    script = textwrap.dedent(
        f"""
        import sys, torch
        sys.path.insert(0, {str(REPO)!r})
        from lab.gpu import triton_kernels as g
        from pathlib import Path
        loaded = g.load(Path({str(cpu_bake.tree)!r}))
        cpu = torch.device("cpu")
        assert g.check_filter(loaded.sparse, cpu, 2, 2, 16, 64, seed=0)["ok"]
        for flavour, masked in (("ag_rs", False), ("a2a", True)):
            res = g.check_combine(loaded.dcp, cpu, flavour, 2, 8, 2, torch.float32, masked, 0)
            assert res["ok"], res
        """
    )
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
