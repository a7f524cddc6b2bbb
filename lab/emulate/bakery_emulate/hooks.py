"""Post-import hooks: run a function right after a named vLLM module executes."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType

_HOOKS: dict[str, list[Callable[[ModuleType], None]]] = {}


def after(name: str):
    def register(fn: Callable[[ModuleType], None]):
        _HOOKS.setdefault(name, []).append(fn)
        return fn

    return register


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, hooks: list[Callable[[ModuleType], None]]):
        self.inner, self.hooks = inner, hooks

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        for hook in self.hooks:
            hook(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        hooks = _HOOKS.get(name)
        if not hooks:
            return None
        for finder in sys.meta_path:
            if isinstance(finder, _Finder):
                continue
            spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, hooks)
                return spec
        return None


def enable() -> None:
    """Run the registered hooks from now on (idempotent). ``patches.install`` registers
    them first: this module knows no stand-in, so the two import one way only."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
