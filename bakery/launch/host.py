"""Facts from this machine: the GPUs (``nvidia-smi``), CUDA_VISIBLE_DEVICES, the head
set in the baked source, and the probe run by the serving Python.

Read-only and bounded: ``nvidia-smi`` and the probe are the only processes
started, each with a timeout; UUIDs and serials are never read.
"""

from __future__ import annotations

import ast
import csv
import io
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgspec

from bakery.launch import probe as probe_module
from bakery.launch.gates import GateTable
from bakery.launch.plan import LaunchPlan, server_args

__all__ = [
    "Gpu",
    "ProbeAnswer",
    "ProbeArgs",
    "read_heads",
    "gpu_inventory",
    "visible",
    "run_probe",
    "probe_python",
]

PROBE_TIMEOUT_S = 300.0


class ProbeArgs(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Whether vLLM's own parser took the arguments (``probe._parse``)."""

    ok: bool
    stage: Literal["parser", "args"] | None = None  # where it failed
    error: str | None = None
    parsed: dict[str, Any] = {}  # probe.FIELDS -> the parsed value


class ProbeAnswer(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The probe's one JSON line (``probe.main``): where vllm imports from, or why not."""

    vllm_file: str | None = None
    vllm_version: str | None = None
    torch_version: str | None = None
    import_error: str | None = None
    ray: bool | None = None  # None: not asked (vllm did not import)
    args: ProbeArgs | None = None

    @property
    def not_imported(self) -> str | None:
        """Why vllm did not import (None: it did, from ``vllm_file``)."""
        if self.import_error is None and self.vllm_file is not None:
            return None
        return self.import_error or "the probe named no vllm file"


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_mib: int
    compute_cap: str
    driver: str


def read_heads(tree: Path, package: str, table: GateTable) -> tuple[int, ...]:
    """The supported head set, parsed (never imported) from the baked source."""
    path = tree / package / table.heads_file
    module = ast.parse(path.read_text(), filename=str(path))
    for node in module.body:
        if not isinstance(node, ast.Assign):
            continue
        if any(isinstance(t, ast.Name) and t.id == table.heads_name for t in node.targets):
            return tuple(int(h) for h in ast.literal_eval(node.value))
    raise ValueError(f"{table.heads_name} is not assigned in {path}")


def _parse_gpus(text: str) -> tuple[Gpu, ...]:
    """``--format=csv,noheader,nounits`` rows; a row without five fields raises ValueError."""
    gpus = []
    for row in csv.reader(io.StringIO(text.strip()), skipinitialspace=True):
        index, name, memory, cap, driver = (c.strip() for c in row)
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


def run_probe(plan: LaunchPlan) -> ProbeAnswer:
    """Run the probe with the serving Python, env and cwd. Raises OSError on failure."""
    env = {**os.environ, **dict(plan.env)}
    return probe_python(plan.python, env, plan.cwd, plan.command[2], server_args(plan.profile))


def probe_python(python: Path, env: dict, cwd: Path, module: str, args: list[str]) -> ProbeAnswer:
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
            try:
                return msgspec.json.decode(line[len(probe_module.MARKER) + 1 :], type=ProbeAnswer)
            except msgspec.DecodeError as exc:
                raise OSError(f"the probe's answer does not read: {exc}") from None
    tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
    raise OSError(f"the probe exited {out.returncode}: {tail[:300]}")
