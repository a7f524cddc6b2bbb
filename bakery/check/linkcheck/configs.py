"""vLLM's config objects: which expressions hold one, and what one may be read for.

A value is a config when an annotation says so (``vllm_config: VllmConfig``), when a
function's return annotation does (``get_current_vllm_config()``), when it is a field of
another config (``vllm_config.parallel_config``), or when it carries one of the names
vLLM gives its configs: ``vllm_config`` or a field name of ``VllmConfig``
(``parallel_config``, ``self._dcp_parallel_config``: leading underscores and a prefix
ending in ``_`` allowed). Only classes defined under ``vllm/config`` count. A config
class has an attribute when a class of its MRO binds it (a field, property or method)
or a method sets it through ``self``; an open or dynamic class has any attribute.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from bakery.check.linkcheck.classes import ClassIndex, class_member, resolve_in_module
from bakery.check.linkcheck.symbols import ClassSym, FuncSym

CONFIG_PACKAGE = "vllm.config"
ROOT = "VllmConfig"  # exported by vllm.config; its fields name the other configs
ROOT_NAME = "vllm_config"


@dataclass(frozen=True)
class ConfigValue:
    """An expression holding an instance of the config class ``cls``."""

    cls: ClassSym


def is_config(sym: object) -> bool:
    return isinstance(sym, ClassSym) and (
        sym.module == CONFIG_PACKAGE or sym.module.startswith(f"{CONFIG_PACKAGE}.")
    )


def annotation_class(index: ClassIndex, module: str, node: ast.AST | None) -> ClassSym | None:
    """The config class an annotation names (``X``, ``X | None``, ``Optional[X]``,
    ``"X"``), evaluated in ``module``'s global scope; None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        found = [annotation_class(index, module, side) for side in (node.left, node.right)]
        classes = [c for c in found if c is not None]
        return classes[0] if len(classes) == 1 else None
    if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == "Optional":
        return annotation_class(index, module, node.slice)
    if isinstance(node, ast.Name | ast.Attribute):
        sym = resolve_in_module(index, module, node)
        return sym if is_config(sym) and isinstance(sym, ClassSym) else None
    return None


class ConfigTypes:
    """The config classes of one tree, named the way vLLM names their instances."""

    def __init__(self, index: ClassIndex) -> None:
        self.index = index
        self._names: dict[str, ClassSym] | None = None

    def names(self) -> dict[str, ClassSym]:
        """``vllm_config`` and each config-typed field of VllmConfig -> its class."""
        if self._names is None:
            self._names = {}
            root = self.index.resolve(CONFIG_PACKAGE, ROOT)
            if isinstance(root, ClassSym):
                self._names[ROOT_NAME] = root
                for stmt in root.node.body:
                    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                        cls = annotation_class(self.index, root.module, stmt.annotation)
                        if cls is not None:
                            self._names[stmt.target.id] = cls
        return self._names

    def by_name(self, name: str) -> ConfigValue | None:
        """The config a variable or attribute of this name holds, by vLLM's naming."""
        bare = name.lstrip("_")
        for known, cls in self.names().items():
            if bare == known or bare.endswith(f"_{known}"):
                return ConfigValue(cls)
        return None

    def returned(self, func: FuncSym) -> ConfigValue | None:
        cls = annotation_class(self.index, func.module, func.node.returns)
        return ConfigValue(cls) if cls is not None else None

    def field(self, value: ConfigValue, attr: str) -> ConfigValue | None:
        """``value.attr`` when the class annotates it as a config (or names it so)."""
        mro, _ = self.index.mro(value.cls)
        for cls in mro:
            for stmt in cls.node.body:
                if (
                    isinstance(stmt, ast.AnnAssign)
                    and isinstance(stmt.target, ast.Name)
                    and stmt.target.id == attr
                ):
                    found = annotation_class(self.index, cls.module, stmt.annotation)
                    return ConfigValue(found) if found is not None else None
        if self.has(value.cls, attr):
            return self.by_name(attr)
        return None

    def member(self, value: ConfigValue, attr: str):
        """What ``value.attr`` is as a class member (a bound method, for a call)."""
        return class_member(self.index, value.cls, attr, bound=True)

    def has(self, cls: ClassSym, attr: str) -> bool:
        """Whether instances of ``cls`` have ``attr`` (True when it cannot be known)."""
        mro, is_open = self.index.mro(cls)
        if is_open:
            return True
        for c in mro:
            model = self.index.class_model(c)
            if model.dynamic or attr in model.members or attr in model.instance_attrs:
                return True
        return attr.startswith("__") and attr.endswith("__")

    def mro_text(self, cls: ClassSym) -> str:
        mro, _ = self.index.mro(cls)
        rel = {c.module: self.index.module(c.module) for c in mro}
        parts = []
        for c in mro:
            info = rel[c.module]
            where = info.source.rel if info is not None else c.module
            parts.append(f"{c.node.name} ({where}:{c.node.lineno})")
        return ", ".join(parts)
