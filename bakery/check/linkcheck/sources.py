"""Where module sources come from: the patched overlay first, then each root.

A module is found as ``x/y.py``, ``x/y/__init__.py``, a compiled ``.so``/``.pyi``
(contents unknown) or a namespace package directory. Nothing here parses code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


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
            return ModuleSource(module, rel, decode(data), is_pkg, "patched")
        for root in self.roots:
            path = root / rel
            if path.is_file():
                return ModuleSource(module, rel, decode(path.read_bytes()), is_pkg, str(root))
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


def decode(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")
