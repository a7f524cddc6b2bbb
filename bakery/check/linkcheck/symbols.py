"""What a name resolves to (a module, function, class, external or unknown name, or a
miss), what a statement binds, and one parsed module's facts. Data only."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Union

from bakery.check.linkcheck.sources import ModuleSource


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
