"""How tests/lab/emulate loads what it compares, without leaking into the rest of the suite.

- ``run_checks(tree, ["module:func", ...])``: runs check functions ``func(tree)`` in one
  child the way the engine runs (``lab/emulate/`` and the baked tree first on PYTHONPATH, so
  ``lab/emulate/sitecustomize.py`` turns the interpreter on and installs every hook, the fp8
  rounding fix included); Triton and vLLM never load interpreted in the pytest process.
  Each check's verdict: ok, or failed by an assertion (what a plant must do), or an error.

- ``stand_in(name)``: ``lab/emulate/bakery_emulate/<name>.py``, imported with ``lab/emulate/``
  first on ``sys.path`` just for the import; the path and the ``bakery_emulate``
  entries of ``sys.modules`` are put back afterwards (the module object is returned).
  In the child, where ``lab/emulate/`` is on the path anyway, a plain import.
- ``baked(tree, rel, roots, provided)``: the baked tree's own Triton code, loaded by
  ``lab.dcp.baked_kernels`` (no vLLM import) under ``TRITON_INTERPRET=1``, with
  ``provided`` standing in for the vLLM names it imports.
- ``fp8_fixed(monkeypatch)``: the interpreter with the emulation's fp8 rounding fix,
  the way the engine runs it (``bakery_emulate.patches`` wraps ``_convert_float``);
  monkeypatch restores the interpreter after the test.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

# Imported before any TRITON_INTERPRET=1 below, so triton.language stays the compiled kind
# for the rest of the suite. Hence only kernels that call no triton.language jit function
# (the fp8 cast) are interpreted in this process; the baked kernels run in the child.
with contextlib.suppress(ImportError):  # without Triton, needs("triton") skips the tests
    import triton  # noqa: F401
    import triton.language  # noqa: F401

REPO = Path(__file__).resolve().parents[3]
EMULATE = REPO / "lab" / "emulate"


@contextlib.contextmanager
def _emulate_on_path() -> Iterator[None]:
    saved_path, saved_mods = list(sys.path), set(sys.modules)
    sys.path.insert(0, str(EMULATE))
    try:
        yield
    finally:
        sys.path[:] = saved_path
        for name in set(sys.modules) - saved_mods:
            if name.split(".")[0] == "bakery_emulate":
                del sys.modules[name]


def run_checks(tree: Path, names: Iterable[str], timeout: float = 300) -> dict:
    """``{"module:func": verdict}`` of ``func(tree)`` for each name, in one child."""
    from _dcp_child import run_child

    lab = REPO / "tests" / "lab"
    path = [EMULATE, Path(tree), REPO, REPO / "tests", lab / "dcp", lab / "emulate"]
    env = {"PYTHONPATH": os.pathsep.join(map(str, path)), "BAKERY_EMULATE": "1"}
    child = str(lab / "emulate" / "_child.py")
    return run_child(child, Path(tree), list(names), env=env, timeout=timeout)


def passed(results: dict, name: str) -> None:
    verdict = results[name]
    assert verdict["ok"], f"{name}: {verdict['kind']}: {verdict['detail']}"


def caught(results: dict, name: str) -> None:
    """The check failed on its planted bug, by an assertion (not by crashing)."""
    verdict = results[name]
    assert not verdict["ok"], f"{name}: the planted bug went unnoticed"
    assert verdict["kind"] == "assert", f"{name}: crashed instead: {verdict['detail']}"


def stand_in(name: str) -> Any:
    if str(EMULATE) in sys.path:  # the engine-like child: emulate/ is on the path anyway
        return importlib.import_module(f"bakery_emulate.{name}")
    with _emulate_on_path():
        return importlib.import_module(f"bakery_emulate.{name}")


@contextlib.contextmanager
def _interpreting() -> Iterator[None]:
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"  # triton.jit reads it at decoration
    try:
        yield
    finally:
        if saved is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = saved


def jit(fn: Any) -> Any:
    """``triton.jit(fn)`` as an interpreted function."""
    import triton

    with _interpreting():
        return triton.jit(fn)


def baked(
    tree: Path, rel: str, roots: Iterable[str], provided: Mapping[str, Any] = {}
) -> dict[str, Any]:
    from lab.dcp import baked_kernels as bk

    with _interpreting():
        ex = bk.extract(Path(tree).resolve() / rel, roots)
        ns = bk.build_namespace(ex, {**bk.standins(), **provided})
    picked = {name: ns[name] for name in ex.names()}  # not the provided ones
    assert all(bk.verify_verbatim(ex, picked).values()), "a kernel is not the baked file's text"
    return ns


def fp8_fixed(monkeypatch: Any) -> None:
    import triton.runtime.interpreter as interpreter

    patches = stand_in("patches")
    monkeypatch.setattr(
        interpreter, "_convert_float", patches._nearest_even(interpreter._convert_float)
    )


def planted(fn: Any, old: str, new: str) -> Any:
    """A copy of stand-in function ``fn`` with the one source line holding ``old``
    rewritten to hold ``new``, compiled in ``fn``'s module globals (a planted bug)."""
    import inspect
    import textwrap

    src = textwrap.dedent(inspect.getsource(fn))
    assert src.count(old) == 1, f"{old!r} occurs {src.count(old)} times in {fn.__name__}"
    namespace: dict[str, Any] = {}
    exec(
        compile(src.replace(old, new), f"<planted {fn.__name__}>", "exec"),
        fn.__globals__,
        namespace,
    )
    return namespace[fn.__name__]
