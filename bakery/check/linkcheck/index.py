"""Module-level name resolution over a SourceTree: parse each module once, then follow
imports, ``from x import *``, ``__all__`` and ``__init__`` re-exports to what a name is.

Classes are not looked into here (that is ``classes``); a module that binds names at
run time (``__getattr__``, ``globals()`` writes, a non-literal ``__all__``) is trusted.
"""

from __future__ import annotations

import ast

from bakery.check.linkcheck.scopes import (
    has_decorator,
    is_name,
    scope_bindings,
    string_list,
    top_statements,
)
from bakery.check.linkcheck.sources import SourceTree, decode
from bakery.check.linkcheck.symbols import (
    UNKNOWN,
    Binding,
    ClassSym,
    External,
    FuncSym,
    Missing,
    ModuleInfo,
    ModuleSym,
    Sym,
)


class ModuleIndex:
    """Parsed modules of a SourceTree and name resolution across them (memoised)."""

    def __init__(self, sources: SourceTree) -> None:
        self.sources = sources
        self._modules: dict[str, ModuleInfo | None] = {}
        self._tops: dict[str, bool] = {}
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
        bindings, stars = scope_bindings(name, source.is_package, tree.body)
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
            return self.follow(info, name, info.bindings[name], seen)
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

    def follow(self, info: ModuleInfo, name: str, bindings: list[Binding], seen) -> Sym:
        binding = single_binding(bindings)
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
        node = binding.node
        if binding.kind == "def" and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return FuncSym(info.source.name, node, f"{info.source.name}.{name}", False)
        if binding.kind == "class" and isinstance(node, ast.ClassDef):
            return ClassSym(info.source.name, node, f"{info.source.name}.{name}")
        return UNKNOWN

    # files ---------------------------------------------------------------------------

    def package_files(self, module: str) -> list[tuple[str, str]]:
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
                cached.append((_module_name(rel), decode(data)))
        for root in self.sources.roots:
            for path in sorted((root / top).rglob("*.py")):
                rel = path.relative_to(root).as_posix()
                if rel not in seen:
                    seen.add(rel)
                    cached.append((_module_name(rel), decode(path.read_bytes())))
        self._files.extend(cached)
        return cached


def _module_name(rel: str) -> str:
    parts = rel[: -len(".py")].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def single_binding(bindings: list[Binding]) -> Binding | None:
    """The one runtime binding of a name, or None when it is conditional/ambiguous.
    ``@overload`` stubs before the implementation do not count."""
    real = [b for b in bindings if not (b.kind == "def" and has_decorator(b.node, "overload"))]
    return real[0] if len(real) == 1 else None


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
        if isinstance(owner, ast.Call) and is_name(owner.func, "globals"):
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
                return True
            if isinstance(node, ast.Attribute) and node.attr in ("update", "setdefault"):
                return True
    return False


def _literal_all(tree: ast.Module) -> tuple[list[str] | None, bool]:
    """``__all__`` as a list of strings, or (None, True) when it is not literal."""
    names: list[str] | None = None
    for stmt in top_statements(tree.body):
        value, mode = _all_statement(stmt)
        if mode is None:
            continue
        strings = string_list(value)
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


def module_rel(index: ModuleIndex, module: str) -> str:
    """The file a module was read from, as findings quote it (the name when absent)."""
    info = index.module(module)
    return info.source.rel if info is not None else module
