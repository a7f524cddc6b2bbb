"""``bakery doctor`` / ``run.sh doctor``: can this host serve the series? No profile needed.

The launcher's host checks on their own: the GPUs and their driver
(``nvidia-smi``), the baked tree of the base (missing, stale, drifted), and
where ``vllm`` imports from in the serving Python, both with the baked tree
first on PYTHONPATH and without it (an installed patched wheel, found by its
BAKED.json). One line per check; exit 1 when the host cannot serve the base.
Nothing is written or started except the bounded probe.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bakery.bake.bake import staleness, tree_dir
from bakery.errors import BakeryError
from bakery.launch.host import ProbeAnswer, gpu_inventory, probe_python
from bakery.launch.installed import installed_problems
from bakery.launch.plan import SERVER_MODULE
from bakery.series.series import Series

__all__ = ["Check", "diagnose"]


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool | None  # None: information only
    detail: str
    fix: str = ""  # what to do about a FAIL

    def line(self) -> str:
        mark = {True: "ok", False: "FAIL", None: "info"}[self.ok]
        fix = f"\n     fix: {self.fix}" if self.ok is False and self.fix else ""
        return f"{mark:<4} {self.name}: {self.detail}{fix}"


# The cpu base serves small test models only: never the way out for DeepSeek-V4.1.
_NO_GPU_FIX = (
    "run on a host with SM120 GPUs and nvidia-smi (`--base cpu` checks the cpu base, which "
    "serves small test models, not DeepSeek-V4.1)"
)


def _gpus(base: str) -> list[Check]:
    try:
        gpus = gpu_inventory()
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        return [Check("GPUs", None if base == "cpu" else False, f"none found ({exc})", _NO_GPU_FIX)]
    if not gpus:
        return [
            Check("GPUs", None if base == "cpu" else False, "nvidia-smi lists none", _NO_GPU_FIX)
        ]
    kinds = sorted({f"{g.name} (SM {g.compute_cap}, {g.memory_mib} MiB)" for g in gpus})
    sm120 = [g for g in gpus if g.compute_cap.startswith("12.")]
    drivers = sorted({g.driver for g in gpus})
    return [
        Check("GPUs", True, f"{len(gpus)}: " + "; ".join(kinds)),
        Check(
            "SM120 GPUs",
            bool(sm120) if base != "cpu" else None,
            f"{len(sm120)} of {len(gpus)}",
            "serve on SM 12.x GPUs (RTX PRO 6000 class): the series' DCP path is SM120's",
        ),
        Check("driver", None, ", ".join(drivers)),
    ]


def _tree(series: Series, base: str, build: Path) -> Check:
    stale = staleness(series, base, build)
    tree = tree_dir(build, base)
    if not stale:
        return Check("baked tree", True, f"{tree} (series {series.sha256[:8]})")
    more = f" (+{len(stale) - 1} more)" if len(stale) > 1 else ""
    return Check("baked tree", False, stale[0] + more, f"run `bakery bake --base {base}`")


def _vllm(python: Path, env: dict, cwd: Path, tree: Path | None) -> ProbeAnswer | str:
    if tree is not None:
        inherited = env.get("PYTHONPATH")
        env = {**env, "PYTHONPATH": str(tree) + (os.pathsep + inherited if inherited else "")}
    try:
        probe = probe_python(python, env, cwd, SERVER_MODULE, ["--model", "doctor"])
    except (OSError, ValueError) as exc:
        return str(exc)
    if probe.not_imported is not None:
        return probe.not_imported
    return probe


def _from_tree(python: Path, cwd: Path, tree: Path) -> Check:
    name = "vllm from the baked tree"
    probe = _vllm(python, dict(os.environ), cwd, tree)
    if isinstance(probe, str):
        fix = f"install the pinned vllm into {python} for its dependencies, then bake"
        return Check(name, False, probe, fix)
    where = Path(probe.vllm_file or "").resolve()
    ok = tree.is_dir() and where.is_relative_to(tree.resolve())
    fix = (
        f"bake the tree ({tree} is missing)"
        if not tree.is_dir()
        else f"let nothing before {tree} on PYTHONPATH hold a vllm package"
    )
    return Check(name, ok, f"{probe.vllm_version} from {where.parent}", fix)


def _installed(python: Path, cwd: Path, series: Series, base: str) -> Check:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = _vllm(python, env, cwd, None)
    name = "vllm installed (run.sh start --installed)"
    if isinstance(probe, str):
        return Check(name, None, probe)
    manifest, problems = installed_problems(series, base, probe.vllm_file or "")
    where = Path(probe.vllm_file or "").resolve().parent
    if manifest is None:
        return Check(name, None, f"{probe.vllm_version} from {where}: not a patched wheel")
    if problems:
        fix = (
            "reinstall the current wheel: `pip install --no-deps --force-reinstall WHEEL` "
            "(`bakery status` names it)"
        )
        return Check(name, False, f"{where}: {problems[0]}", fix)
    return Check(name, True, f"patched wheel of series {series.sha256[:8]} at {where}")


def diagnose(series: Series, base: str, build: Path, python: Path, cwd: Path) -> list[Check]:
    """Every host check for serving ``base``; the last line says whether it can."""
    try:
        series.base(base)
    except BakeryError as exc:
        return [Check("base", False, str(exc), f"use --base {'|'.join(sorted(series.bases))}")]
    checks = [Check("python", None, str(python))] + _gpus(base)
    tree_check = _tree(series, base, build)
    from_tree = _from_tree(python, cwd, tree_dir(build, base))
    installed = _installed(python, cwd, series, base)
    checks += [tree_check, from_tree, installed]
    hardware = all(c.ok is not False for c in checks if c.name in ("GPUs", "SM120 GPUs"))
    served = bool(tree_check.ok and from_tree.ok) or bool(installed.ok)
    verdict = hardware and served
    what = f"this host can serve the {base} base" if verdict else f"cannot serve the {base} base"
    checks.append(Check("verdict", verdict, what, "the fix: lines above"))
    return checks
