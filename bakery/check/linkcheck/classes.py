"""What a class defined in the tree looks like: bases, members, the attributes its methods
set through ``self``, its MRO and its subclasses; and attribute lookup through it.

A class is *open* (its attributes cannot be known) when a base is external or unknown,
other than ``object``/``ABC``/``Generic``/``Protocol`` and ``torch.nn.Module``, whose
attributes are listed here.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass

from bakery.check.linkcheck.index import ModuleIndex
from bakery.check.linkcheck.scopes import (
    decorator_name,
    has_decorator,
    is_name,
    loop_or_with_targets,
    string_list,
    target_names,
    top_statements,
)
from bakery.check.linkcheck.sources import SourceTree
from bakery.check.linkcheck.symbols import (
    UNKNOWN,
    ClassSym,
    External,
    FuncSym,
    Missing,
    ModuleSym,
    Sym,
)

TRANSPARENT_BASES = frozenset(
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


class ClassIndex(ModuleIndex):
    """A ModuleIndex that also knows classes: models, MROs and subclasses (memoised)."""

    def __init__(self, sources: SourceTree) -> None:
        super().__init__(sources)
        self._class_cache: dict[int, ClassModel] = {}
        self._mro_cache: dict[int, tuple[list[ClassSym], bool]] = {}
        self._subclass_cache: dict[int, list[ClassSym]] = {}

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
        for module, text in self.package_files(cls.module):
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
            sym = resolve_in_module(self, module, base)
            if isinstance(sym, ClassSym) and sym.node is cls.node:
                return True
        return False

    def extra_attrs(self, cls: ClassSym) -> frozenset[str]:
        mro, _ = self.mro(cls)
        for c in mro:
            if any(
                isinstance(b, External) and b.qualname in _NN_MODULE
                for b in self.class_model(c).bases
            ):
                return _NN_MODULE_ATTRS
        return frozenset()


def _known_external(sym: Sym) -> bool:
    return isinstance(sym, External) and (
        sym.qualname in TRANSPARENT_BASES or sym.qualname in _NN_MODULE
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


# --- class models ------------------------------------------------------------------------


@dataclass(frozen=True)
class ClassModel:
    bases: tuple[Sym, ...]
    members: dict[str, ast.AST]  # class-body bindings (last wins)
    instance_attrs: frozenset[str]  # assigned through self/cls in any method
    dynamic: bool  # defines __getattr__/__getattribute__
    dataclass_like: dict | None  # decorator keywords when dataclass-like, else None
    odd_decorators: bool  # a class decorator that may change construction


def _build_class_model(index: ClassIndex, cls: ClassSym) -> ClassModel:
    node = cls.node
    bases = tuple(resolve_in_module(index, cls.module, b) for b in node.bases)
    if any(k.arg == "metaclass" for k in node.keywords):
        bases = bases + (UNKNOWN,) if not _abc_meta(node) else bases
    members: dict[str, ast.AST] = {}
    for stmt in top_statements(node.body):
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
        decorator_name(k.value) in ("ABCMeta",) for k in node.keywords if k.arg == "metaclass"
    )


def _statement_names(stmt: ast.stmt) -> Iterator[str]:
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        yield stmt.name
    elif isinstance(stmt, ast.Assign):
        for target in stmt.targets:
            yield from target_names(target)
    elif isinstance(stmt, ast.AnnAssign | ast.AugAssign):
        yield from target_names(stmt.target)
    elif isinstance(stmt, ast.Import | ast.ImportFrom):
        for alias in stmt.names:
            yield alias.asname or alias.name.split(".")[0]
    elif isinstance(stmt, ast.For | ast.AsyncFor | ast.With | ast.AsyncWith):
        for target in loop_or_with_targets(stmt):
            yield from target_names(target)
    if isinstance(stmt, ast.Assign) and any(
        getattr(t, "id", None) == "__slots__" for t in stmt.targets
    ):
        yield from string_list(stmt.value) or ()


def self_param_name(func: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    if has_decorator(func, "staticmethod"):
        return None
    params = func.args.posonlyargs + func.args.args
    return params[0].arg if params else None


def _methods(node: ast.ClassDef) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for stmt in top_statements(node.body):
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
        self_name = self_param_name(method)
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
        return is_name(first, self_name) and not isinstance(node.args[1], ast.Constant)
    return (
        isinstance(func, ast.Attribute)
        and func.attr in _REGISTERING_CALLS
        and is_name(func.value, self_name)
        and not isinstance(first, ast.Constant)
    )


def _attr_set_by(node: ast.AST, self_name: str) -> Iterator[str]:
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store | ast.Del)
        and is_name(node.value, self_name)
    ):
        yield node.attr
    if not isinstance(node, ast.Call) or not node.args:
        return
    first = node.args[0]
    func = node.func
    if isinstance(func, ast.Name) and func.id in ("setattr", "hasattr") and len(node.args) > 1:
        if is_name(first, self_name) and isinstance(node.args[1], ast.Constant):
            yield str(node.args[1].value)
    elif (
        isinstance(func, ast.Attribute)
        and func.attr in _REGISTERING_CALLS
        and is_name(func.value, self_name)
        and isinstance(first, ast.Constant)
    ):
        yield str(first.value)


def _class_decorators(index: ClassIndex, cls: ClassSym) -> tuple[dict | None, bool]:
    dataclass_like: dict | None = None
    odd = False
    for deco in cls.node.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        sym = resolve_in_module(index, cls.module, target)
        if _is_dataclass_maker(sym):
            keywords = deco.keywords if isinstance(deco, ast.Call) else []
            dataclass_like = {k.arg: k.value for k in keywords if k.arg}
        elif decorator_name(deco) != "final":
            odd = True
    return dataclass_like, odd


def _is_dataclass_maker(sym: Sym) -> bool:
    if isinstance(sym, External):
        return sym.qualname.rsplit(".", 1)[-1] == "dataclass"
    if isinstance(sym, FuncSym):
        return has_decorator(sym.node, "dataclass_transform")
    return False


def resolve_in_module(index: ClassIndex, module: str, expr: ast.AST) -> Sym:
    """An expression evaluated in a module's global scope (class bases, decorators)."""
    if isinstance(expr, ast.Subscript):
        return resolve_in_module(index, module, expr.value)
    if isinstance(expr, ast.Name):
        if expr.id == "object":
            info = index.module(module)
            if info is None or "object" not in info.bindings:
                return External("object")
        found = index.resolve(module, expr.id)
        return UNKNOWN if isinstance(found, Missing) else found
    if isinstance(expr, ast.Attribute):
        return attribute_of(index, resolve_in_module(index, module, expr.value), expr.attr)
    return UNKNOWN


def attribute_of(index: ClassIndex, owner: Sym, attr: str) -> Sym:
    if isinstance(owner, External):
        return External(f"{owner.qualname}.{attr}")
    if isinstance(owner, ModuleSym):
        return index.resolve(owner.name, attr)
    if isinstance(owner, ClassSym):
        return class_member(index, owner, attr, bound=False)
    return UNKNOWN


def class_member(index: ClassIndex, cls: ClassSym, attr: str, *, bound: bool, after=None) -> Sym:
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
            return member_sym(c, attr, model.members[attr], bound)
    return UNKNOWN  # not a static member: instance data, or an open/external base


def member_sym(cls: ClassSym, attr: str, node: ast.AST, bound: bool) -> Sym:
    if isinstance(node, ast.ClassDef):
        return ClassSym(cls.module, node, f"{cls.qualname}.{attr}")
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return UNKNOWN
    if has_decorator(node, "property") or has_decorator(node, "cached_property"):
        return UNKNOWN
    if has_decorator(node, "staticmethod") or attr == "__new__":
        drop = False
    elif has_decorator(node, "classmethod"):
        drop = True
    else:
        drop = bound
    return FuncSym(cls.module, node, f"{cls.qualname}.{attr}", drop)
