"""The served model's ``config.json``: found, read, and what it asks of the series.

Where it is found: a local model folder (``--model DIR``), or, for a hub id
(``org/name``), the local Hugging Face cache when the model is there, in the
layout ``huggingface_hub`` writes: ``$HF_HUB_CACHE`` (else ``$HF_HOME/hub``, else
``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``) /
``models--org--name/snapshots/<revision>/config.json``, the revision from
``--revision`` or ``refs/main``. The environment is the serving one (the
profile's ``[env]`` may set ``HF_HOME``). Nothing is downloaded; a hub id that
is not cached is a note, not a refusal.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from bakery import project
from bakery.launch.errors import Problem

__all__ = ["ModelConfig", "find_config", "hub_cache", "text_config", "candidate_blocks"]

_REVISION_FILE = "refs/{revision}"
MAX_CONFIG_BYTES = 16 << 20
_SAFE_REVISION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class ModelConfig:
    """The config found (None: none to check), problems reading it, and notes."""

    config: dict | None
    path: Path | None
    problems: tuple[Problem, ...] = ()
    notes: tuple[str, ...] = ()


def hub_cache(env: dict[str, str]) -> Path:
    """The hub cache folder ``huggingface_hub`` uses under ``env``."""
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    xdg = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME", "~")) / ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def _cached_config(repo_id: str, revision: str | None, env: dict[str, str]) -> Path | None:
    """``config.json`` of ``repo_id`` at ``revision`` in the local hub cache, if there."""
    folder = hub_cache(env) / ("models--" + repo_id.replace("/", "--"))
    revision = revision or "main"
    if not _SAFE_REVISION.fullmatch(revision):
        return None  # not a name the cache layout can hold; vLLM's own check speaks
    ref = folder / _REVISION_FILE.format(revision=revision)
    try:
        if ref.is_file() and ref.stat().st_size < 1024:
            revision = ref.read_bytes().decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not _SAFE_REVISION.fullmatch(revision):
        return None
    path = folder / "snapshots" / revision / "config.json"
    try:
        return path if path.is_file() else None
    except OSError:
        return None


def _looks_like_hub_id(model: str, cwd: Path) -> bool:
    """``name`` or ``org/name``, and not a path into a folder that exists here."""
    parts = model.split("/")
    if not 1 <= len(parts) <= 2 or not all(parts) or model.startswith((".", "~", "/")):
        return False
    return len(parts) == 1 or _kind(cwd / parts[0]) != "dir"


def _read(path: Path) -> ModelConfig:
    try:
        with open(path, "rb") as handle:  # bounded: a config.json is kilobytes
            raw = handle.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ValueError(f"larger than {MAX_CONFIG_BYTES} bytes")
        config = json.loads(raw)
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        problem = Problem(
            "model config unreadable",
            getattr(exc, "strerror", None) or str(exc),
            str(path),
            "point --model at a Hugging Face model folder",
        )
        return ModelConfig(None, path, (problem,))
    if not isinstance(config, dict):
        problem = Problem(
            "model config unreadable",
            "config.json is not a JSON object",
            str(path),
            "point --model at a Hugging Face model folder",
        )
        return ModelConfig(None, path, (problem,))
    return ModelConfig(config, path, notes=(f"model config: {path}",))


def _kind(path: Path) -> str | None:
    """ "dir", "other" or None (absent); a path the OS refuses outright is absent."""
    try:
        return "dir" if path.is_dir() else "other" if path.exists() else None
    except (OSError, ValueError):  # a name too long, a NUL byte
        return None


def find_config(model: str, cwd: Path, env: dict[str, str], revision: str | None) -> ModelConfig:
    """Find and read the model's config.json (a folder, or a cached hub id)."""
    path = Path(model) if Path(model).is_absolute() else cwd / model
    kind = _kind(path)
    if kind == "dir":
        return _read(path / "config.json")
    # a tiny test model's folder, not yet built, is no hub id though it reads as one
    tiny = next((c for d, c in project.TINY_MODELS.items() if path == cwd / d), None)
    if kind is None and tiny is None and _looks_like_hub_id(model, cwd):
        cached = _cached_config(model, revision, env)
        if cached is not None:
            return _read(cached)
        where = hub_cache(env)
        return ModelConfig(
            None,
            None,
            notes=(f"model {model!r}: a hub id not in the local cache {where}; not checked",),
        )
    problem = Problem(
        "model folder missing",
        "the path does not exist" if kind is None else "not a folder",
        model,
        f"build it: {tiny}" if tiny else "build or copy the model there, or pass --model",
    )
    return ModelConfig(None, None, (problem,))


def text_config(config: dict) -> dict:
    """The language model's settings (multimodal checkpoints nest them in text_config)."""
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def candidate_blocks(config: dict) -> int | None:
    """The candidate source layer when two-level candidate filtering is in use, else None."""
    layer = text_config(config).get("candidate_source_layer_id", -1)
    if isinstance(layer, bool) or not isinstance(layer, int):
        return None
    return layer if layer >= 0 else None
