"""Static link check of the files a series touches: nothing is imported.

Job: parse the *patched* source of every touched ``.py`` file and resolve,
against a source tree (the patched files as an overlay over the pristine vLLM
tree and the pinned third-party sources):

* every ``import`` / ``from ... import`` (also inside functions): the module
  must exist and define the name, following ``__init__`` re-exports,
  ``from x import *`` and ``__all__``;
* every call into a statically resolvable function or class: positional
  count, keyword names and required parameters must bind to the signature
  (``__init__`` through the MRO, dataclass-like fields, bound methods);
* every ``self.X`` read in a method of a class defined in a touched file: X
  must be assigned in the class or a base, or be a class attribute/method.

Boundary: only top-level packages found in the tree (``vllm``, ``flashinfer``)
are checked; everything else (torch, triton, the stdlib, other dependencies) is
trusted as external. Anything dynamic is trusted rather than guessed: a module
``__getattr__``, a non-literal ``__all__``, a class with an external base other
than ``object``/``ABC``/``Generic``/``Protocol``/``torch.nn.Module``, a class
or base defining ``__getattr__``, callees behind unknown decorators, ambiguous
(conditional) definitions. Truly dynamic names are allowlisted in series.toml
under ``[linkcheck.allow]`` as ``"<touched path>:<subject>" = "<reason>"``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Union

from bakery.errors import BakeryError, SeriesError
from bakery.series.apply import plan
from bakery.series.series import Series

__all__ = [
    "Finding",
    "SourceTree",
    "check",
    "run_linkcheck",
    "format_finding",
    "package_root",
]

PACKAGE = "vllm"
_ALLOW_KEY = re.compile(r"^[^:\s]+\.py:[A-Za-z_][\w.]*$")
_TRANSPARENT_BASES = frozenset(
    {
        "object",
        "abc.ABC",
        "typing.Generic",
        "typing.Protocol",
        "typing_extensions.Protocol",
        "typing_extensions.Generic",
    }
)
_NN_MODULE = frozenset({"torch.nn.Module", "torch.nn.modules.module.Module"})
# dir(torch.nn.Module) and a fresh instance's __dict__ (torch 2.x), dunders left out.
_NN_MODULE_ATTRS = frozenset(
    """T_destination _apply _backward_hooks _backward_pre_hooks _buffers _call_impl
    _compiled_call_impl _forward_hooks _forward_hooks_always_called _forward_hooks_with_kwargs
    _forward_pre_hooks _forward_pre_hooks_with_kwargs _get_backward_hooks
    _get_backward_pre_hooks _get_name _is_full_backward_hook _load_from_state_dict
    _load_state_dict_post_hooks _load_state_dict_pre_hooks _maybe_warn_non_full_backward_hook
    _modules _named_members _non_persistent_buffers_set _parameters
    _register_load_state_dict_pre_hook _register_state_dict_hook _replicate_for_data_parallel
    _save_to_state_dict _slow_forward _state_dict_hooks _state_dict_pre_hooks _version
    _wrapped_call_impl add_module apply bfloat16 buffers call_super_init children compile cpu
    cuda double dump_patches eval extra_repr float forward get_buffer get_extra_state
    get_parameter get_submodule half ipu load_state_dict modules mtia named_buffers
    named_children named_modules named_parameters parameters register_backward_hook
    register_buffer register_forward_hook register_forward_pre_hook
    register_full_backward_hook register_full_backward_pre_hook
    register_load_state_dict_post_hook register_load_state_dict_pre_hook register_module
    register_parameter register_state_dict_post_hook register_state_dict_pre_hook
    requires_grad_ set_extra_state set_submodule share_memory state_dict to to_empty train
    training type xpu zero_grad""".split()
)
# self.<call>("name", ...) that creates attribute ``name`` (nn.Module registries, setattr).
_REGISTERING_CALLS = frozenset(
    {"register_buffer", "register_parameter", "register_module", "add_module"}
)
# Methods whose first parameter is the class itself.
_CLASS_FIRST = frozenset({"__new__", "__init_subclass__", "__class_getitem__"})
# Decorators that keep a function's call signature (matched on their last name).
_SIGNATURE_KEEPING = frozenset(
    {
        "staticmethod",
        "classmethod",
        "abstractmethod",
        "cache",
        "lru_cache",
        "no_grad",
        "inference_mode",
        "final",
        "override",
        "wraps",
    }
)


# --- findings ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """One unresolved link: ``path:line: missing (where)``; ``subject`` keys the allowlist."""

    path: str  # as the series names it (relative to the vllm/ package)
    line: int
    missing: str
    where: str
    subject: str

    @property
    def key(self) -> str:
        return f"{self.path}:{self.subject}"


def format_finding(f: Finding) -> str:
    return f"{f.path}:{f.line}: {f.missing} ({f.where})"


# --- the source tree ---------------------------------------------------------------------


@dataclass(frozen=True)
class ModuleSource:
    name: str
    rel: str  # root-relative file ("vllm/x/y.py"), or the package dir for a namespace package
    text: str | None  # None: compiled or namespace module, contents unknown
    is_package: bool
    origin: str  # "patched" or the root it came from


@dataclass(frozen=True)
class SourceTree:
    """Dotted module -> source: the overlay (patched files, root-relative paths,
    None = deleted) first, then each root (a dir holding top-level packages)."""

    roots: tuple[Path, ...]
    overlay: Mapping[str, bytes | None] = field(default_factory=dict)

    def has_top(self, top: str) -> bool:
        if any(k.split("/", 1)[0] in (top, f"{top}.py") for k in self.overlay):
            return True
        return any((r / top).is_dir() or (r / f"{top}.py").is_file() for r in self.roots)

    def find(self, module: str) -> ModuleSource | None:
        base = module.replace(".", "/")
        for rel, is_pkg in ((f"{base}.py", False), (f"{base}/__init__.py", True)):
            found = self._read(module, rel, is_pkg)
            if found is not None:
                return found
        return self._compiled_or_namespace(module, base)

    def _read(self, module: str, rel: str, is_pkg: bool) -> ModuleSource | None:
        if rel in self.overlay:
            data = self.overlay[rel]
            if data is None:
                return None
            return ModuleSource(module, rel, _decode(data), is_pkg, "patched")
        for root in self.roots:
            path = root / rel
            if path.is_file():
                return ModuleSource(module, rel, _decode(path.read_bytes()), is_pkg, str(root))
        return None

    def _compiled_or_namespace(self, module: str, base: str) -> ModuleSource | None:
        parent, _, leaf = base.rpartition("/")
        for root in self.roots:
            folder = root / parent if parent else root
            if any(folder.glob(f"{leaf}.*.so")) or (folder / f"{leaf}.so").is_file():
                return ModuleSource(module, f"{base}.so", None, False, str(root))
            if (folder / f"{leaf}.pyi").is_file():
                return ModuleSource(module, f"{base}.pyi", None, False, str(root))
            if (root / base).is_dir():
                return ModuleSource(module, base, None, True, str(root))
        return None


def _decode(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


# --- symbols -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ModuleSym:
    name: str


@dataclass(frozen=True)
class FuncSym:
    module: str
    node: ast.FunctionDef | ast.AsyncFunctionDef
    qualname: str
    drop_first: bool  # bound method: self/cls is passed implicitly


@dataclass(frozen=True)
class ClassSym:
    module: str
    node: ast.ClassDef
    qualname: str


@dataclass(frozen=True)
class External:
    qualname: str


@dataclass(frozen=True)
class Unknown:
    pass


@dataclass(frozen=True)
class Missing:
    what: str
    where: str


@dataclass(frozen=True)
class Super:
    cls: ClassSym


Sym = Union[ModuleSym, FuncSym, ClassSym, External, Unknown, Missing, Super]  # noqa: UP007
UNKNOWN = Unknown()


@dataclass(frozen=True)
class Binding:
    kind: str  # "import" (target module), "from" (module, name), "def", "class", "value"
    node: ast.AST | None
    target: tuple[str, ...] = ()


@dataclass
class ModuleInfo:
    source: ModuleSource
    tree: ast.Module | None
    bindings: dict[str, list[Binding]]
    stars: list[str]
    all_names: list[str] | None
    all_dynamic: bool
    has_getattr: bool
    error: str | None = None


# --- module index ------------------------------------------------------------------------


def _absolute(module: str, is_package: bool, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    parts = module.split(".")
    if not is_package:
        parts = parts[:-1]
    parts = parts[: len(parts) - (level - 1)] if level > 1 else parts
    return ".".join(parts + ([target] if target else []))


def _top_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements that run at this level: into if/try/with/loops, not into defs."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If | ast.For | ast.AsyncFor | ast.While):
            yield from _top_statements(stmt.body)
            yield from _top_statements(stmt.orelse)
        elif isinstance(stmt, ast.With | ast.AsyncWith):
            yield from _top_statements(stmt.body)
        elif isinstance(stmt, ast.Try | ast.TryStar):
            yield from _top_statements(stmt.body)
            for handler in stmt.handlers:
                yield from _top_statements(handler.body)
            yield from _top_statements(stmt.orelse)
            yield from _top_statements(stmt.finalbody)


def _target_names(target: ast.AST) -> Iterator[str]:
    for node in ast.walk(target):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            yield node.id


def _scope_bindings(
    module: str, is_package: bool, body: list[ast.stmt]
) -> tuple[dict[str, list[Binding]], list[str]]:
    """Names bound by the statements of one scope level, plus its star-import sources."""
    bindings: dict[str, list[Binding]] = {}
    stars: list[str] = []

    def bind(name: str, binding: Binding) -> None:
        bindings.setdefault(name, []).append(binding)

    for stmt in _top_statements(body):
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname:
                    bind(alias.asname, Binding("import", stmt, (alias.name,)))
                else:
                    top = alias.name.split(".")[0]
                    bind(top, Binding("import", stmt, (top,)))
        elif isinstance(stmt, ast.ImportFrom):
            source = _absolute(module, is_package, stmt.level, stmt.module)
            for alias in stmt.names:
                if alias.name == "*":
                    stars.append(source)
                else:
                    bind(alias.asname or alias.name, Binding("from", stmt, (source, alias.name)))
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            bind(stmt.name, Binding("def", stmt))
        elif isinstance(stmt, ast.ClassDef):
            bind(stmt.name, Binding("class", stmt))
        elif isinstance(stmt, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                for name in _target_names(target):
                    bind(name, Binding("value", stmt))
        elif isinstance(stmt, ast.For | ast.AsyncFor | ast.With | ast.AsyncWith):
            for target in _loop_or_with_targets(stmt):
                for name in _target_names(target):
                    bind(name, Binding("value", stmt))
        elif isinstance(stmt, ast.Try | ast.TryStar):
            for handler in stmt.handlers:
                if handler.name:
                    bind(handler.name, Binding("value", handler))
        for node in ast.walk(stmt) if isinstance(stmt, ast.Expr | ast.Assign | ast.If) else ():
            if isinstance(node, ast.NamedExpr):
                bind(node.target.id, Binding("value", node))
    return bindings, stars


def _loop_or_with_targets(stmt: ast.stmt) -> list[ast.AST]:
    if isinstance(stmt, ast.For | ast.AsyncFor):
        return [stmt.target]
    return [item.optional_vars for item in stmt.items if item.optional_vars is not None]


def _global_assignments(tree: ast.Module) -> set[str]:
    """Module names a function assigns through ``global``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            names.update(node.names)
    return names


def _writes_globals(tree: ast.Module) -> bool:
    """``globals().update(...)`` / ``globals()[k] = v``: names bound at run time."""
    for node in ast.walk(tree):
        owner = node.value if isinstance(node, ast.Attribute | ast.Subscript) else None
        if isinstance(owner, ast.Call) and _is_name(owner.func, "globals"):
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
                return True
            if isinstance(node, ast.Attribute) and node.attr in ("update", "setdefault"):
                return True
    return False


def _literal_all(tree: ast.Module) -> tuple[list[str] | None, bool]:
    """``__all__`` as a list of strings, or (None, True) when it is not literal."""
    names: list[str] | None = None
    for stmt in _top_statements(tree.body):
        value, mode = _all_statement(stmt)
        if mode is None:
            continue
        strings = _string_list(value)
        if strings is None:
            return None, True
        names = strings if mode == "set" else (names or []) + strings
    return names, False


def _all_statement(stmt: ast.stmt) -> tuple[ast.AST | None, str | None]:
    if isinstance(stmt, ast.Assign | ast.AnnAssign):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            return stmt.value, "set"
    if isinstance(stmt, ast.AugAssign) and getattr(stmt.target, "id", None) == "__all__":
        return stmt.value, "add"
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        func = stmt.value.func
        if (
            isinstance(func, ast.Attribute)
            and getattr(func.value, "id", None) == "__all__"
            and func.attr in ("extend", "append")
        ):
            args = stmt.value.args
            value = args[0] if func.attr == "extend" else ast.List(elts=args)
            return value, "add"
    return None, None


def _string_list(value: ast.AST | None) -> list[str] | None:
    if isinstance(value, ast.List | ast.Tuple) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in value.elts
    ):
        return [e.value for e in value.elts]
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add):
        left, right = _string_list(value.left), _string_list(value.right)
        return None if left is None or right is None else left + right
    return None


class Index:
    """Parsed modules of a SourceTree and name resolution across them (memoised)."""

    def __init__(self, sources: SourceTree) -> None:
        self.sources = sources
        self._modules: dict[str, ModuleInfo | None] = {}
        self._tops: dict[str, bool] = {}
        self._class_cache: dict[int, ClassModel] = {}
        self._mro_cache: dict[int, tuple[list[ClassSym], bool]] = {}
        self._subclass_cache: dict[int, list[ClassSym]] = {}
        self._files: list[tuple[str, str]] | None = None

    def checked(self, module: str) -> bool:
        top = module.split(".")[0]
        if top not in self._tops:
            self._tops[top] = self.sources.has_top(top)
        return self._tops[top]

    def module(self, name: str) -> ModuleInfo | None:
        if name not in self._modules:
            self._modules[name] = self._load(name)
        return self._modules[name]

    def _load(self, name: str) -> ModuleInfo | None:
        source = self.sources.find(name)
        if source is None:
            return None
        if source.text is None:
            return ModuleInfo(source, None, {}, [], None, False, True)
        try:
            tree = ast.parse(source.text, filename=source.rel)
        except SyntaxError as exc:
            error = f"unparseable: {exc.msg} at line {exc.lineno}"
            return ModuleInfo(source, None, {}, [], None, False, True, error)
        bindings, stars = _scope_bindings(name, source.is_package, tree.body)
        for gname in _global_assignments(tree):
            bindings.setdefault(gname, []).append(Binding("value", None))
        all_names, all_dynamic = _literal_all(tree)
        has_getattr = "__getattr__" in bindings or _writes_globals(tree)
        return ModuleInfo(source, tree, bindings, stars, all_names, all_dynamic, has_getattr)

    # names ---------------------------------------------------------------------------

    def resolve(self, module: str, name: str, seen: frozenset = frozenset()) -> Sym:
        if not self.checked(module):
            return External(f"{module}.{name}")
        key = (module, name)
        if key in seen:
            return UNKNOWN
        seen = seen | {key}
        info = self.module(module)
        if info is None:
            return Missing(f"no module {module}", "not found in the tree")
        if info.tree is None and not (info.source.text is None and info.source.is_package):
            return UNKNOWN  # compiled or unparseable: trusted (namespace packages go on)
        if name in info.bindings:
            return self._follow(info, name, info.bindings[name], seen)
        if name.startswith("__") and name.endswith("__"):
            return UNKNOWN  # module attributes such as __file__, __path__, __spec__
        found = self._from_stars(info, name, seen)
        if found is not None:
            return found
        if info.source.is_package and self.module(f"{module}.{name}") is not None:
            return ModuleSym(f"{module}.{name}")
        if info.has_getattr:
            return UNKNOWN
        return Missing(f"{module} has no name {name!r}", f"looked in {self._where(info)}")

    def _where(self, info: ModuleInfo) -> str:
        where = info.source.rel + (" [patched]" if info.source.origin == "patched" else "")
        stars = [s for s in info.stars if self.module(s) is not None]
        return where + (f" and its star imports from {', '.join(stars)}" if stars else "")

    def _from_stars(self, info: ModuleInfo, name: str, seen: frozenset) -> Sym | None:
        for star in info.stars:
            if not self.checked(star):
                return External(f"{star}.{name}")
            exported = self.exports(star, seen)
            if exported is None or name in exported:
                found = self.resolve(star, name, seen)
                if not isinstance(found, Missing):
                    return found
        return None

    def exports(self, module: str, seen: frozenset = frozenset()) -> set[str] | None:
        """What ``from module import *`` binds; None when it cannot be known statically."""
        info = self.module(module)
        if info is None or info.tree is None or info.all_dynamic or module in seen:
            return None if info is None or info.all_dynamic or info.tree is None else set()
        if info.all_names is not None:
            return set(info.all_names)
        names = {n for n in info.bindings if not n.startswith("_")}
        for star in info.stars:
            sub = self.exports(star, seen | {module}) if self.checked(star) else None
            if sub is None:
                return None
            names |= sub
        return names

    def _follow(self, info: ModuleInfo, name: str, bindings: list[Binding], seen) -> Sym:
        binding = _single(bindings)
        if binding is None:
            return UNKNOWN
        if binding.kind == "import":
            (target,) = binding.target
            return ModuleSym(target) if self.checked(target) else External(target)
        if binding.kind == "from":
            source, attr = binding.target
            if not self.checked(source):
                return External(f"{source}.{attr}")
            found = self.resolve(source, attr, seen)
            if isinstance(found, Missing) and self.module(f"{source}.{attr}") is not None:
                return ModuleSym(f"{source}.{attr}")
            return found
        if binding.kind == "def":
            return FuncSym(info.source.name, binding.node, f"{info.source.name}.{name}", False)
        if binding.kind == "class":
            return ClassSym(info.source.name, binding.node, f"{info.source.name}.{name}")
        return UNKNOWN

    # classes -------------------------------------------------------------------------

    def class_model(self, cls: ClassSym) -> ClassModel:
        key = id(cls.node)
        if key not in self._class_cache:
            self._class_cache[key] = _build_class_model(self, cls)
        return self._class_cache[key]

    def mro(self, cls: ClassSym, seen: frozenset = frozenset()) -> tuple[list[ClassSym], bool]:
        """(linearised resolved classes, open): open when a base is external or unknown
        (other than the transparent ones and nn.Module)."""
        if id(cls.node) in seen:
            return [cls], True
        if id(cls.node) not in self._mro_cache:
            self._mro_cache[id(cls.node)] = self._mro(cls, seen)
        return self._mro_cache[id(cls.node)]

    def _mro(self, cls: ClassSym, seen: frozenset) -> tuple[list[ClassSym], bool]:
        chains: list[list[ClassSym]] = []
        is_open = False
        for base in self.class_model(cls).bases:
            if isinstance(base, ClassSym):
                chain, base_open = self.mro(base, seen | {id(cls.node)})
                chains.append(chain)
                is_open = is_open or base_open
            elif not _known_external(base):
                is_open = True
        return [cls] + _c3_merge(
            chains + [[b for b in self.class_model(cls).bases if isinstance(b, ClassSym)]]
        ), is_open

    def subclasses(self, cls: ClassSym) -> list[ClassSym]:
        """Every class in the tree deriving from ``cls`` (transitively), found by a text
        scan for its name in class statements, then confirmed by resolving bases."""
        key = id(cls.node)
        if key in self._subclass_cache:
            return self._subclass_cache[key]
        self._subclass_cache[key] = []  # cycle guard
        found: list[ClassSym] = []
        pattern = re.compile(r"^\s*class\s+\w+\s*\(([^)]*)\)", re.M)
        for module, text in self._package_files(cls.module):
            if cls.node.name not in text:
                continue
            if not any(cls.node.name in m.group(1) for m in pattern.finditer(text)):
                continue
            info = self.module(module)
            if info is None or info.tree is None:
                continue
            for node in ast.walk(info.tree):
                if isinstance(node, ast.ClassDef) and self._derives(module, node, cls):
                    sub = ClassSym(module, node, f"{module}.{node.name}")
                    found.append(sub)
                    found.extend(self.subclasses(sub))
        self._subclass_cache[key] = found
        return found

    def _derives(self, module: str, node: ast.ClassDef, cls: ClassSym) -> bool:
        for base in node.bases:
            sym = _resolve_in_module(self, module, base)
            if isinstance(sym, ClassSym) and sym.node is cls.node:
                return True
        return False

    def _package_files(self, module: str) -> list[tuple[str, str]]:
        """(module, text) of every source file of ``module``'s top-level package."""
        if self._files is None:
            self._files = []
        top = module.split(".")[0]
        cached = [f for f in self._files if f[0].split(".")[0] == top]
        if cached:
            return cached
        seen: set[str] = set()
        for rel, data in self.sources.overlay.items():
            if rel.startswith(f"{top}/") and rel.endswith(".py") and data is not None:
                seen.add(rel)
                cached.append((_module_name(rel), _decode(data)))
        for root in self.sources.roots:
            for path in sorted((root / top).rglob("*.py")):
                rel = path.relative_to(root).as_posix()
                if rel not in seen:
                    seen.add(rel)
                    cached.append((_module_name(rel), _decode(path.read_bytes())))
        self._files.extend(cached)
        return cached

    def extra_attrs(self, cls: ClassSym) -> frozenset[str]:
        mro, _ = self.mro(cls)
        for c in mro:
            if any(
                isinstance(b, External) and b.qualname in _NN_MODULE
                for b in self.class_model(c).bases
            ):
                return _NN_MODULE_ATTRS
        return frozenset()


def _module_name(rel: str) -> str:
    parts = rel[: -len(".py")].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _single(bindings: list[Binding]) -> Binding | None:
    """The one runtime binding of a name, or None when it is conditional/ambiguous.
    ``@overload`` stubs before the implementation do not count."""
    real = [b for b in bindings if not (b.kind == "def" and _has_decorator(b.node, "overload"))]
    return real[0] if len(real) == 1 else None


def _known_external(sym: Sym) -> bool:
    return isinstance(sym, External) and (
        sym.qualname in _TRANSPARENT_BASES or sym.qualname in _NN_MODULE
    )


def _c3_merge(seqs: list[list[ClassSym]]) -> list[ClassSym]:
    seqs = [list(s) for s in seqs if s]
    out: list[ClassSym] = []
    while seqs:
        for seq in seqs:
            head = seq[0]
            if not any(head in s[1:] for s in seqs):
                break
        else:  # inconsistent hierarchy: fall back to depth-first order
            rest = [c for s in seqs for c in s]
            return out + [c for i, c in enumerate(rest) if c not in rest[:i] and c not in out]
        out.append(head)
        seqs = [[c for c in s if c != head] for s in seqs]
        seqs = [s for s in seqs if s]
    return out


def _decorator_name(node: ast.expr) -> str:
    target = node.func if isinstance(node, ast.Call) else node
    if isinstance(target, ast.Attribute):
        return target.attr
    return target.id if isinstance(target, ast.Name) else ""


def _has_decorator(node: ast.AST, name: str) -> bool:
    decorators = getattr(node, "decorator_list", [])
    return any(_decorator_name(d) == name for d in decorators)


# --- class models ------------------------------------------------------------------------


@dataclass(frozen=True)
class ClassModel:
    bases: tuple[Sym, ...]
    members: dict[str, ast.AST]  # class-body bindings (last wins)
    instance_attrs: frozenset[str]  # assigned through self/cls in any method
    dynamic: bool  # defines __getattr__/__getattribute__
    dataclass_like: dict | None  # decorator keywords when dataclass-like, else None
    odd_decorators: bool  # a class decorator that may change construction


def _build_class_model(index: Index, cls: ClassSym) -> ClassModel:
    node = cls.node
    bases = tuple(_resolve_in_module(index, cls.module, b) for b in node.bases)
    if any(k.arg == "metaclass" for k in node.keywords):
        bases = bases + (UNKNOWN,) if not _abc_meta(node) else bases
    members: dict[str, ast.AST] = {}
    for stmt in _top_statements(node.body):
        for name in _statement_names(stmt):
            members[name] = stmt
    dataclass_like, odd = _class_decorators(index, cls)
    return ClassModel(
        bases=bases,
        members=members,
        instance_attrs=frozenset(_instance_attrs(node)),
        dynamic=bool({"__getattr__", "__getattribute__"} & members.keys()),
        dataclass_like=dataclass_like,
        odd_decorators=odd,
    )


def _abc_meta(node: ast.ClassDef) -> bool:
    return all(
        _decorator_name(k.value) in ("ABCMeta",) for k in node.keywords if k.arg == "metaclass"
    )


def _statement_names(stmt: ast.stmt) -> Iterator[str]:
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        yield stmt.name
    elif isinstance(stmt, ast.Assign):
        for target in stmt.targets:
            yield from _target_names(target)
    elif isinstance(stmt, ast.AnnAssign | ast.AugAssign):
        yield from _target_names(stmt.target)
    elif isinstance(stmt, ast.Import | ast.ImportFrom):
        for alias in stmt.names:
            yield alias.asname or alias.name.split(".")[0]
    elif isinstance(stmt, ast.For | ast.AsyncFor | ast.With | ast.AsyncWith):
        for target in _loop_or_with_targets(stmt):
            yield from _target_names(target)
    if isinstance(stmt, ast.Assign) and any(
        getattr(t, "id", None) == "__slots__" for t in stmt.targets
    ):
        yield from _string_list(stmt.value) or ()


def _self_names(func: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    if _has_decorator(func, "staticmethod"):
        return None
    params = func.args.posonlyargs + func.args.args
    return params[0].arg if params else None


def _methods(node: ast.ClassDef) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for stmt in _top_statements(node.body):
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            yield stmt


def _instance_attrs(node: ast.ClassDef) -> set[str]:
    """Attributes set through the first parameter of any method (any nesting depth),
    by assignment, ``setattr(self, "x", ...)`` or nn.Module registration calls; also
    names guarded by ``hasattr(self, "x")``. A class that sets attributes under computed
    names (``setattr(self, name, ...)``) is taken to set every string literal it holds."""
    names: set[str] = set()
    dynamic = False
    for method in _methods(node):
        self_name = _self_names(method)
        if self_name is None:
            continue
        for sub in ast.walk(method):
            names.update(_attr_set_by(sub, self_name))
            dynamic = dynamic or _sets_computed_name(sub, self_name)
    if dynamic:
        strings = (n.value for n in ast.walk(node) if isinstance(n, ast.Constant))
        names.update(v for v in strings if isinstance(v, str))
    return names


def _sets_computed_name(node: ast.AST, self_name: str) -> bool:
    if not isinstance(node, ast.Call) or not node.args:
        return False
    func, first = node.func, node.args[0]
    if isinstance(func, ast.Name) and func.id == "setattr" and len(node.args) > 1:
        return _is_name(first, self_name) and not isinstance(node.args[1], ast.Constant)
    return (
        isinstance(func, ast.Attribute)
        and func.attr in _REGISTERING_CALLS
        and _is_name(func.value, self_name)
        and not isinstance(first, ast.Constant)
    )


def _attr_set_by(node: ast.AST, self_name: str) -> Iterator[str]:
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store | ast.Del)
        and _is_name(node.value, self_name)
    ):
        yield node.attr
    if not isinstance(node, ast.Call) or not node.args:
        return
    first = node.args[0]
    func = node.func
    if isinstance(func, ast.Name) and func.id in ("setattr", "hasattr") and len(node.args) > 1:
        if _is_name(first, self_name) and isinstance(node.args[1], ast.Constant):
            yield str(node.args[1].value)
    elif (
        isinstance(func, ast.Attribute)
        and func.attr in _REGISTERING_CALLS
        and _is_name(func.value, self_name)
        and isinstance(first, ast.Constant)
    ):
        yield str(first.value)


def _is_name(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _class_decorators(index: Index, cls: ClassSym) -> tuple[dict | None, bool]:
    dataclass_like: dict | None = None
    odd = False
    for deco in cls.node.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        sym = _resolve_in_module(index, cls.module, target)
        if _is_dataclass_maker(sym):
            keywords = deco.keywords if isinstance(deco, ast.Call) else []
            dataclass_like = {k.arg: k.value for k in keywords if k.arg}
        elif _decorator_name(deco) != "final":
            odd = True
    return dataclass_like, odd


def _is_dataclass_maker(sym: Sym) -> bool:
    if isinstance(sym, External):
        return sym.qualname.rsplit(".", 1)[-1] == "dataclass"
    if isinstance(sym, FuncSym):
        return _has_decorator(sym.node, "dataclass_transform")
    return False


def _resolve_in_module(index: Index, module: str, expr: ast.AST) -> Sym:
    """An expression evaluated in a module's global scope (class bases, decorators)."""
    if isinstance(expr, ast.Subscript):
        return _resolve_in_module(index, module, expr.value)
    if isinstance(expr, ast.Name):
        if expr.id == "object":
            info = index.module(module)
            if info is None or "object" not in info.bindings:
                return External("object")
        found = index.resolve(module, expr.id)
        return UNKNOWN if isinstance(found, Missing) else found
    if isinstance(expr, ast.Attribute):
        return _attribute_of(index, _resolve_in_module(index, module, expr.value), expr.attr)
    return UNKNOWN


def _attribute_of(index: Index, owner: Sym, attr: str) -> Sym:
    if isinstance(owner, External):
        return External(f"{owner.qualname}.{attr}")
    if isinstance(owner, ModuleSym):
        return index.resolve(owner.name, attr)
    if isinstance(owner, ClassSym):
        return class_member(index, owner, attr, bound=False)
    return UNKNOWN


def class_member(index: Index, cls: ClassSym, attr: str, *, bound: bool, after=None) -> Sym:
    """``attr`` looked up on a class (``bound``: through an instance); ``after``: skip
    the MRO up to and including that class (``super()``)."""
    mro, _ = index.mro(cls)
    if after is not None:
        ids = [id(c.node) for c in mro]
        mro = mro[ids.index(id(after.node)) + 1 :] if id(after.node) in ids else []
    for c in mro:
        model = index.class_model(c)
        if bound and attr in model.instance_attrs:
            return UNKNOWN
        if attr in model.members:
            return _member_sym(c, attr, model.members[attr], bound)
    return UNKNOWN  # not a static member: instance data, or an open/external base


def _member_sym(cls: ClassSym, attr: str, node: ast.AST, bound: bool) -> Sym:
    if isinstance(node, ast.ClassDef):
        return ClassSym(cls.module, node, f"{cls.qualname}.{attr}")
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return UNKNOWN
    if _has_decorator(node, "property") or _has_decorator(node, "cached_property"):
        return UNKNOWN
    if _has_decorator(node, "staticmethod") or attr == "__new__":
        drop = False
    elif _has_decorator(node, "classmethod"):
        drop = True
    else:
        drop = bound
    return FuncSym(cls.module, node, f"{cls.qualname}.{attr}", drop)


# --- signatures --------------------------------------------------------------------------


@dataclass(frozen=True)
class Signature:
    positional: tuple[str, ...]  # positional-only then positional-or-keyword
    posonly: int
    kwonly: tuple[str, ...]
    required: frozenset[str]
    varargs: bool
    varkw: bool
    where: str

    def without_first(self) -> Signature:
        if not self.positional:
            return self
        first = self.positional[0]
        return replace(
            self,
            positional=self.positional[1:],
            posonly=max(0, self.posonly - 1),
            required=self.required - {first},
        )


def _function_signature(index: Index, func: FuncSym) -> Signature | None:
    node = func.node
    if any(_decorator_name(d) not in _SIGNATURE_KEEPING for d in node.decorator_list):
        return None
    args = node.args
    positional = tuple(a.arg for a in args.posonlyargs + args.args)
    n_required = len(positional) - len(args.defaults)
    required = set(positional[:n_required])
    required |= {a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None}
    where = f"def {func.qualname} at {_module_rel(index, func.module)}:{node.lineno}"
    sig = Signature(
        positional=positional,
        posonly=len(args.posonlyargs),
        kwonly=tuple(a.arg for a in args.kwonlyargs),
        required=frozenset(required),
        varargs=args.vararg is not None,
        varkw=args.kwarg is not None,
        where=where,
    )
    return sig.without_first() if func.drop_first else sig


def _module_rel(index: Index, module: str) -> str:
    info = index.module(module)
    return info.source.rel if info is not None else module


def constructor_signature(index: Index, cls: ClassSym) -> Signature | None:
    """What ``cls(...)`` binds to, or None when construction is not static."""
    mro, _ = index.mro(cls)
    for c in mro:
        model = index.class_model(c)
        if model.odd_decorators or "__new__" in model.members or "__call__" in model.members:
            return None
        if "__init__" in model.members:
            init = _member_sym(c, "__init__", model.members["__init__"], True)
            return _function_signature(index, init) if isinstance(init, FuncSym) else None
        if model.dataclass_like is not None:
            return None if index.mro(c)[1] else _dataclass_signature(index, cls, c)
        if any(not isinstance(b, ClassSym) and not _plain_base(b) for b in model.bases):
            return None
    return None  # reached object: no explicit __init__ is rare enough to skip


def _plain_base(sym: Sym) -> bool:
    return isinstance(sym, External) and sym.qualname in _TRANSPARENT_BASES


def _dataclass_signature(index: Index, cls: ClassSym, first: ClassSym) -> Signature | None:
    mro, _ = index.mro(cls)
    fields: dict[str, tuple[bool, bool]] = {}  # name -> (required, kw_only)
    for c in reversed(mro[mro.index(first) :]):
        model = index.class_model(c)
        if model.dataclass_like is None:
            continue
        if _false(model.dataclass_like.get("init")):
            return None
        kw_only = _true(model.dataclass_like.get("kw_only"))
        for stmt in c.node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                if _is_type_name(stmt.annotation, "KW_ONLY"):
                    kw_only = True
                    continue
                entry = _field_entry(stmt, kw_only)
                if entry is None:
                    fields.pop(stmt.target.id, None)
                else:
                    fields[stmt.target.id] = entry
    positional = tuple(n for n, (_, kw) in fields.items() if not kw)
    return Signature(
        positional=positional,
        posonly=0,
        kwonly=tuple(n for n, (_, kw) in fields.items() if kw),
        required=frozenset(n for n, (req, _) in fields.items() if req),
        varargs=False,
        varkw=False,
        where=f"dataclass {cls.qualname} at {_module_rel(index, cls.module)}:{cls.node.lineno}",
    )


def _field_entry(stmt: ast.AnnAssign, kw_only: bool) -> tuple[bool, bool] | None:
    if _is_type_name(stmt.annotation, "ClassVar"):
        return None
    value = stmt.value
    if isinstance(value, ast.Call) and _decorator_name(value) in ("field", "Field"):
        keywords = {k.arg: k.value for k in value.keywords if k.arg}
        if _false(keywords.get("init")):
            return None
        has_default = bool(value.args) or "default" in keywords or "default_factory" in keywords
        return (not has_default, kw_only or _true(keywords.get("kw_only")))
    return (value is None, kw_only)


def _is_type_name(node: ast.AST, name: str) -> bool:
    if isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.split("[")[0].rsplit(".", 1)[-1] == name
    return _decorator_name(node) == name


def _true(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _false(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


def bind_problems(sig: Signature, call: ast.Call) -> list[str]:
    """Why ``call`` cannot bind to ``sig`` (inspect.Signature.bind, statically)."""
    n_pos = sum(not isinstance(a, ast.Starred) for a in call.args)
    star = any(isinstance(a, ast.Starred) for a in call.args)
    double_star = any(k.arg is None for k in call.keywords)
    problems: list[str] = []
    if not star and not sig.varargs and n_pos > len(sig.positional):
        problems.append(f"takes {len(sig.positional)} positional arguments but {n_pos} were given")
    bound = set(sig.positional[:n_pos])
    for kw in (k.arg for k in call.keywords if k.arg):
        if kw in sig.positional[: sig.posonly]:
            if not sig.varkw:
                problems.append(f"got positional-only argument {kw!r} as a keyword")
        elif kw in sig.positional or kw in sig.kwonly:
            if kw in bound and not star:
                problems.append(f"got multiple values for argument {kw!r}")
            bound.add(kw)
        elif not sig.varkw:
            problems.append(f"got an unexpected keyword argument {kw!r}")
    if not double_star:
        candidates = (() if star else sig.positional) + sig.kwonly
        missing = [p for p in candidates if p in sig.required and p not in bound]
        if missing:
            names = ", ".join(repr(m) for m in missing)
            problems.append(f"is missing required argument{'s' * (len(missing) > 1)} {names}")
    return problems


# --- the per-file checker ----------------------------------------------------------------


@dataclass
class _Scope:
    kind: str  # "module", "function", "class"
    names: dict[str, list[Binding]]
    cls: ClassSym | None = None
    self_name: str | None = None
    self_is_class: bool = False  # first parameter is the class (classmethod, __new__)


class _FileChecker(ast.NodeVisitor):
    def __init__(self, index: Index, path: str, info: ModuleInfo) -> None:
        self.index = index
        self.path = path
        self.info = info
        self.module = info.source.name
        self.findings: list[Finding] = []
        self.scopes: list[_Scope] = [_Scope("module", {})]
        self.self_reads: list[tuple[ClassSym, str, int]] = []
        self.optional_imports = 0  # depth of try blocks that catch ImportError

    def report(self, line: int, missing: str, where: str, subject: str) -> None:
        self.findings.append(Finding(self.path, line, missing, where, subject))

    # imports -------------------------------------------------------------------------

    def visit_Try(self, node: ast.Try | ast.TryStar) -> None:
        optional = any(_catches_import_error(h.type) for h in node.handlers)
        self.optional_imports += optional
        for stmt in node.body:
            self.visit(stmt)
        self.optional_imports -= optional
        for part in (*node.handlers, *node.orelse, *node.finalbody):
            self.visit(part)

    visit_TryStar = visit_Try

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_module(node.lineno, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        source = _absolute(self.module, self.info.source.is_package, node.level, node.module)
        if not self._check_module(node.lineno, source):
            return
        for alias in node.names:
            if alias.name == "*":
                continue
            found = self.index.resolve(source, alias.name)
            if isinstance(found, Missing) and not self.optional_imports:
                self.report(node.lineno, found.what, found.where, f"{source}.{alias.name}")

    def _check_module(self, line: int, module: str) -> bool:
        if not self.index.checked(module) or self.optional_imports:
            return False
        parts = module.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if self.index.module(prefix) is None:
                where = f"looked for {prefix.replace('.', '/')}.py and its __init__.py"
                self.report(line, f"no module {prefix}", where, prefix)
                return False
        return True

    # scopes --------------------------------------------------------------------------

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for sub in node.bases + node.keywords + node.decorator_list:
            self.visit(sub)
        cls = self._class_sym(node)
        names, _ = _scope_bindings(self.module, self.info.source.is_package, node.body)
        self.scopes.append(_Scope("class", names, cls=cls))
        for stmt in node.body:
            self.visit(stmt)
        self.scopes.pop()

    def _class_sym(self, node: ast.ClassDef) -> ClassSym:
        outer = [s.cls.node.name for s in self.scopes if s.cls is not None]
        qual = ".".join([self.module, *outer, node.name])
        return ClassSym(self.module, node, qual)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for sub in node.decorator_list + node.args.defaults + node.args.kw_defaults:
            if sub is not None:
                self.visit(sub)
        parent = self.scopes[-1]
        names = _function_locals(self.module, self.info.source.is_package, node)
        if parent.kind == "class":
            is_class = _has_decorator(node, "classmethod") or node.name in _CLASS_FIRST
            scope = _Scope("function", names, parent.cls, _self_names(node), is_class)
        else:
            inherited = parent.self_name if parent.self_name not in names else None
            scope = _Scope("function", names, parent.cls, inherited, parent.self_is_class)
        self.scopes.append(scope)
        for stmt in node.body:
            self.visit(stmt)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        parent = self.scopes[-1]
        names = {a.arg: [Binding("value", a)] for a in _all_args(node.args)}
        inherited = parent.self_name if parent.self_name not in names else None
        self.scopes.append(_Scope("function", names, parent.cls, inherited, parent.self_is_class))
        self.visit(node.body)
        self.scopes.pop()

    # names and attributes ------------------------------------------------------------

    def lookup(self, name: str) -> Sym:
        innermost = True
        for scope in reversed(self.scopes):
            if scope.kind == "class" and not innermost:
                continue
            innermost = False
            if scope.kind == "module":
                break
            if name in scope.names:
                binding = _single(scope.names[name])
                if binding is None or binding.kind not in ("import", "from"):
                    return UNKNOWN
                return self.index._follow(self.info, name, [binding], frozenset())
        found = self.index.resolve(self.module, name)
        return UNKNOWN if isinstance(found, Missing) else found

    def evaluate(self, expr: ast.AST) -> Sym:
        if isinstance(expr, ast.Name):
            scope = self.scopes[-1]
            if scope.self_name == expr.id and scope.cls is not None:
                return _Instance(scope.cls, scope.self_is_class)  # type: ignore[return-value]
            return self.lookup(expr.id)
        if isinstance(expr, ast.Attribute):
            owner = self.evaluate(expr.value)
            if isinstance(owner, _Instance):
                return class_member(self.index, owner.cls, expr.attr, bound=not owner.is_class)
            if isinstance(owner, Super):
                scope = self.scopes[-1]
                if scope.cls is None:
                    return UNKNOWN
                return class_member(self.index, scope.cls, expr.attr, bound=True, after=owner.cls)
            return _attribute_of(self.index, owner, expr.attr)
        if isinstance(expr, ast.Call) and _is_name(expr.func, "super") and not expr.args:
            scope = self.scopes[-1]
            return Super(scope.cls) if scope.cls is not None and scope.self_name else UNKNOWN
        return UNKNOWN

    def visit_Attribute(self, node: ast.Attribute) -> None:
        scope = self.scopes[-1]
        if (
            isinstance(node.ctx, ast.Load)
            and scope.cls is not None
            and scope.self_name is not None
            and _is_name(node.value, scope.self_name)
        ):
            self.self_reads.append((scope.cls, node.attr, node.lineno))
        elif isinstance(node.ctx, ast.Load):
            owner = self.evaluate(node.value)
            if isinstance(owner, ModuleSym):
                found = self.index.resolve(owner.name, node.attr)
                if isinstance(found, Missing):
                    self.report(node.lineno, found.what, found.where, f"{owner.name}.{node.attr}")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        callee = self.evaluate(node.func)
        sig: Signature | None = None
        if isinstance(callee, FuncSym):
            sig = _function_signature(self.index, callee)
        elif isinstance(callee, ClassSym):
            sig = constructor_signature(self.index, callee)
        if sig is not None:
            name = callee.qualname
            for problem in bind_problems(sig, node):
                self.report(node.lineno, f"call to {name} {problem}", sig.where, name)
        self.generic_visit(node)

    # self.X --------------------------------------------------------------------------

    def check_self_reads(self) -> None:
        """One finding per (class, attribute), at its first read."""
        lines: dict[tuple[int, str], list[int]] = {}
        classes: dict[int, ClassSym] = {}
        for cls, attr, line in self.self_reads:
            if attr.startswith("__") and attr.endswith("__"):
                continue
            lines.setdefault((id(cls.node), attr), []).append(line)
            classes[id(cls.node)] = cls
        for (key, attr), found in lines.items():
            cls = classes[key]
            known = self.index_attrs(cls)
            if known is None or attr in known or attr in self.subclass_attrs(cls):
                continue
            more = f", read {len(found)} times" if len(found) > 1 else ""
            where = f"looked in {self._mro_text(cls)}{more}"
            name = cls.node.name
            self.report(min(found), f"{name} never sets self.{attr}", where, f"{name}.{attr}")

    def index_attrs(self, cls: ClassSym) -> set[str] | None:
        mro, is_open = self.index.mro(cls)
        if is_open:
            return None
        known: set[str] = set(self.index.extra_attrs(cls))
        for c in mro:
            model = self.index.class_model(c)
            if model.dynamic:
                return None
            known |= model.members.keys() | model.instance_attrs
        return known

    def subclass_attrs(self, cls: ClassSym) -> set[str]:
        """What subclasses set: a base may read what every concrete subclass provides."""
        names: set[str] = set()
        for sub in self.index.subclasses(cls):
            model = self.index.class_model(sub)
            names |= model.members.keys() | model.instance_attrs
        return names

    def _mro_text(self, cls: ClassSym) -> str:
        mro, _ = self.index.mro(cls)
        parts = [f"{c.node.name} ({_module_rel(self.index, c.module)})" for c in mro]
        if self.index.extra_attrs(cls):
            parts.append("torch.nn.Module")
        return ", ".join(parts)


def _catches_import_error(node: ast.expr | None) -> bool:
    """A handler for ImportError (or anything broader): the import is optional."""
    if node is None:
        return True
    names = node.elts if isinstance(node, ast.Tuple) else [node]
    broad = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
    return any(_decorator_name(n) in broad for n in names)


@dataclass(frozen=True)
class _Instance:
    cls: ClassSym
    is_class: bool


def _all_args(args: ast.arguments) -> list[ast.arg]:
    extra = [a for a in (args.vararg, args.kwarg) if a is not None]
    return args.posonlyargs + args.args + args.kwonlyargs + extra


def _function_locals(
    module: str, is_package: bool, node: ast.FunctionDef | ast.AsyncFunctionDef
) -> dict[str, list[Binding]]:
    """Names a function binds locally: imports keep their target, the rest is opaque."""
    names: dict[str, list[Binding]] = {a.arg: [Binding("value", a)] for a in _all_args(node.args)}
    declared: set[str] = set()
    for sub in _walk_function(node):
        if isinstance(sub, ast.Global | ast.Nonlocal):
            declared.update(sub.names)
        elif isinstance(sub, ast.Import | ast.ImportFrom):
            bindings, _ = _scope_bindings(module, is_package, [sub])
            for name, found in bindings.items():
                names.setdefault(name, []).extend(found)
        elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store | ast.Del):
            names.setdefault(sub.id, []).append(Binding("value", sub))
        elif isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.setdefault(sub.name, []).append(Binding("value", sub))
        elif isinstance(sub, ast.ExceptHandler) and sub.name:
            names.setdefault(sub.name, []).append(Binding("value", sub))
    for name in declared:
        names.pop(name, None)
    return names


def _walk_function(node: ast.AST) -> Iterator[ast.AST]:
    """Nodes of a function body, not descending into nested defs, classes or lambdas."""
    todo = list(ast.iter_child_nodes(node))
    while todo:
        sub = todo.pop()
        yield sub
        if not isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            todo.extend(ast.iter_child_nodes(sub))


# --- entry points ------------------------------------------------------------------------


def _validate_allow(allow: Mapping[str, str]) -> None:
    for key, reason in allow.items():
        if not _ALLOW_KEY.match(key):
            raise SeriesError(
                f"[linkcheck.allow] key is not '<path>.py:<subject>': {key!r}",
                hint='e.g. "models/x/attention.py:DeepseekV4Attention.foo" = "set by a hook"',
            )
        if not str(reason).strip():
            raise SeriesError(f"[linkcheck.allow] entry needs a reason: {key!r}")


def check(
    sources: SourceTree,
    touched: Mapping[str, bytes | None],
    allow: Mapping[str, str],
    *,
    package: str = PACKAGE,
    report_stale: bool = True,
) -> list[Finding]:
    """Findings for every touched ``.py`` file (paths relative to the ``package`` dir;
    their patched bytes must also be in ``sources.overlay``), allowlist applied."""
    _validate_allow(allow)
    index = Index(sources)
    findings: list[Finding] = []
    for path in sorted(touched):
        if path.endswith(".py") and touched[path] is not None:
            findings.extend(_check_file(index, package, path))
    kept = [f for f in findings if f.key not in allow]
    if report_stale:
        used = {f.key for f in findings}
        for key in sorted(allow):
            path = key.split(":", 1)[0]
            if key not in used and path in touched:
                kept.append(
                    Finding(
                        path,
                        0,
                        f"allowlist entry {key!r} matches nothing",
                        "series.toml [linkcheck.allow]",
                        key.split(":", 1)[1],
                    )
                )
    return sorted(set(kept), key=lambda f: (f.path, f.line, f.missing))


def _check_file(index: Index, package: str, path: str) -> list[Finding]:
    module = ".".join([package, *path[: -len(".py")].split("/")])
    if module.endswith(".__init__"):
        module = module[: -len(".__init__")]
    info = index.module(module)
    if info is None or info.tree is None:
        why = info.error if info is not None and info.error else "not found in the overlay"
        return [Finding(path, 1, f"cannot check {module}", why, module)]
    checker = _FileChecker(index, path, info)
    checker.visit(info.tree)
    checker.check_self_reads()
    return checker.findings


def package_root(pristine_root: Path, package: str = PACKAGE) -> Path:
    """The directory holding ``package/`` (accepts that dir or the package dir itself)."""
    pristine_root = Path(pristine_root)
    if (pristine_root / package / "__init__.py").is_file():
        return pristine_root
    if pristine_root.name == package and (pristine_root / "__init__.py").is_file():
        return pristine_root.parent
    raise BakeryError(f"no {package}/__init__.py under the pristine tree: {str(pristine_root)!r}")


def run_linkcheck(
    series: Series,
    pristine_root: Path,
    thirdparty_roots: list[Path],
    only: tuple[str, ...] = (),
) -> list[Finding]:
    """Apply the series (or ``only`` its named patches) in memory and check the result."""
    root = package_root(pristine_root)
    patches = series.select(only) if only else series.patches
    result = plan(root / PACKAGE, patches, max_fuzz=series.max_fuzz)
    overlay = {f"{PACKAGE}/{path}": data for path, data in result.after.items()}
    sources = SourceTree((root, *map(Path, thirdparty_roots)), overlay)
    return check(sources, result.after, series.allow_names, report_stale=not only)
