"""Preflight at its edges: every gate at exactly its minimum stage and one below, every
shipped profile clean at its own stage, GPUs picked by CUDA_VISIBLE_DEVICES index, and a
canned probe answer for every branch the real probe can take.

The pure checks run through ``config_problems`` (no subprocess, no bake); the rest runs
the launcher in-process. The stage table is a copy of the series' with stage 4
implemented (``series_with_stage``), so the candidate-blocks gate has a minimum stage.
"""

from __future__ import annotations

import ast
import json
import os
import re
import tomllib

import msgspec
import pytest
from _launch_support import (
    DATA,
    PROFILES,
    PYTHON,
    REPO,
    SERIES,
    canned_probe,
    launch,
    series_with_stage,
    tiny_model_dir,
)

from bakery.cli.launch import launch as launch_group
from bakery.launch import checks, preflight
from bakery.launch.gates import CANDIDATES, FEATURES, PCP, SPECULATIVE, load_gate_table
from bakery.launch.host import ProbeArgs
from bakery.launch.plan import make_plan
from bakery.launch.profiles import load_profile, override, profile_names
from bakery.launch.vllm_args import VllmArgs

HEADS = (8, 16, 32, 64, 128)  # _SPARSE_MLA_SUPPORTED_Q_HEADS (test_launch_preflight reads it)
REAL_CONFIG = json.loads((DATA / "dsv41-config.json").read_text())


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return load_gate_table(
        series_with_stage(tmp_path_factory.mktemp("s") / "dcp2", 4, "implemented")
    )


def plan_of(table, profile="dsv41-sm120-tp2-dcp2", vllm_args=(), **flags):
    resolved = override(load_profile(profile, PROFILES, table), vllm_args=vllm_args, **flags)
    return make_plan(
        resolved, python=PYTHON, tree=REPO / "build" / "baked", root=REPO, artifacts=REPO / "a"
    )


def problems(table, plan, config=REAL_CONFIG, env=None, monkeypatch=None):
    return [str(p) for p in preflight.config_problems(plan, table, HEADS, config)]


# ---- every shipped profile at its own stage ----------------------------------------------


@pytest.mark.parametrize("name", profile_names(PROFILES))
def test_every_shipped_profile_passes_config_problems_at_its_own_stage(table, name):
    plan = plan_of(table, name)
    config = REAL_CONFIG if name.startswith("dsv41-") else None
    assert problems(table, plan, config) == [], name


# ---- every gate at its minimum stage and one below ---------------------------------------


def _non_default(gate) -> str:
    return "5" if gate.number else next(v for v in gate.values if v != gate.default)


# The gates the launcher sets from its own flags (the caller's value is overridden).
LAUNCHER_FLAGS = {
    "DSV41_DCP_COMBINE": {"combine": "a2a"},
    "DSV41_DCP_PREFILL_GATHER": {"prefill_gather": True},
    "DSV41_DCP_TIMING": {"timing": True},
}


def env_gates(table):
    return [(name, g) for name, g in table.env.items() if name != table.stage_env]


def test_every_env_gate_at_its_minimum_stage_and_one_below(table, monkeypatch):
    for name in [n for n in os.environ if n.startswith("DSV41_")]:
        monkeypatch.delenv(name)
    gates = env_gates(table)
    assert {name for name, _ in gates} >= {"DSV41_DCP_PREFILL_GATHER", "DSV41_PREFILL_TIMING_LOG_S"}
    for name, gate in gates:
        value = _non_default(gate)
        flags = LAUNCHER_FLAGS.get(name, {})
        with monkeypatch.context() as m:
            if not flags:
                m.setenv(name, value)  # read from the caller's environment
            at_min = plan_of(table, stage=gate.min_stage, **flags)
            below = plan_of(table, stage=gate.min_stage - 1, **flags)
            needs = f"{name}={value} needs a higher stage (it is read from stage "
            assert not [p for p in problems(table, at_min) if p.startswith(needs)], name
            if gate.min_stage > table.stage_min:
                assert [p for p in problems(table, below) if p.startswith(needs)], name


def test_dcp_at_its_minimum_stage_and_one_below(table):
    config = {**REAL_CONFIG, "text_config": {**REAL_CONFIG["text_config"]}}
    config["text_config"]["candidate_source_layer_id"] = -1  # only the DCP gate speaks
    default = table.env["DSV41_DCP_COMBINE"].default  # the profile's a2a has a gate of its own
    at_min = plan_of(table, stage=table.dcp_min_stage, combine=default)
    below = plan_of(table, stage=table.dcp_min_stage - 1, combine=default)
    assert problems(table, at_min, config) == []
    assert problems(table, below, config) == [
        f"DCP > 1 cannot serve at this stage (stages below {table.dcp_min_stage} stop after the "
        f"KV-cache config): --dcp 2 --stage {table.dcp_min_stage - 1}"
    ]


FEATURE_ARGS = {
    CANDIDATES: (),
    SPECULATIVE: ("--speculative-config", '{"method": "dspark"}'),
    PCP: ("-pcp", "2"),
}


@pytest.mark.parametrize("feature", FEATURES)
def test_every_feature_at_its_minimum_stage_and_one_below(tmp_path, feature):
    """Each feature's stage marked implemented: served at exactly it, refused one below."""
    own = load_gate_table(series_with_stage(tmp_path / "dcp2", 4, "implemented"))
    number = own.feature(feature).number
    table = load_gate_table(
        series_with_stage(tmp_path / "x", number, "implemented", (4, "implemented"))
    )
    args = FEATURE_ARGS[feature]
    at_min = problems(table, plan_of(table, stage=number, vllm_args=args))
    below = problems(table, plan_of(table, stage=number - 1, vllm_args=args))
    served = f"(stage {number} ({feature}) serves it; --stage {number - 1} does not)"
    assert not [p for p in at_min if "serves it" in p], at_min
    assert [p for p in below if served in p], below


# ---- GPUs ----------------------------------------------------------------------------------

MIXED = (
    "0, NVIDIA H100 80GB HBM3, 81559, 9.0, 580.82\n"
    "1, NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 97887, 12.0, 580.82\n"
    "2, NVIDIA RTX PRO 6000 Blackwell Workstation Edition, 97887, 12.0, 580.82"
)


@pytest.fixture
def env(monkeypatch, tmp_path, cpu_bake):
    monkeypatch.setattr(preflight, "run_probe", canned_probe())
    monkeypatch.delenv("PYTHONPATH", raising=False)
    for name in [n for n in os.environ if n.startswith(("DSV41_", "CUDA_"))]:
        monkeypatch.delenv(name)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\nprintf '%s\\n' '{MIXED}'\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    series = series_with_stage(tmp_path / "dcp2", 4, "implemented")
    return {
        "model": tiny_model_dir(tmp_path / "tiny"),
        "build": cpu_bake.tree.parent,
        "art": tmp_path / "art",
        "series": series,
    }


def gpu_problems(found):
    tree = ("baked tree missing", "cannot read the supported")
    return [p for p in found if not p.startswith(tree)]


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        ("1,2", []),  # the two SM120 GPUs, picked by index
        ("2,1", []),
        (
            "0,1",
            [
                "not an SM120 GPU (the profile runs the SM120 sparse MLA path): NVIDIA H100 80GB "
                "HBM3 (compute capability 9.0)"
            ],
        ),
        ("2", ["fewer visible GPUs than TP x PP (TP x PP needs 2 on this node): 1 visible"]),
        ("", ["fewer visible GPUs than TP x PP (TP x PP needs 2 on this node): 0 visible"]),
    ],
)
def test_cuda_visible_devices_picks_gpus_by_index(capsys, env, monkeypatch, visible, expected):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    _, found, _ = launch(
        capsys, env, "--dry-run", "--base", "default", profile="dsv41-sm120-tp2-dcp1"
    )
    assert gpu_problems(found) == expected


@pytest.mark.parametrize(
    ("visible", "stopped", "count"), [("1,5,2", "5", 1), ("7", "7", 0), ("1,1,2", "1", 1)]
)
def test_cuda_visible_devices_index_out_of_range(capsys, env, monkeypatch, visible, stopped, count):
    """CUDA stops at the first entry that names no GPU: "1,5,2" shows GPU 1 only."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    _, found, _ = launch(
        capsys, env, "--dry-run", "--base", "default", profile="dsv41-sm120-tp2-dcp1"
    )
    assert gpu_problems(found) == [
        f"CUDA_VISIBLE_DEVICES names a GPU this node does not have (CUDA hides entry "
        f"{stopped!r} and every one after it; GPUs here: 0, 1, 2): CUDA_VISIBLE_DEVICES={visible}",
        f"fewer visible GPUs than TP x PP (TP x PP needs 2 on this node): {count} visible",
    ]


# ---- canned probes: every branch ------------------------------------------------------------


def answer(plan, **replace):
    return msgspec.structs.replace(canned_probe()(plan), **replace)


BRANCHES = [
    (
        lambda plan: answer(plan, import_error="ImportError: libcudart.so.13: cannot open"),
        "vllm does not import (ImportError: libcudart.so.13: cannot open): {python}",
    ),
    (
        lambda plan: answer(
            plan, args=ProbeArgs(ok=False, stage="args", error="error: unrecognized arguments: --x")
        ),
        "vLLM refused the arguments (checked against the baked tree's own parser): "
        "error: unrecognized arguments: --x",
    ),
    (
        lambda plan: answer(
            plan, args=ProbeArgs(ok=False, stage="parser", error="RuntimeError: no device")
        ),
        "cannot build the pinned vLLM's argument parser (RuntimeError: no device): {python}",
    ),
    (
        lambda plan: answer(plan, vllm_file="/usr/lib/python3/site-packages/vllm/__init__.py"),
        "vLLM would not come from the baked tree (the serving Python imports vllm from "
        "/usr/lib/python3/site-packages/vllm): {tree}",
    ),
]


def _raise(plan):
    raise OSError("the probe exited 1: Segmentation fault")


BRANCHES.append(
    (_raise, "cannot run the serving Python (the probe exited 1: Segmentation fault): {python}")
)


@pytest.mark.parametrize(
    ("probe", "expected"), BRANCHES, ids=["import", "args", "parser", "site", "crash"]
)
def test_every_probe_branch_is_one_problem(capsys, env, monkeypatch, probe, expected):
    monkeypatch.setattr(preflight, "run_probe", probe)
    code, found, _ = launch(capsys, env, "--dry-run", "--base", "cpu", profile="cpu-tiny")
    assert code == 3
    tree = env["build"] / "baked-cpu"
    assert found == [expected.format(python=PYTHON, tree=tree)]


def test_ray_backend_without_ray_installed(capsys, env):
    code, found, _ = launch(
        capsys,
        env,
        "--dry-run",
        "--base",
        "cpu",
        "--distributed-executor-backend",
        "ray",
        profile="cpu-tiny",
    )
    assert found == [f"ray is not installed (the Ray backend needs it): {PYTHON}"]


def test_ray_backend_with_ray_installed(capsys, env, monkeypatch):
    monkeypatch.setattr(preflight, "run_probe", lambda plan: answer(plan, ray=True))
    code, found, _ = launch(
        capsys,
        env,
        "--dry-run",
        "--base",
        "cpu",
        "--distributed-executor-backend",
        "ray",
        profile="cpu-tiny",
    )
    assert code == 0, found


# ---- hints name real options ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("tensor_parallel_size", 4),
        ("pipeline_parallel_size", 2),
        ("decode_context_parallel_size", 2),
    ],
)
def test_contradiction_hints_name_a_real_start_option(table, key, value):
    plan = plan_of(table, "cpu-tiny")
    (problem,) = checks._contradictions(plan, VllmArgs(**{key: value}))
    flag = problem.hint.split("set it with ")[1].split(",")[0]
    start = launch_group.commands["start"]
    assert flag in {o for p in start.params for o in getattr(p, "opts", [])}, problem.hint


# ---- the [env] table against what the patches read ------------------------------------------

_READ = re.compile(r"""(?:environ\.get|getenv|environ\[)\(?\s*["'](DSV41_[A-Z0-9_]+)["']""")


def test_env_table_lists_exactly_what_the_patches_read():
    """Every DSV41_* variable an added line of a patch reads is in stages.toml [env] with that
    patch in read_by, and every read_by is true (read with a regex over the diffs, not the
    launcher's table code)."""
    read = {}
    for diff in sorted(SERIES.glob("*.diff")):
        added = [ln[1:] for ln in diff.read_text().splitlines() if ln.startswith("+")]
        for name in _READ.findall("\n".join(added)):
            read.setdefault(name, set()).add(diff.name)
    table = tomllib.loads((SERIES / "stages.toml").read_text())["env"]
    assert "DSV41_PREFILL_TIMING_LOG_S" in read
    assert set(read) == set(table), (sorted(read), sorted(table))
    for name, patches in read.items():
        assert set(table[name]["read_by"]) == patches, name


# ---- every option a launcher hint names exists -----------------------------------------------

_FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def _strings(node, constants) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return [v.value for v in node.values if isinstance(v, ast.Constant)]
    if isinstance(node, ast.Name) and node.id in constants:
        return [constants[node.id]]
    if isinstance(node, ast.BinOp):
        return _strings(node.left, constants) + _strings(node.right, constants)
    return []


def _hints(path) -> list[str]:
    """The text of every hint in ``path``: Problem(what, why, value, hint), ``hint=``,
    and the ``way_out`` given to a feature refusal (read with ast, not by running it)."""
    tree = ast.parse(path.read_text())
    constants = {
        t.id: n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
        for t in n.targets
        if isinstance(t, ast.Name) and isinstance(n.value.value, str)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            if name in ("Problem", "refuse") and len(node.args) >= 4:
                found += _strings(node.args[3], constants)
            found += [
                s for k in node.keywords if k.arg == "hint" for s in _strings(k.value, constants)
            ]
        if isinstance(node, ast.Assign) and any(
            getattr(t, "id", "") in ("way_out", "hint") for t in node.targets
        ):
            found += _strings(node.value, constants)
    return found


def test_every_option_a_launcher_hint_names_exists(cpu_bake):
    """A hint names a run.sh option (of any launch command) or a flag vLLM 0.32.0 defines
    (its server's, or `vllm bench serve`'s, which the matrix's [bench] runs)."""
    options = {"--help"} | {
        opt for cmd in launch_group.commands.values() for p in cmd.params for opt in p.opts
    }
    vllm_source = "".join(
        (cpu_bake.tree / "vllm" / rel).read_text()
        for rel in (
            "engine/arg_utils.py",
            "entrypoints/launchers/cli_args.py",
            "benchmarks/serve.py",
        )
    )
    named = set()
    launcher = [*sorted((REPO / "bakery" / "launch").rglob("*.py")), REPO / "bakery/cli/launch.py"]
    for path in launcher:
        for hint in _hints(path):
            named |= set(_FLAG.findall(hint))
    assert {"--pp", "--stage", "--cp-kv-cache-interleave-size"} <= named, named
    # vLLM's bool fields are BooleanOptionalAction flags: "--x" in the source gives --no-x too
    unknown = [
        f
        for f in named
        if f not in options
        and f'"{f}"' not in vllm_source
        and not (f.startswith("--no-") and f'"--{f[5:]}"' in vllm_source)
    ]
    assert not unknown, unknown
