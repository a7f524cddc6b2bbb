"""Run the baked tree's own DCP Triton kernels on a GPU, without vLLM, against the reference.

The device image has torch and Triton but no vLLM, and the kernels live in modules that
import ``vllm`` at module level. So this tool reads the two baked source files, picks out
with ``ast`` the top-level definitions it needs (and, transitively, the module-level
helpers they name), and execs only those in a fresh namespace. The namespace gets the
module's own non-vLLM imports, the real ``triton`` / ``triton.language as tl``, and a
stand-in for the vLLM launch glue (``VllmTritonJitKernel``, ``kernel_launcher``). Every
other vLLM name is bound to ``Unavailable``, which raises if the checked path touches it.
The code is compiled under the baked file's own path and line numbers, so Triton's
``inspect.getsource`` reads the kernel body from the baked file itself; the tool asserts
that each kernel's ``src`` is a verbatim slice of that file.

Checks (exit status 1 on any mismatch):

a. ``triton_filter_and_convert_dcp_index(..., return_valid_counts=True)`` against
   ``bakery.dcp_reference.filter_and_convert`` for W in {2, 4}, K in {1, 2, 4}, page
   sizes {4, 16, 64}, every rank: counts equal, the compacted prefix equal as a set (the
   kernel documents its order as unspecified), the tail all -1;
b. the ``cp_lse_ag_out_rs`` correction (``correct_attn_out``) and the ``dcp_a2a_lse_reduce``
   pack/unpack-combine kernels, base-2 LSE (``is_lse_base_on_e=False``), with the
   collectives emulated on one GPU, against ``combine_ag_rs`` / ``combine_a2a``; empty
   rows carry LSE -1e30 and output 0, the reference's merge identity.

    python3 tools/gpu_triton_kernels.py build/baked-cpu --out "$OUT"   # one GPU

Writes gpu_triton_kernels.json and gpu_triton_kernels.md to --out (default $OUT).
"""

from __future__ import annotations

import argparse
import ast
import datetime
import inspect
import json
import math
import os
import socket
import sys
import textwrap
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bakery import dcp_reference as ref  # noqa: E402

SPARSE_UTILS = "vllm/v1/attention/backends/mla/sparse_utils.py"
DCP_OPS = "vllm/v1/attention/ops/dcp.py"
SPARSE_ROOTS = ("triton_filter_and_convert_dcp_index",)
DCP_ROOTS = (
    "mask_dcp_empty_shards_",
    "correct_attn_out",
    "_dcp_a2a_lse_pack_dim",
    "_dcp_a2a_send_recv_buffers",
    "_dcp_a2a_pack_send",
    "_dcp_a2a_unpack_combine",
)
# dtype -> (atol, rtol) on the output, as tools/gpu_dcp_bench.py's parity: bf16 partials
# are rounded before the rank sum, so a one-ulp flip can reach 1-2 ulps of a partial sum.
# The LSE is fp32 in both flavours.
OUT_TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (3e-2, 3e-2)}
LSE_TOL = (1e-4, 1e-6)


class ExtractError(LookupError):
    """A name the checks need is not a top-level definition of the baked file."""


# ---- extraction -------------------------------------------------------------


def _defined_names(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def _free_names(node: ast.AST) -> set[str]:
    """Names a definition reads; over-approximate (locals too), which is harmless."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


@dataclass
class Extracted:
    """The definitions picked from one baked file, in file order."""

    path: Path
    text: str
    nodes: list[ast.stmt]
    imports: list[ast.stmt]  # non-vLLM module-level imports, run verbatim
    vllm_names: dict[str, str] = field(default_factory=dict)  # name -> vllm module

    def names(self) -> list[str]:
        return [n for node in self.nodes for n in _defined_names(node)]

    def referenced_vllm(self) -> set[str]:
        used = set().union(*(_free_names(node) for node in self.nodes))
        return used & set(self.vllm_names)

    def segment(self, node: ast.stmt) -> str:
        """Exact source of ``node``, decorators included (what is compiled)."""
        lines = self.text.splitlines(keepends=True)
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        return "".join(lines[first - 1 : node.end_lineno])


def _module_imports(tree: ast.Module) -> tuple[list[ast.stmt], dict[str, str]]:
    plain: list[ast.stmt] = []
    vllm: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            continue  # applied through the compile flag instead
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm":
            vllm.update({a.asname or a.name: node.module or "" for a in node.names})
        elif isinstance(node, ast.Import) and any(
            a.name.split(".")[0] == "vllm" for a in node.names
        ):
            vllm.update({a.asname or a.name: a.name for a in node.names})
        elif isinstance(node, ast.Import | ast.ImportFrom):
            plain.append(node)
    return plain, vllm


def extract(path: Path, roots: Iterable[str]) -> Extracted:
    """The top-level definitions ``roots`` plus every top-level one they reach by name."""
    text = path.read_text()
    tree = ast.parse(text, filename=str(path))
    by_name = {n: node for node in tree.body for n in _defined_names(node)}
    missing = [r for r in roots if r not in by_name]
    if missing:
        raise ExtractError(f"{path}: no top-level definition of {', '.join(missing)}")
    picked: set[int] = set()
    todo = list(roots)
    while todo:
        node = by_name[todo.pop()]
        if id(node) in picked:
            continue
        picked.add(id(node))
        todo.extend(n for n in _free_names(node) if n in by_name)
    imports, vllm = _module_imports(tree)
    nodes = [node for node in tree.body if id(node) in picked]
    return Extracted(path, text, nodes, imports, vllm)


# ---- stand-ins for vLLM glue ------------------------------------------------


class Unavailable:
    """A vLLM name with no stand-in: any use on the checked path fails loudly."""

    def __init__(self, name: str, module: str) -> None:
        self._what = f"{module}.{name}"

    def _fail(self, *_: Any, **__: Any) -> Any:
        raise RuntimeError(f"{self._what} is not available without vLLM")

    __call__ = __getattr__ = __getitem__ = _fail


def _bind_target(name: str, arg_names: set[str]) -> str | None:
    # vLLM 0.32 jit_warmup_triton_helper._launch_binding_plan: a launcher input
    # binds to the kernel argument spelled name, name_ptr, NAME or NAME_PTR.
    for cand in (name, f"{name}_ptr", name.upper(), f"{name}_ptr".upper()):
        if cand in arg_names:
            return cand
    return None


class JitKernelStandIn:
    """Stand-in for ``VllmTritonJitKernel``: only its eager (non-warmup) launch.

    Pure-Python glue: the real class adds JIT warmup and compile-key tracing around
    ``launch``. This mirrors vLLM 0.32's ``launch`` for the eager path: launcher
    inputs bind by name to kernel arguments the LaunchSpec does not set, then either
    the spec's ``_runtime_launcher`` gets the non-constexpr prefix positionally or the
    kernel is launched with keywords. Stride inference is left out: both kernels
    checked here receive every stride explicitly, and a missing one makes Triton raise.
    """

    _warming = False
    bind_launch_inputs = True

    def __class_getitem__(cls, _key: Any) -> type:
        return cls

    def launch(self, launch_spec: tuple, inputs: Mapping[str, Any]) -> Any:
        grid, kwargs = launch_spec[0], dict(launch_spec[1])
        outputs = launch_spec[2] if len(launch_spec) == 3 else None
        arg_names = list(self.kernel.arg_names)
        for name, value in inputs.items():
            target = _bind_target(name, set(arg_names))
            if target is not None and target not in kwargs:
                kwargs[target] = value
        kernel = kwargs.pop("kernel", None) or self.kernel
        runner = kwargs.pop("_runtime_launcher", None)
        count = kwargs.pop("_runtime_launcher_arg_count", 0)
        if runner is not None:
            regular = [kwargs.pop(n) for n in arg_names[:count]]
            runner(kernel, grid, *regular, **kwargs)
        else:
            kernel[grid](**kwargs)
        return outputs


def kernel_launcher(call_fn: Callable[..., Any]) -> Callable[..., Any]:
    """Stand-in for vLLM's ``kernel_launcher``: bind the call's arguments, then launch."""
    signature = inspect.signature(call_fn)

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        spec = call_fn(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        inputs = {k: v for k, v in bound.arguments.items() if k != "self"}
        return self.launch(spec, inputs)

    return wrapper


def standins() -> dict[str, Any]:
    import triton
    import triton.language as tl

    return {
        "triton": triton,
        "tl": tl,
        "VllmTritonJitKernel": JitKernelStandIn,
        "kernel_launcher": kernel_launcher,
    }


# ---- namespace --------------------------------------------------------------


def build_namespace(ex: Extracted, provided: Mapping[str, Any]) -> dict[str, Any]:
    """Exec the picked definitions under the baked file's name and line numbers."""
    # A registered module, because dataclasses resolves string annotations (the class's
    # CompileKey) through sys.modules[cls.__module__].
    module = types.ModuleType(f"baked_{ex.path.stem}")
    module.__file__ = str(ex.path)
    sys.modules[module.__name__] = module
    ns: dict[str, Any] = module.__dict__
    flags = annotations.compiler_flag  # the __future__ feature; sparse_utils lacks it
    imports = ast.Module(body=ex.imports, type_ignores=[])
    exec(compile(imports, str(ex.path), "exec", flags=flags, dont_inherit=True), ns)
    for name, module in ex.vllm_names.items():
        ns[name] = provided.get(name, Unavailable(name, module))
    body = ast.Module(body=ex.nodes, type_ignores=[])
    exec(compile(body, str(ex.path), "exec", flags=flags, dont_inherit=True), ns)
    return ns


def _jit_types() -> tuple[type, ...]:
    import triton
    import triton.runtime.interpreter as interpreter

    # Under TRITON_INTERPRET=1 (the CPU dry run) triton.jit returns InterpretedFunction.
    return (triton.runtime.JITFunction, interpreter.InterpretedFunction)


def jit_functions(ns: Mapping[str, Any]) -> dict[str, Any]:
    """Every Triton JIT function in the namespace, module-level or class attribute."""
    kinds = _jit_types()
    found: dict[str, Any] = {}
    for name, obj in ns.items():
        if isinstance(obj, kinds):
            found[name] = obj
        elif isinstance(obj, type):
            for val in vars(obj).values():
                fn = val.__func__ if isinstance(val, staticmethod) else val
                if isinstance(fn, kinds):
                    found.setdefault(f"{name}.{fn.fn.__name__}", fn)
    return found


def _def_source(ex: Extracted, name: str) -> str:
    """Dedented ``def`` .. end of the picked function ``name``, read from the file."""
    lines = ex.text.splitlines(keepends=True)
    for top in ex.nodes:
        for node in ast.walk(top):
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return textwrap.dedent("".join(lines[node.lineno - 1 : node.end_lineno]))
    raise ExtractError(f"{ex.path}: no function {name} among the picked definitions")


def _interpreter_shim(ns: Mapping[str, Any]) -> None:
    """CPU dry run only: Triton's interpreter lacks ``JITFunction.constexprs``, which
    ``CorrectAttnCPOutKernel.__call__`` reads; derive it the way JITFunction does."""
    for fn in jit_functions(ns).values():
        if not hasattr(fn, "constexprs"):
            params = inspect.signature(fn.fn).parameters.values()
            fn.constexprs = [i for i, p in enumerate(params) if "constexpr" in str(p.annotation)]


def verify_verbatim(ex: Extracted, ns: Mapping[str, Any]) -> dict[str, bool]:
    """Each kernel as Triton compiles it: its source is the baked file's, and its code
    object was compiled under the baked file's path."""
    result = {}
    for label, fn in jit_functions(ns).items():
        src = getattr(fn, "src", None) or textwrap.dedent(inspect.getsource(fn.fn))
        same_src = src.strip() == _def_source(ex, fn.fn.__name__).strip()
        result[label] = same_src and fn.fn.__code__.co_filename == str(ex.path)
    return result


@dataclass
class Loaded:
    sparse: dict[str, Any]
    dcp: dict[str, Any]
    report: dict[str, Any]


def load(baked: Path) -> Loaded:
    baked = baked.resolve()  # Triton re-reads kernel source through this path
    provided = standins()
    report: dict[str, Any] = {}
    spaces = []
    for rel, roots in ((SPARSE_UTILS, SPARSE_ROOTS), (DCP_OPS, DCP_ROOTS)):
        ex = extract(baked / rel, roots)
        ns = build_namespace(ex, provided)
        _interpreter_shim(ns)
        report[rel] = {
            "definitions": ex.names(),
            "kernels_verbatim": verify_verbatim(ex, ns),
            "stand_ins": sorted(n for n in ex.vllm_names if n in provided),
            # Named by the picked code (mostly warmup methods the checks never call).
            "unavailable": sorted(ex.referenced_vllm() - set(provided)),
        }
        spaces.append(ns)
    return Loaded(spaces[0], spaces[1], report)


# ---- check a: filter and convert --------------------------------------------


def _owned_by(gen: torch.Generator, rank: int, layout: ref.Layout, hi: int, n: int):
    ids = torch.randperm(hi, generator=gen)
    ids = ids[ref.owner_rank(ids, layout.world_size, layout.interleave) == rank]
    return ids[:n]


def filter_rows(gen: torch.Generator, layout: ref.Layout, topk: int, width: int):
    """Rows of global ids: random with -1 tail, full, empty, single-owner, off-table."""
    span = width * layout.page_size * layout.world_size  # ids the table covers
    w = layout.world_size
    rows = [ref.random_topk(gen, span, int(c), topk) for c in (topk // 3, topk, 1, 0)]
    for rank in (0, w - 1):
        row = torch.full((topk,), -1, dtype=torch.int32)
        own = _owned_by(gen, rank, layout, span, topk // 2)
        row[: own.numel()] = own.to(torch.int32)
        rows.append(row)
    # Past the table width: the kernel and the reference both drop these.
    rows.append(ref.random_topk(gen, 3 * span, topk // 2, topk))
    return torch.stack(rows)


def _compare_filter(out, counts, ref_out, ref_counts) -> dict[str, Any]:
    bad_rows = []
    stable = True
    for t in range(out.shape[0]):
        n = int(ref_counts[t])
        same = int(counts[t]) == n
        same &= torch.equal(out[t, :n].sort().values, ref_out[t, :n].sort().values)
        same &= bool((out[t, n:] == -1).all())
        stable &= torch.equal(out[t], ref_out[t])
        if not same:
            bad_rows.append(t)
    return {"bad_rows": bad_rows, "stable_order": stable}


def check_filter(ns, device, world: int, k: int, page: int, topk: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    layout = ref.Layout(world, k, page)
    # Wide enough that a full row fits the table; small pages give many pages.
    width, reqs = max(3, -(-2 * topk // (page * world))), 2
    ids = filter_rows(gen, layout, topk, width)
    t = ids.shape[0]
    token_to_req = (torch.arange(t) % reqs).to(torch.int32)
    table = torch.randperm(reqs * width + 5, generator=gen)[: reqs * width]
    table = table.reshape(reqs, width).to(torch.int32)
    results = []
    for rank in range(world):
        ref_out, ref_counts = ref.filter_and_convert(ids, token_to_req, table, layout, rank)
        out, counts = ns["triton_filter_and_convert_dcp_index"](
            token_to_req.to(device),
            table.to(device),
            ids.to(device),
            dcp_size=world,
            dcp_rank=rank,
            cp_kv_cache_interleave_size=k,
            BLOCK_SIZE=page,
            NUM_TOPK_TOKENS=topk,
            BLOCK_N=min(128, topk),
            return_valid_counts=True,
        )
        cmp = _compare_filter(out.cpu(), counts.cpu(), ref_out, ref_counts)
        results.append({"rank": rank, **cmp, "valid": int(ref_counts.sum())})
    ok = all(not r["bad_rows"] for r in results)
    return {
        "W": world,
        "K": k,
        "page": page,
        "topk": topk,
        "rows": t,
        "ok": ok,
        "stable_order": all(r["stable_order"] for r in results),
        "ranks": results,
    }


def filter_cases() -> list[tuple[int, int, int, int]]:
    cases = [(w, k, p, 512) for w in (2, 4) for k in (1, 2, 4) for p in (4, 16, 64)]
    cases += [(2, 2, 16, 64), (4, 1, 64, 64)]
    # Past 4096 columns the kernel switches to multi-tile atomic compaction.
    cases += [(2, 1, 64, 8192)]
    return cases


# ---- check b: LSE correction and combine ------------------------------------


def random_parts(gen, world: int, t: int, h: int, d: int, dtype) -> list[ref.AttnOut]:
    """Per-rank partials over all gathered heads; some (row, rank) shards empty."""
    parts = []
    for rank in range(world):
        out = torch.randn(t, h * world, d, generator=gen).to(dtype)
        lse = torch.randn(t, h * world, generator=gen) * 4 + 8
        empty = torch.zeros(t, dtype=torch.bool)
        if t > 1:
            empty[rank % (t - 1)] = True  # this rank empty on one row
            empty[t - 1] = True  # the last row is empty on every rank
        if t > 2:
            lse[1] += 40.0 * (rank == 0)  # rank 0 dominates: others' weight underflows
        lse[empty] = ref.EMPTY_LSE
        out[empty] = 0
        parts.append(ref.AttnOut(out, lse))
    return parts


def _err(a: torch.Tensor, b: torch.Tensor, tol: tuple[float, float]) -> tuple[float, bool]:
    a, b = a.float().cpu(), b.float().cpu()
    same_inf = torch.equal(torch.isinf(a), torch.isinf(b)) and torch.equal(
        a[a.isinf()], b[b.isinf()]
    )
    fin = ~torch.isinf(b)
    diff = (a[fin] - b[fin]).abs()
    ok = same_inf and bool((diff <= tol[0] + tol[1] * b[fin].abs()).all())
    return (float(diff.max()) if diff.numel() else 0.0), ok and not a.isnan().any()


def kernel_ag_rs(ns, parts, mask=None) -> list[ref.AttnOut]:
    """``_cp_lse_common`` + ``reduce_scatter`` with the gather and the sum done locally."""
    world = len(parts)
    lses = []
    for p in parts:
        lse = p.lse.clone()
        if mask is not None:
            ns["mask_dcp_empty_shards_"](lse, *mask[len(lses)])
        lses.append(lse)
    gathered = torch.stack(lses)
    corrected, merged = [], None
    for rank, p in enumerate(parts):
        out, merged = ns["correct_attn_out"](
            p.out.clone(), gathered, rank, None, is_lse_base_on_e=False
        )
        corrected.append(out)
    total = corrected[0].clone()
    for c in corrected[1:]:
        total += c  # output dtype, rank order: what the reference's reduce does
    h = total.shape[1] // world
    return [
        ref.AttnOut(total[:, r * h : (r + 1) * h], merged[:, r * h : (r + 1) * h])
        for r in range(world)
    ]


def kernel_a2a(ns, parts, mask=None) -> list[ref.AttnOut]:
    """``dcp_a2a_lse_reduce`` with ``all_to_all_single`` done as a local transpose."""
    world = len(parts)
    t, hw, d = parts[0].out.shape
    h = hw // world
    pack = ns["_dcp_a2a_lse_pack_dim"](parts[0].out.dtype)
    sends = []
    for rank, p in enumerate(parts):
        send, _ = ns["_dcp_a2a_send_recv_buffers"](
            (world, t, h, d + pack), p.out.device, p.out.dtype
        )
        extra = {} if mask is None else dict(seq_lens=mask[rank][0], query_start_loc=mask[rank][1])
        ns["_dcp_a2a_pack_send"](p.out, p.lse, send, world, h, d, pack, **extra)
        sends.append(send)
    results = []
    for rank in range(world):
        recv = torch.stack([s[rank] for s in sends])
        out, lse = ns["_dcp_a2a_unpack_combine"](recv, d, pack, True, False)
        results.append(ref.AttnOut(out, lse))
    return results


def empty_shard_mask(world: int, t: int, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """seq_lens/query_start_loc per rank: request 1 has no KV on odd ranks; the last
    row is CUDA-graph padding past query_start_loc[-1]."""
    qsl = torch.tensor([0, t // 2, t - 1], dtype=torch.int32, device=device)
    return [
        (torch.tensor([5, 0 if r % 2 else 3], dtype=torch.int32, device=device), qsl)
        for r in range(world)
    ]


def masked_reference_parts(parts, mask) -> list[ref.AttnOut]:
    """What the mask means, written out row by row: an empty shard's LSE is -inf."""
    masked = []
    for p, (seq_lens, qsl) in zip(parts, mask, strict=True):
        lse = p.lse.clone()
        bounds = qsl.tolist()
        for row in range(lse.shape[0]):
            seq = sum(b <= row for b in bounds[1:-1])
            if row >= bounds[-1] or int(seq_lens[seq]) == 0:
                lse[row] = -math.inf
        masked.append(ref.AttnOut(p.out, lse))
    return masked


def check_combine(
    ns, device, flavour: str, world: int, t: int, h: int, dtype, masked: bool, seed: int
) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    parts = [
        ref.AttnOut(p.out.to(device), p.lse.to(device))
        for p in random_parts(gen, world, t, h, 512, dtype)
    ]
    mask = empty_shard_mask(world, t, device) if masked else None
    ref_parts = masked_reference_parts(parts, mask) if masked else parts
    expect = ref.run_spmd(world, lambda g: ref.COMBINES[flavour](g, ref_parts[g.rank_in_group]))
    got = (kernel_ag_rs if flavour == "ag_rs" else kernel_a2a)(ns, parts, mask)
    out_err, lse_err, ok = 0.0, 0.0, True
    for g, e in zip(got, expect, strict=True):
        eo, oko = _err(g.out, e.out, OUT_TOL[dtype])
        el, okl = _err(g.lse, e.lse, LSE_TOL)
        out_err, lse_err, ok = max(out_err, eo), max(lse_err, el), ok and oko and okl
    return {
        "combine": flavour,
        "W": world,
        "T": t,
        "heads_per_rank": h,
        "dtype": str(dtype).removeprefix("torch."),
        "masked": masked,
        "ok": ok,
        "max_abs_err_out": out_err,
        "max_abs_err_lse": lse_err,
        "tol_out": OUT_TOL[dtype],
        "tol_lse": LSE_TOL,
    }


def combine_cases():
    for flavour in ("ag_rs", "a2a"):
        for world in (2, 4):
            for dtype in (torch.float32, torch.bfloat16):
                for t, h in ((1, 16), (7, 4), (33, 16)):
                    yield flavour, world, t, h, dtype, False
                yield flavour, world, 8, 8, dtype, True


# ---- report -----------------------------------------------------------------


def environment(device: torch.device) -> dict[str, Any]:
    import triton

    env = {
        "host": socket.gethostname(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": sys.version.split()[0],
        "utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    return env


def markdown(res: dict[str, Any]) -> str:
    env = res["environment"]
    lines = [
        f"# Baked Triton kernels: {env.get('gpu', 'cpu')}, {env['utc']}",
        "",
        f"torch {env['torch']}, Triton {env['triton']}; baked tree `{res['baked']}`.",
        "",
        "## Filter and convert",
        "",
        "| W | K | page | topk | rows | pass | same order |",
        "| --- " * 7 + "|",
    ]
    for c in res["filter"]:
        lines.append(
            f"| {c['W']} | {c['K']} | {c['page']} | {c['topk']} | {c['rows']} | "
            f"{'yes' if c['ok'] else 'NO'} | {'yes' if c['stable_order'] else 'no'} |"
        )
    lines += [
        "",
        "## LSE correction and combine (base 2)",
        "",
        "| combine | W | T | heads/rank | dtype | masked | max abs err out | "
        "max abs err LSE | pass |",
        "| --- " * 9 + "|",
    ]
    for c in res["combine"]:
        lines.append(
            f"| {c['combine']} | {c['W']} | {c['T']} | {c['heads_per_rank']} | "
            f"{c['dtype']} | {'yes' if c['masked'] else 'no'} | "
            f"{c['max_abs_err_out']:.2e} | {c['max_abs_err_lse']:.2e} | "
            f"{'yes' if c['ok'] else 'NO'} |"
        )
    lines += ["", f"Overall: {'PASS' if res['ok'] else 'FAIL'}", ""]
    return "\n".join(lines)


def run(baked: Path, device: torch.device) -> dict[str, Any]:
    loaded = load(baked)
    filt = [
        check_filter(loaded.sparse, device, w, k, p, tk, seed=i)
        for i, (w, k, p, tk) in enumerate(filter_cases())
    ]
    comb = [
        check_combine(loaded.dcp, device, *case, seed=i) for i, case in enumerate(combine_cases())
    ]
    verbatim = [v for r in loaded.report.values() for v in r["kernels_verbatim"].values()]
    ok = all(verbatim) and all(c["ok"] for c in filt + comb)
    return {
        "environment": environment(device),
        "baked": str(baked),
        "ok": ok,
        "loaded": loaded.report,
        "filter": filt,
        "combine": comb,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("baked", type=Path, help="baked tree root (holds vllm/)")
    ap.add_argument("--out", type=Path, default=os.environ.get("OUT"))
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    res = run(args.baked, torch.device(args.device))
    text = markdown(res)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_triton_kernels.json").write_text(json.dumps(res, indent=1) + "\n")
        (args.out / "gpu_triton_kernels.md").write_text(text)
    if not res["ok"]:
        print("MISMATCH: see the tables above", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
