"""The per-file checker: one AST walk over a touched module that checks every import,
every call into a resolvable function or class, every ``self.X`` read, every bare name
(bound somewhere in scope, or a builtin) and every attribute read of a vLLM config,
tracking the scopes it passes through (module, class, function, lambda, comprehension)
the way Python does.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Iterator
from dataclasses import dataclass

from bakery.check.linkcheck.classes import (
    ClassIndex,
    attribute_of,
    class_member,
    self_param_name,
)
from bakery.check.linkcheck.configs import ConfigTypes, ConfigValue, annotation_class
from bakery.check.linkcheck.findings import Finding
from bakery.check.linkcheck.index import module_rel, single_binding
from bakery.check.linkcheck.scopes import (
    absolute_module,
    decorator_name,
    has_decorator,
    is_name,
    scope_bindings,
)
from bakery.check.linkcheck.signatures import (
    Signature,
    bind_problems,
    constructor_signature,
    function_signature,
)
from bakery.check.linkcheck.symbols import (
    UNKNOWN,
    Binding,
    ClassSym,
    FuncSym,
    Missing,
    ModuleInfo,
    ModuleSym,
    Super,
    Sym,
)

# Methods whose first parameter is the class itself.
_CLASS_FIRST = frozenset({"__new__", "__init_subclass__", "__class_getitem__"})
_BUILTINS = frozenset(dir(builtins))


@dataclass
class _Scope:
    kind: str  # "module", "function", "class"
    names: dict[str, list[Binding]]
    cls: ClassSym | None = None
    self_name: str | None = None
    self_is_class: bool = False  # first parameter is the class (classmethod, __new__)
    # parameters by annotation: a config's, or None where another class is named (then
    # vLLM's naming says nothing: ``kv_cache_config: KVCacheConfig`` is no CacheConfig)
    configs: dict[str, ConfigValue | None] | None = None


class FileChecker(ast.NodeVisitor):
    """Walks one parsed module, collecting its findings (``self.X`` reads are judged
    at the end, by ``check_self_reads``, once the whole class has been seen)."""

    def __init__(
        self, index: ClassIndex, path: str, info: ModuleInfo, configs: ConfigTypes | None = None
    ) -> None:
        self.index = index
        self.configs = configs or ConfigTypes(index)
        self.path = path
        self.info = info
        self.module = info.source.name
        self.findings: list[Finding] = []
        self.scopes: list[_Scope] = [_Scope("module", {})]
        self.self_reads: list[tuple[ClassSym, str, int]] = []
        self.unbound: dict[str, list[int]] = {}  # bare names no scope binds -> their lines
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
        source = absolute_module(self.module, self.info.source.is_package, node.level, node.module)
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
        names, _ = scope_bindings(self.module, self.info.source.is_package, node.body)
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
            is_class = has_decorator(node, "classmethod") or node.name in _CLASS_FIRST
            scope = _Scope("function", names, parent.cls, self_param_name(node), is_class)
        else:
            inherited = parent.self_name if parent.self_name not in names else None
            scope = _Scope("function", names, parent.cls, inherited, parent.self_is_class)
        scope.configs = self._annotated_configs(node)
        for arg in _all_args(node.args):
            if arg.annotation is not None:
                self.visit(arg.annotation)
        if node.returns is not None:
            self.visit(node.returns)
        self.scopes.append(scope)
        for stmt in node.body:
            self.visit(stmt)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def _annotated_configs(self, node: ast.FunctionDef | ast.AsyncFunctionDef):
        found: dict[str, ConfigValue | None] = {}
        for arg in _all_args(node.args):
            if arg.annotation is None:
                continue
            cls = annotation_class(self.index, self.module, arg.annotation)
            found[arg.arg] = ConfigValue(cls) if cls is not None else None
        return found

    def visit_ListComp(self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp) -> None:
        self._comprehension(node.generators, [node.elt])

    visit_SetComp = visit_GeneratorExp = visit_ListComp

    def visit_DictComp(self, node: ast.DictComp) -> None:
        self._comprehension(node.generators, [node.key, node.value])

    def _comprehension(self, generators: list[ast.comprehension], parts: list[ast.expr]):
        """A comprehension is a scope of its own: its targets bind only inside it."""
        parent = self.scopes[-1]
        names: dict[str, list[Binding]] = {}
        for gen in generators:
            for target in ast.walk(gen.target):
                if isinstance(target, ast.Name):
                    names.setdefault(target.id, []).append(Binding("value", target))
        scope = _Scope("function", names, parent.cls, parent.self_name, parent.self_is_class)
        self.scopes.append(scope)
        for gen in generators:
            self.visit(gen)
        for part in parts:
            self.visit(part)
        self.scopes.pop()

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
                binding = single_binding(scope.names[name])
                if binding is None or binding.kind not in ("import", "from"):
                    return UNKNOWN
                return self.index.follow(self.info, name, [binding], frozenset())
        found = self.index.resolve(self.module, name)
        return UNKNOWN if isinstance(found, Missing) else found

    def evaluate(self, expr: ast.AST) -> Sym | _Instance | ConfigValue:
        """What an expression names; ``self`` (or ``cls``) itself is an _Instance, and
        an expression holding a vLLM config a ConfigValue."""
        if isinstance(expr, ast.Name):
            scope = self.scopes[-1]
            if scope.self_name == expr.id and scope.cls is not None:
                return _Instance(scope.cls, scope.self_is_class)
            found = self.lookup(expr.id)
            return self._config_named(expr.id) if found is UNKNOWN else found
        if isinstance(expr, ast.Attribute):
            owner = self.evaluate(expr.value)
            if isinstance(owner, ConfigValue):
                return self.configs.field(owner, expr.attr) or self.configs.member(owner, expr.attr)
            if isinstance(owner, _Instance):
                found = class_member(self.index, owner.cls, expr.attr, bound=not owner.is_class)
                if found is UNKNOWN and not owner.is_class:
                    return self.configs.by_name(expr.attr) or found
                return found
            if isinstance(owner, Super):
                scope = self.scopes[-1]
                if scope.cls is None:
                    return UNKNOWN
                return class_member(self.index, scope.cls, expr.attr, bound=True, after=owner.cls)
            return attribute_of(self.index, owner, expr.attr)
        if isinstance(expr, ast.Call) and is_name(expr.func, "super") and not expr.args:
            scope = self.scopes[-1]
            return Super(scope.cls) if scope.cls is not None and scope.self_name else UNKNOWN
        if isinstance(expr, ast.Call):
            callee = self.evaluate(expr.func)
            if isinstance(callee, FuncSym):
                return self.configs.returned(callee) or UNKNOWN
        return UNKNOWN

    def _config_named(self, name: str) -> Sym | ConfigValue:
        """A name no scope resolves statically: a config by annotation, then by name."""
        for scope in reversed(self.scopes):
            if scope.configs and name in scope.configs:
                return scope.configs[name] or UNKNOWN
        return self.configs.by_name(name) or UNKNOWN

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load) and not self._bound(node.id):
            self.unbound.setdefault(node.id, []).append(node.lineno)

    def _bound(self, name: str) -> bool:
        """Whether some scope binds ``name`` (the module's through imports and stars,
        trusted when it cannot be known), or it is a builtin."""
        innermost = True
        for scope in reversed(self.scopes):
            if scope.kind == "class" and not innermost:
                continue
            innermost = False
            if scope.kind != "module" and name in scope.names:
                return True
        if name in _BUILTINS or name in self.info.bindings:
            return True  # an import of a missing name is the import's finding
        return not isinstance(self.index.resolve(self.module, name), Missing)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        scope = self.scopes[-1]
        if (
            isinstance(node.ctx, ast.Load)
            and scope.cls is not None
            and scope.self_name is not None
            and is_name(node.value, scope.self_name)
        ):
            self.self_reads.append((scope.cls, node.attr, node.lineno))
        elif isinstance(node.ctx, ast.Load):
            owner = self.evaluate(node.value)
            if isinstance(owner, ConfigValue) and not self.configs.has(owner.cls, node.attr):
                name = owner.cls.node.name
                where = f"looked in {self.configs.mro_text(owner.cls)}"
                self.report(node.lineno, f"{name} has no attribute {node.attr!r}", where,
                            f"{name}.{node.attr}")  # fmt: skip
            if isinstance(owner, ModuleSym):
                found = self.index.resolve(owner.name, node.attr)
                if isinstance(found, Missing):
                    self.report(node.lineno, found.what, found.where, f"{owner.name}.{node.attr}")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        callee = self.evaluate(node.func)
        if isinstance(callee, FuncSym | ClassSym):
            self._check_call(node, callee)
        self.generic_visit(node)

    def _check_call(self, node: ast.Call, callee: FuncSym | ClassSym) -> None:
        sig: Signature | None
        if isinstance(callee, FuncSym):
            sig = function_signature(self.index, callee)
        else:
            sig = constructor_signature(self.index, callee)
        if sig is None:
            return
        for problem in bind_problems(sig, node):
            message = f"call to {callee.qualname} {problem}"
            self.report(node.lineno, message, sig.where, callee.qualname)

    # names ---------------------------------------------------------------------------

    def check_unbound(self) -> None:
        """One finding per name no scope binds, at its first use."""
        where = f"looked in the enclosing scopes, {module_rel(self.index, self.module)}"
        for name, lines in sorted(self.unbound.items()):
            more = f", used {len(lines)} times" if len(lines) > 1 else ""
            self.report(
                min(lines),
                f"name {name!r} is not defined",
                f"{where} and builtins{more}",
                f"{self.module}.{name}",
            )

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
        parts = [f"{c.node.name} ({module_rel(self.index, c.module)})" for c in mro]
        if self.index.extra_attrs(cls):
            parts.append("torch.nn.Module")
        return ", ".join(parts)


def _catches_import_error(node: ast.expr | None) -> bool:
    """A handler for ImportError (or anything broader): the import is optional."""
    if node is None:
        return True
    names = node.elts if isinstance(node, ast.Tuple) else [node]
    broad = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
    return any(decorator_name(n) in broad for n in names)


@dataclass(frozen=True)
class _Instance:
    """``self`` (or ``cls``, when ``is_class``) inside a method of a class in the tree."""

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
            bindings, _ = scope_bindings(module, is_package, [sub])
            for name, found in bindings.items():
                names.setdefault(name, []).extend(found)
        elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store | ast.Del):
            names.setdefault(sub.id, []).append(Binding("value", sub))
        elif isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.setdefault(sub.name, []).append(Binding("value", sub))
        elif isinstance(sub, ast.ExceptHandler) and sub.name:
            names.setdefault(sub.name, []).append(Binding("value", sub))
        elif isinstance(sub, ast.MatchAs | ast.MatchStar) and sub.name:
            names.setdefault(sub.name, []).append(Binding("value", sub))
        elif isinstance(sub, ast.MatchMapping) and sub.rest:
            names.setdefault(sub.rest, []).append(Binding("value", sub))
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
