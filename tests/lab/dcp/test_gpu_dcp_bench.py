"""tools/gpu_dcp_bench.py on CPU: vLLM's collective layout and the failure gate.

The real-combine timing runs on the GPU (docs/gpu-dcp.md); its CPU dry run under the
Triton interpreter takes minutes, so here only the pieces that decide whether a GPU run
means anything: ``CollectiveGroup`` must hand the baked combine the layout vLLM's
``GroupCoordinator`` does, and a failed parity or a non-verbatim kernel must fail the run.
"""

from __future__ import annotations

import sys

import pytest
import torch
import torch.distributed as dist
from _dcp_child import fork_ranks, rank_file

from lab.dcp import reference as ref
from lab.gpu import dcp_bench as bench


def _rank(rank: int, store: str, outdir: str) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
    try:
        x = torch.arange(2 * 6 * 3, dtype=torch.float32).reshape(2, 6, 3) * (rank + 1)
        mine, theirs = bench.CollectiveGroup(), ref.TorchGroup()
        res = {
            "gather_dim1": (mine.all_gather(x, dim=1), theirs.all_gather(x, dim=1)),
            "gather_dim0": (mine.all_gather(x, dim=0), theirs.all_gather(x, dim=0)),
            "scatter_dim1": (mine.reduce_scatter(x, dim=1), theirs.reduce_scatter(x, dim=1)),
            "a2a": (mine.all_to_all(x), theirs.all_to_all(x)),
        }
        torch.save(res, rank_file(outdir, rank))
    finally:
        dist.destroy_process_group()


def test_collective_group_has_the_reference_layout():
    for r, results in enumerate(fork_ranks(_rank, 2, 120)):
        for name, (mine, theirs) in results.items():
            assert torch.equal(mine, theirs), f"rank {r}: {name}"


def _result(parity_ok: bool = True, verbatim: bool = True) -> dict:
    flavour = {"parity": True}
    return {
        "parity": [{"passed": True}],
        "kernels": {"kernels_verbatim": {"CorrectAttnCPOutKernel.kernel": verbatim}},
        "kernel_bench": [
            {"tokens": 8, "gathered_heads": 32, "ag_rs": flavour, "a2a": {"parity": parity_ok}}
        ],
    }


def test_failures_gate_the_exit_status():
    assert bench.failures(_result()) == []
    assert bench.failures(_result(parity_ok=False)) == ["kernel a2a T=8 H=32"]
    assert bench.failures(_result(verbatim=False)) == [
        "kernel CorrectAttnCPOutKernel.kernel is not the baked file's"
    ]
    assert bench.failures({"parity": [{"passed": False}]})  # the reference parity too


def test_dry_run_needs_the_baked_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["gpu_dcp_bench.py", "--baked", str(tmp_path)])
    with pytest.raises(SystemExit) as exc:
        bench.main()
    assert exc.value.code == 2
    assert "carry the baked file" in capsys.readouterr().err
