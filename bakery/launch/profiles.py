"""Launch profiles: ``launcher/dcp2/profiles/<name>.toml`` plus the flags that override them.

A profile names the base, the model, the parallel layout (TP, PP, DCP and the
multi-node shape), the DSV41 gates, extra env and extra vLLM args. Unknown keys
are refused (a typo must not silently fall back to a default). Gate defaults
come from the stage table, never from here. This module reads files and builds
values; it checks shapes and types only; what can run is ``preflight``'s job.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass
from pathlib import Path

from bakery.launch.errors import ProfileError
from bakery.launch.gates import COMBINE, GateTable

__all__ = ["Layout", "Gates", "Profile", "load_profile", "override", "profile_names"]

_TOP = {
    "description",
    "base",
    "model",
    "served_model_name",
    "host",
    "port",
    "startup_timeout_s",
    "gpu",
    "parallel",
    "nodes",
    "gates",
    "env",
    "vllm",
}
_PARALLEL = {"tp", "pp", "dcp"}
_NODES = {
    "nnodes",
    "node_rank",
    "gpus_per_node",
    "master_addr",
    "master_port",
    "headless",
    "backend",
}
_GATES = {"stage", "combine", "prefill_gather", "timing"}
_GPU_KINDS = ("sm120", "any", "none")
BACKENDS = ("mp", "ray")


@dataclass(frozen=True)
class Layout:
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
class Gates:
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
    layout: Layout
    gates: Gates
    env: tuple[tuple[str, str], ...]
    vllm_args: tuple[str, ...]


def profile_names(directory: Path) -> list[str]:
    return sorted(p.stem for p in Path(directory).glob("*.toml"))


def read_toml(path: Path, error: type[Exception]) -> dict:
    """A TOML file as a dict; unreadable, not UTF-8 or not TOML is one ``error``."""
    try:
        return tomllib.loads(Path(path).read_bytes().decode("utf-8"))
    except OSError as exc:
        raise error(f"{path}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path}: not valid TOML ({exc})") from None


def _port(value, name: str, where: str) -> int:
    if _typed(value, int, name, where) not in range(1, 65536):
        raise ProfileError(f"{where}: {name} must be 1..65535: {value!r}")
    return value


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


def _table(data: dict, key: str, allowed: set[str], where: str) -> dict:
    table = data.get(key, {})
    if not isinstance(table, dict):
        raise ProfileError(f"{where}: [{key}] must be a table: {table!r}")
    _no_unknown(table, allowed, f"{where} [{key}]")
    return table


def _no_unknown(table: dict, allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ProfileError(
            f"{where}: unknown key(s) (known: {', '.join(sorted(allowed))}): {unknown!r}",
            hint="fix the spelling; an unknown key would silently fall back to a default",
        )


def _typed(value, kind: type, name: str, where: str):
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise ProfileError(f"{where}: {name} must be {kind.__name__}: {value!r}")
    return value


def _layout(data: dict, where: str) -> Layout:
    par = _table(data, "parallel", _PARALLEL, where)
    nodes = _table(data, "nodes", _NODES, where)
    values = {k: _typed(v, int, k, where) for k, v in par.items()}
    for key, value in nodes.items():
        kind = {"master_addr": str, "backend": str, "headless": bool}.get(key, int)
        values[key] = _typed(value, kind, key, where)
    if "master_port" in values:
        _port(values["master_port"], "nodes.master_port", where)
    if values.get("backend", "mp") not in BACKENDS:
        raise ProfileError(f"{where}: nodes.backend must be one of {BACKENDS}: {values!r}")
    return Layout(**values)


def _timeout(value, where: str) -> float:
    if _typed(value, int, "startup_timeout_s", where) < 1:
        raise ProfileError(f"{where}: startup_timeout_s must be at least 1: {value!r}")
    return float(value)


def _gates(data: dict, table: GateTable, where: str) -> Gates:
    g = _table(data, "gates", _GATES, where)
    return Gates(
        stage=_typed(g.get("stage", table.stage_default), int, "stage", where),
        combine=_typed(g.get("combine", table.env[COMBINE].default), str, "combine", where),
        prefill_gather=_typed(g.get("prefill_gather", False), bool, "prefill_gather", where),
        timing=_typed(g.get("timing", False), bool, "timing", where),
    )


def _env(data: dict, where: str) -> tuple[tuple[str, str], ...]:
    env = data.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise ProfileError(f"{where}: [env] must map names to strings: {env!r}")
    return tuple(sorted(env.items()))


def _vllm_args(data: dict, where: str) -> tuple[str, ...]:
    table = _table(data, "vllm", {"args"}, where)
    args = table.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ProfileError(f"{where}: vllm.args must be a list of strings: {args!r}")
    return tuple(args)


def load_profile(ref: str, directory: Path, table: GateTable) -> Profile:
    path = _resolve_path(ref, directory)
    where = str(path)
    data = read_toml(path, ProfileError)
    _no_unknown(data, _TOP, where)
    for key in ("base", "model"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise ProfileError(f"{where}: {key} is required (a non-empty string)")
    gpu = data.get("gpu", "any")
    if gpu not in _GPU_KINDS:
        raise ProfileError(f"{where}: gpu must be one of {_GPU_KINDS}: {gpu!r}")
    return Profile(
        name=path.stem,
        source=path,
        description=_typed(data.get("description", ""), str, "description", where),
        base=data["base"],
        model=data["model"],
        served_model_name=_typed(data.get("served_model_name", path.stem), str, "name", where),
        host=_typed(data.get("host", "127.0.0.1"), str, "host", where),
        port=_port(data.get("port", 8000), "port", where),
        startup_timeout_s=_timeout(data.get("startup_timeout_s", 1800), where),
        gpu=gpu,
        layout=_layout(data, where),
        gates=_gates(data, table, where),
        env=_env(data, where),
        vllm_args=_vllm_args(data, where),
    )


def override(profile: Profile, **flags) -> Profile:
    """The profile with every flag that is not None applied (flags win over the file).

    Keys: the Profile fields (model, port, host, base, startup_timeout_s), the
    Layout fields and the Gates fields; ``vllm_args`` are appended, not replaced.
    """
    flags = {k: v for k, v in flags.items() if v is not None}
    layout = {k: flags.pop(k) for k in list(flags) if k in Layout.__dataclass_fields__}
    gates = {k: flags.pop(k) for k in list(flags) if k in Gates.__dataclass_fields__}
    extra = tuple(flags.pop("vllm_args", ()))
    unknown = set(flags) - set(Profile.__dataclass_fields__)
    if unknown:
        raise ValueError(f"not a profile field: {sorted(unknown)!r}")
    return dataclasses.replace(
        profile,
        layout=dataclasses.replace(profile.layout, **layout),
        gates=dataclasses.replace(profile.gates, **gates),
        vllm_args=profile.vllm_args + extra,
        **flags,
    )
