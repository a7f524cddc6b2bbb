"""Golden --dry-run plans (command, env, gates) for the SM120 and multi-node profiles.

The plans are rendered by the function ``run.sh start --dry-run`` prints with,
so the goldens are what a user sees; one test runs the real run.sh once and
compares its stdout. The goldens are edited by hand, never written by the code
they check; ``test_goldens_follow_the_profile_files`` reads each golden against
its profile file with tomllib alone, so a golden cannot drift from the profile.
"""

from __future__ import annotations

import json
import tomllib

import pytest
from _launch_support import DATA, PROFILES, PYTHON, REPO, SERIES, run_sh

from bakery.launch.gates import load_gate_table
from bakery.launch.plan import make_plan, render_plan
from bakery.launch.profiles import load_profile, override

# (golden name, profile, flag overrides): every shipped SM120 profile plus the
# flag paths a user takes (stage 9 gather by flags, the two nodes of a 2-node run).
CASES = [
    ("dsv41-sm120-tp2-dcp1", "dsv41-sm120-tp2-dcp1", {}),
    ("dsv41-sm120-tp2-dcp2", "dsv41-sm120-tp2-dcp2", {}),
    ("dsv41-sm120-tp4-dcp4", "dsv41-sm120-tp4-dcp4", {}),
    ("dsv41-sm120-tp2-dcp2-agrs", "dsv41-sm120-tp2-dcp2-agrs", {}),
    ("dsv41-sm120-tp2-dcp2-s9gather", "dsv41-sm120-tp2-dcp2-s9gather", {}),
    (
        "flags-tp2-dcp2-s9-gather-timing-agrs",
        "dsv41-sm120-tp2-dcp2",
        {"stage": 9, "prefill_gather": True, "timing": True, "combine": "ag_rs", "port": 8100},
    ),
    ("2node-tp4-dcp4-node0", "dsv41-sm120-2node-tp4-dcp4", {}),
    (
        "2node-tp4-dcp4-node1",
        "dsv41-sm120-2node-tp4-dcp4",
        {"node_rank": 1, "headless": True, "model": "/models/DeepSeek-V4.1"},
    ),
    ("ray-tp4-dcp2", "dsv41-sm120-tp4-dcp4", {"backend": "ray", "dcp": 2}),
    ("cpu-tiny", "cpu-tiny", {}),
]


def plan_for(profile: str, flags: dict):
    table = load_gate_table(SERIES)
    resolved = override(load_profile(profile, PROFILES, table), **flags)
    base_tree = "baked" if resolved.base == "default" else f"baked-{resolved.base}"
    return make_plan(
        resolved,
        python=PYTHON,
        tree=REPO / "build" / base_tree,
        root=REPO,
        artifacts=REPO / "artifacts" / "dcp2",
    )


@pytest.fixture(autouse=True)
def _no_inherited_pythonpath(monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)


@pytest.mark.parametrize(("golden", "profile", "flags"), CASES, ids=[c[0] for c in CASES])
def test_dry_run_plan_matches_golden(golden, profile, flags):
    rendered = render_plan(plan_for(profile, flags))
    path = DATA / f"{golden}.json"
    assert rendered == json.loads(path.read_text()), f"plan changed: {path}"


def test_goldens_have_command_env_and_gates():
    for golden, _, _ in CASES:
        data = json.loads((DATA / f"{golden}.json").read_text())
        assert data["command"][1:3] in (
            ["-m", "vllm.entrypoints.openai.api_server"],
            ["-m", "vllm.entrypoints.cli.main"],
        )
        assert set(data["gates"]) == {
            "DSV41_DCP_STAGE",
            "DSV41_DCP_COMBINE",
            "DSV41_DCP_PREFILL_GATHER",
            "DSV41_DCP_TIMING",
        }
        assert data["env"]["PYTHONPATH"].startswith("build/baked")


def _flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


@pytest.mark.parametrize(("golden", "profile", "flags"), CASES, ids=[c[0] for c in CASES])
def test_goldens_follow_the_profile_files(golden, profile, flags):
    """Each golden against its profile TOML (tomllib, not the launcher) plus the case's flags."""
    data = tomllib.loads((PROFILES / f"{profile}.toml").read_text())
    shown = json.loads((DATA / f"{golden}.json").read_text())
    command, gates = shown["command"], shown["gates"]
    par, nodes, g = data["parallel"], data.get("nodes", {}), data.get("gates", {})
    assert _flag(command, "--tensor-parallel-size") == str(flags.get("tp", par["tp"]))
    assert _flag(command, "--pipeline-parallel-size") == str(par["pp"])
    assert _flag(command, "--decode-context-parallel-size") == str(flags.get("dcp", par["dcp"]))
    if not flags.get("headless"):
        assert _flag(command, "--port") == str(flags.get("port", data["port"]))
        assert _flag(command, "--model") == data["model"]
    assert command[-len(data["vllm"]["args"]) :] == data["vllm"]["args"]
    assert gates["DSV41_DCP_STAGE"] == str(flags.get("stage", g.get("stage", 3)))
    assert gates["DSV41_DCP_COMBINE"] == flags.get("combine", g.get("combine", "ag_rs"))
    if flags.get("dcp", par["dcp"]) > 1:  # the combine is vLLM's own flag too
        assert _flag(command, "--dcp-comm-backend") == gates["DSV41_DCP_COMBINE"]
    else:
        assert "--dcp-comm-backend" not in command
    gather = flags.get("prefill_gather", g.get("prefill_gather", False))
    assert gates["DSV41_DCP_PREFILL_GATHER"] == ("1" if gather else "0")
    for key, value in data.get("env", {}).items():
        assert shown["env"][key] == value
    if nodes.get("nnodes", 1) > 1 and flags.get("backend") != "ray":
        assert _flag(command, "--nnodes") == str(nodes["nnodes"])
        assert _flag(command, "--node-rank") == str(flags.get("node_rank", nodes["node_rank"]))


def test_sm120_profiles_use_the_sm120_backend_and_kv_dtype():
    for path in sorted(PROFILES.glob("dsv41-sm120-*.toml")):
        command = render_plan(plan_for(path.stem, {}))["command"]
        joined = " ".join(command)
        assert "--attention-backend FLASHINFER_MLA_SPARSE_DSV41" in joined, path.name
        assert "--kv-cache-dtype fp8_ds_mla" in joined, path.name


def test_flags_override_the_profile():
    data = render_plan(plan_for("dsv41-sm120-tp2-dcp2", {"stage": 9, "prefill_gather": True}))
    assert data["gates"]["DSV41_DCP_STAGE"] == "9"
    assert data["gates"]["DSV41_DCP_PREFILL_GATHER"] == "1"


def test_worker_node_runs_vllm_serve_headless_with_the_native_flags():
    cmd = render_plan(plan_for("dsv41-sm120-2node-tp4-dcp4", {"node_rank": 1, "headless": True}))[
        "command"
    ]
    assert cmd[1:5] == ["-m", "vllm.entrypoints.cli.main", "serve", "deepseek-ai/DeepSeek-V4.1"]
    assert "--headless" in cmd and "--port" not in cmd
    joined = " ".join(cmd)
    assert "--nnodes 2 --node-rank 1 --master-addr 10.0.0.1 --master-port 29501" in joined


@pytest.mark.slow
def test_run_sh_dry_run_prints_the_golden(tmp_path):
    """The real door: run.sh --dry-run prints exactly the golden plan on stdout.

    On a machine without SM120 GPUs and a fresh default bake the preflight
    refuses (exit 3, environment problems only); the plan is printed either way.
    """
    out = run_sh(
        "start",
        "--profile",
        "dsv41-sm120-tp2-dcp2",
        "--dry-run",
        "--json",
        "--python",
        str(PYTHON),
        env={"PYTHONPATH": ""},
        cwd=tmp_path,
    )
    assert out.returncode in (0, 3), out.stderr
    shown = json.loads(out.stdout)
    assert shown == json.loads((DATA / "dsv41-sm120-tp2-dcp2.json").read_text())
    assert "Traceback" not in out.stderr
    if out.returncode == 3:
        assert "preflight refused the launch" in out.stderr
        config_refusals = ("DCP > 1 cannot", "TP not divisible", "needs a higher stage")
        assert not any(c in out.stderr for c in config_refusals), out.stderr
