"""Reading bindings from the AST: what one scope level binds, where a relative import
points, and the small name tests (``is_name``, decorators) every later module shares.
Pure functions of the syntax tree; nothing is resolved across modules here."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from bakery.check.linkcheck.symbols import Binding


def absolute_module(module: str, is_package: bool, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    parts = module.split(".")
    if not is_package:
        parts = parts[:-1]
    parts = parts[: len(parts) - (level - 1)] if level > 1 else parts
    return ".".join(parts + ([target] if target else []))


def top_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements that run at this level: into if/try/with/loops, not into defs."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If | ast.For | ast.AsyncFor | ast.While):
            yield from top_statements(stmt.body)
            yield from top_statements(stmt.orelse)
        elif isinstance(stmt, ast.With | ast.AsyncWith):
            yield from top_statements(stmt.body)
        elif isinstance(stmt, ast.Try | ast.TryStar):
            yield from top_statements(stmt.body)
            for handler in stmt.handlers:
                yield from top_statements(handler.body)
            yield from top_statements(stmt.orelse)
            yield from top_statements(stmt.finalbody)


def target_names(target: ast.AST) -> Iterator[str]:
    for node in ast.walk(target):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            yield node.id


def scope_bindings(
    module: str, is_package: bool, body: list[ast.stmt]
) -> tuple[dict[str, list[Binding]], list[str]]:
    """Names bound by the statements of one scope level, plus its star-import sources."""
    bindings: dict[str, list[Binding]] = {}
    stars: list[str] = []

    def bind(name: str, binding: Binding) -> None:
        bindings.setdefault(name, []).append(binding)

    for stmt in top_statements(body):
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname:
                    bind(alias.asname, Binding("import", stmt, (alias.name,)))
                else:
                    top = alias.name.split(".")[0]
                    bind(top, Binding("import", stmt, (top,)))
        elif isinstance(stmt, ast.ImportFrom):
            source = absolute_module(module, is_package, stmt.level, stmt.module)
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
                for name in target_names(target):
                    bind(name, Binding("value", stmt))
        elif isinstance(stmt, ast.For | ast.AsyncFor | ast.With | ast.AsyncWith):
            for target in loop_or_with_targets(stmt):
                for name in target_names(target):
                    bind(name, Binding("value", stmt))
        elif isinstance(stmt, ast.Try | ast.TryStar):
            for handler in stmt.handlers:
                if handler.name:
                    bind(handler.name, Binding("value", handler))
        for node in ast.walk(stmt) if isinstance(stmt, ast.Expr | ast.Assign | ast.If) else ():
            if isinstance(node, ast.NamedExpr):
                bind(node.target.id, Binding("value", node))
    return bindings, stars


def loop_or_with_targets(stmt: ast.For | ast.AsyncFor | ast.With | ast.AsyncWith) -> list[ast.expr]:
    if isinstance(stmt, ast.For | ast.AsyncFor):
        return [stmt.target]
    return [item.optional_vars for item in stmt.items if item.optional_vars is not None]


def string_list(value: ast.AST | None) -> list[str] | None:
    if isinstance(value, ast.List | ast.Tuple):
        strings = [
            e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
        ]
        return strings if len(strings) == len(value.elts) else None
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add):
        left, right = string_list(value.left), string_list(value.right)
        return None if left is None or right is None else left + right
    return None


def is_name(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def decorator_name(node: ast.expr) -> str:
    target = node.func if isinstance(node, ast.Call) else node
    if isinstance(target, ast.Attribute):
        return target.attr
    return target.id if isinstance(target, ast.Name) else ""


def has_decorator(node: ast.AST | None, name: str) -> bool:
    decorators = getattr(node, "decorator_list", [])
    return any(decorator_name(d) == name for d in decorators)
