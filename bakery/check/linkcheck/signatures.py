"""Call signatures, statically: what a function or a class constructor accepts
(``__init__`` through the MRO, dataclass-like fields, bound methods), and why a
given call cannot bind to it (``inspect.Signature.bind`` without running anything).

A callee behind a decorator that may change its signature has none (trusted).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, replace

from bakery.check.linkcheck.classes import TRANSPARENT_BASES, ClassIndex, member_sym
from bakery.check.linkcheck.index import ModuleIndex, module_rel
from bakery.check.linkcheck.scopes import decorator_name
from bakery.check.linkcheck.symbols import ClassSym, External, FuncSym, Sym

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


def function_signature(index: ModuleIndex, func: FuncSym) -> Signature | None:
    node = func.node
    if any(decorator_name(d) not in _SIGNATURE_KEEPING for d in node.decorator_list):
        return None
    args = node.args
    positional = tuple(a.arg for a in args.posonlyargs + args.args)
    n_required = len(positional) - len(args.defaults)
    required = set(positional[:n_required])
    required |= {a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None}
    where = f"def {func.qualname} at {module_rel(index, func.module)}:{node.lineno}"
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


def constructor_signature(index: ClassIndex, cls: ClassSym) -> Signature | None:
    """What ``cls(...)`` binds to, or None when construction is not static."""
    mro, _ = index.mro(cls)
    for c in mro:
        model = index.class_model(c)
        if model.odd_decorators or "__new__" in model.members or "__call__" in model.members:
            return None
        if "__init__" in model.members:
            init = member_sym(c, "__init__", model.members["__init__"], True)
            return function_signature(index, init) if isinstance(init, FuncSym) else None
        if model.dataclass_like is not None:
            return None if index.mro(c)[1] else _dataclass_signature(index, cls, c)
        if any(not isinstance(b, ClassSym) and not _plain_base(b) for b in model.bases):
            return None
    return None  # reached object: no explicit __init__ is rare enough to skip


def _plain_base(sym: Sym) -> bool:
    return isinstance(sym, External) and sym.qualname in TRANSPARENT_BASES


def _dataclass_signature(index: ClassIndex, cls: ClassSym, first: ClassSym) -> Signature | None:
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
        where=f"dataclass {cls.qualname} at {module_rel(index, cls.module)}:{cls.node.lineno}",
    )


def _field_entry(stmt: ast.AnnAssign, kw_only: bool) -> tuple[bool, bool] | None:
    if _is_type_name(stmt.annotation, "ClassVar"):
        return None
    value = stmt.value
    if isinstance(value, ast.Call) and decorator_name(value) in ("field", "Field"):
        keywords = {k.arg: k.value for k in value.keywords if k.arg}
        if _false(keywords.get("init")):
            return None
        has_default = bool(value.args) or "default" in keywords or "default_factory" in keywords
        return (not has_default, kw_only or _true(keywords.get("kw_only")))
    return (value is None, kw_only)


def _is_type_name(node: ast.expr, name: str) -> bool:
    if isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.split("[")[0].rsplit(".", 1)[-1] == name
    return decorator_name(node) == name


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
