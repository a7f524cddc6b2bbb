"""bakery linkcheck: detection power on the real series, and each check on tiny trees.

The real-tree tests extract only the ``*.py`` members of the pinned wheels (plus
empty stand-ins for compiled ``*.so`` modules, whose existence is all the check
needs), which takes seconds.

`bakery linkcheck` as the user runs it: exit codes and finding lines.
"""

from __future__ import annotations

import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest

from bakery.bake.fetch import fetch
from bakery.check.linkcheck import (
    Finding,
    SourceTree,
    check_touched_files,
    format_finding,
    run_linkcheck,
)
from bakery.errors import SeriesError
from bakery.series.series import Pin
from bakery.tree import sha256_file
from tests.conftest import run_cli

REPO = Path(__file__).resolve().parents[2]
SEED_PATCH = "09-models_deepseek_v41_nvidia_flashinfer_sparse.py.diff"
PINS_033 = REPO / "tests" / "data" / "pins-0.33.0.toml"


# --- real wheels -------------------------------------------------------------------------


def _wheel(pin: Pin, cache: Path) -> Path:
    """The pinned wheel, hash-verified: a flat cache copy if present, else bakery.bake.fetch."""
    flat = cache / "wheels" / pin.wheel
    if flat.is_file() and sha256_file(flat) == pin.sha256:
        return flat
    return fetch(pin, cache=cache)


def _extract_sources(wheel: Path, dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.endswith(".py"):
                archive.extract(name, dest)
            elif name.endswith(".so"):
                stub = dest / name
                stub.parent.mkdir(parents=True, exist_ok=True)
                stub.touch()
    return dest


@pytest.fixture(scope="session")
def sources_of(tmp_path_factory, cache):
    """pin -> directory with the wheel's sources (memoised per session)."""
    done: dict[str, Path] = {}

    def get(pin: Pin) -> Path:
        if pin.sha256 not in done:
            dest = tmp_path_factory.mktemp(f"src-{pin.name}-{pin.version}")
            done[pin.sha256] = _extract_sources(_wheel(pin, cache), dest)
        return done[pin.sha256]

    return get


def _subjects(findings: list[Finding]) -> set[str]:
    return {f.subject for f in findings}


def test_seed_alone_reports_the_known_faults(series, sources_of):
    findings = run_linkcheck(
        series,
        sources_of(series.base("default")),
        [sources_of(series.dependencies["flashinfer-python"])],
        only=(SEED_PATCH,),
    )
    module = "vllm.model_executor.kernels.attention.dsa.candidate_blocks"
    names = ("_PREFILL_TIMING", "_PrefillTimer", "prefill_acc_add")
    expected = {f"{module}.{name}" for name in names}
    # The combine's flag check lives in patch 02 since vLLM's --dcp-comm-backend is read.
    expected.add("vllm.models.deepseek_v41.attention.dsv41_dcp_combine")
    expected |= {
        f"DeepseekV4FlashInferSM120Attention.{attr}"
        for attr in ("dcp_world_size", "dcp_rank", "cp_kv_cache_interleave_size")
    }
    assert _subjects(findings) == expected, "\n".join(map(format_finding, findings))
    for finding in findings:
        assert format_finding(finding).startswith(
            "models/deepseek_v41/nvidia/flashinfer_sparse.py:"
        )


@pytest.mark.parametrize("base", ["default", "cpu"])
def test_full_series_has_no_findings(series, sources_of, base):
    findings = run_linkcheck(
        series,
        sources_of(series.base(base)),
        [sources_of(series.dependencies["flashinfer-python"])],
    )
    assert findings == [], "\n".join(map(format_finding, findings))


@pytest.mark.slow
def test_seed_call_misses_lse_scale_on_vllm_033(series, sources_of):
    where = str(PINS_033)
    pins = tomllib.loads(PINS_033.read_text())
    vllm = Pin.parse("default", pins["bases"]["default"], where)
    flashinfer = Pin.parse("flashinfer-python", pins["dependencies"]["flashinfer-python"], where)
    findings = run_linkcheck(series, sources_of(vllm), [sources_of(flashinfer)], only=(SEED_PATCH,))
    callee = "flashinfer.mla._core._trtllm_batch_decode_sparse_mla_sm120"
    hits = [f for f in findings if f.subject == callee]
    assert len(hits) == 1, "\n".join(map(format_finding, findings))
    assert "missing required argument 'lse_scale'" in hits[0].missing


# --- synthetic trees ---------------------------------------------------------------------

TOUCHED = "mod.py"


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / "vllm" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    init = tmp_path / "vllm" / "__init__.py"
    if not init.exists():
        init.parent.mkdir(parents=True, exist_ok=True)
        init.write_text("")
    return tmp_path


def _check(tmp_path: Path, files: dict[str, str], touched: str, allow=None) -> list[Finding]:
    root = _tree(tmp_path, files)
    data = textwrap.dedent(touched).encode()
    sources = SourceTree((root,), {f"vllm/{TOUCHED}": data})
    return check_touched_files(sources, {TOUCHED: data}, allow or {})


def test_missing_module(tmp_path):
    findings = _check(tmp_path, {}, "def f():\n    import vllm.nowhere.deep\n")
    assert [(f.line, f.subject) for f in findings] == [(2, "vllm.nowhere")]
    assert "no module vllm.nowhere" in format_finding(findings[0])


def test_missing_name(tmp_path):
    findings = _check(tmp_path, {"lib.py": "a = 1\n"}, "from vllm.lib import a, b\n")
    assert _subjects(findings) == {"vllm.lib.b"}
    assert "(looked in vllm/lib.py)" in format_finding(findings[0])


def test_relative_import_and_submodule(tmp_path):
    files = {"pkg/__init__.py": "", "pkg/sub.py": "x = 1\n", "lib.py": ""}
    assert _check(tmp_path, files, "from .pkg import sub\nfrom .lib import *\n") == []


def test_star_reexport_follows_all(tmp_path):
    files = {
        "pkg/__init__.py": "from .impl import *\n",
        "pkg/impl.py": "__all__ = ['public']\npublic = 1\nhidden = 2\n_private = 3\n",
    }
    findings = _check(tmp_path, files, "from vllm.pkg import public, hidden\n")
    assert _subjects(findings) == {"vllm.pkg.hidden"}
    assert "star imports from vllm.pkg.impl" in findings[0].where


def test_star_without_all_exports_public_names(tmp_path):
    files = {"pkg/__init__.py": "from .impl import *\n", "pkg/impl.py": "a = 1\n_b = 2\n"}
    findings = _check(tmp_path, files, "from vllm.pkg import a, _b\n")
    assert _subjects(findings) == {"vllm.pkg._b"}


def test_module_getattr_and_external_packages_are_trusted(tmp_path):
    files = {"lazy.py": "def __getattr__(name):\n    return name\n"}
    touched = "import torch.whatever\nfrom triton import nope\nfrom vllm.lazy import anything\n"
    assert _check(tmp_path, files, touched) == []


def test_import_guarded_by_import_error_is_optional(tmp_path):
    touched = "try:\n    import vllm._missing_C\nexcept ImportError:\n    pass\n"
    assert _check(tmp_path, {}, touched) == []


LIB = """
def f(a, b, *, c, d=1):
    pass

def g(*args, **kwargs):
    pass

class Base:
    def __init__(self, x, y=0):
        self.x = x

class Child(Base):
    pass
"""


@pytest.mark.parametrize(
    "call, problem",
    [
        ("f(1, 2, c=3, e=4)", "unexpected keyword argument 'e'"),
        ("f(1, c=3)", "missing required argument 'b'"),
        ("f(1, 2, 3, c=3)", "takes 2 positional arguments but 3 were given"),
        ("f(1, 2)", "missing required argument 'c'"),
        ("f(1, 2, c=3, a=1)", "multiple values for argument 'a'"),
        ("Child()", "missing required argument 'x'"),
        ("Child(1, z=2)", "unexpected keyword argument 'z'"),
    ],
)
def test_bad_calls(tmp_path, call, problem):
    findings = _check(tmp_path, {"lib.py": LIB}, f"from vllm.lib import f, Child\n{call}\n")
    assert len(findings) == 1, findings
    assert problem in findings[0].missing
    assert findings[0].line == 2


@pytest.mark.parametrize(
    "call",
    ["f(1, 2, c=3)", "f(*xs, c=1)", "f(1, **kw)", "g(1, 2, z=3)", "Child(1, y=2)"],
)
def test_good_calls(tmp_path, call):
    touched = f"from vllm.lib import f, g, Child\nxs = kw = None\n{call}\n"
    assert _check(tmp_path, {"lib.py": LIB}, touched) == []


def test_dataclass_constructor(tmp_path):
    lib = """
    from dataclasses import dataclass, field

    @dataclass
    class Meta:
        a: int
        b: int = 0
        c: list = field(default_factory=list)
    """
    findings = _check(tmp_path, {"lib.py": lib}, "from vllm.lib import Meta\nMeta(b=1, d=2)\n")
    assert {f.missing.split(" ", 3)[-1] for f in findings} == {
        "got an unexpected keyword argument 'd'",
        "is missing required argument 'a'",
    }


def test_methods_through_self_and_super(tmp_path):
    touched = """
    from vllm.lib import Base

    class Mine(Base):
        def __init__(self):
            super().__init__(1, y=2, q=3)
            self.run(1)

        def run(self, n, *, fast):
            return n
    """
    findings = _check(tmp_path, {"lib.py": LIB}, touched)
    assert sorted(f.missing.split(" ", 3)[-1] for f in findings) == [
        "got an unexpected keyword argument 'q'",
        "is missing required argument 'fast'",
    ]


SELF_CODE = """
import torch.nn as nn
from vllm.lib import Base

class Layer(nn.Module, Base):
    scale: float
    KIND = "x"

    def __init__(self):
        self.a = 1
        self.register_buffer("buf", None)
        if hasattr(self, "maybe"):
            print(self.maybe)

    @property
    def p(self):
        return self.a

    def forward(self):
        return (self.a, self.x, self.scale, self.KIND, self.p, self.buf, self.training,
                self.ghost, self.ghost, self.from_child)

class Child(Layer):
    def __init__(self):
        self.from_child = 1
"""


def test_unknown_self_attribute(tmp_path):
    findings = _check(tmp_path, {"lib.py": LIB}, SELF_CODE)
    assert _subjects(findings) == {"Layer.ghost"}
    (finding,) = findings
    assert finding.line == 21
    assert "Layer never sets self.ghost" in finding.missing
    assert "Base (vllm/lib.py)" in finding.where and "read 2 times" in finding.where


def test_external_base_is_trusted(tmp_path):
    touched = "from transformers import T\n\nclass A(T):\n    def f(self):\n        return self.z\n"
    assert _check(tmp_path, {}, touched) == []


def test_allowlist_suppresses_and_flags_stale_entries(tmp_path):
    allow = {f"{TOUCHED}:Layer.ghost": "set by a hook", f"{TOUCHED}:Layer.gone": "stale"}
    findings = _check(tmp_path, {"lib.py": LIB}, SELF_CODE, allow=allow)
    assert [f.subject for f in findings] == ["Layer.gone"]
    assert "matches nothing" in findings[0].missing


@pytest.mark.parametrize("key", ["ghost", "mod.py", "mod.py:", "a b.py:x"])
def test_allowlist_key_format_is_enforced(tmp_path, key):
    with pytest.raises(SeriesError):
        _check(tmp_path, {}, "x = 1\n", allow={key: "why"})


POSONLY_LIB = """
def p(a, b=1, /, c=2):
    pass

def pk(a, /, **kw):
    pass

class K:
    def __init__(self, a, /, b):
        self.a = a
"""
POSONLY_CALLS = [
    "p(1)",
    "p(1, 2, 3)",
    "p(1, c=3)",
    "p(a=1)",
    "p(1, b=2)",
    "p(1, 2, 3, 4)",
    "pk(1, a=2)",
    "pk(a=1)",
    "K(1, b=2)",
    "K(a=1, b=2)",
    "K(1, 2)",
]


@pytest.mark.parametrize("call", POSONLY_CALLS)
def test_positional_only_calls_agree_with_python(tmp_path, call):
    """Python itself is the oracle: a call linkcheck flags is exactly one that raises
    TypeError when made for real (positional-only parameters, `/`)."""
    namespace: dict = {}
    exec(textwrap.dedent(POSONLY_LIB), namespace)
    try:
        eval(call, namespace)
        python_accepts = True
    except TypeError:
        python_accepts = False
    touched = f"from vllm.lib import p, pk, K\n{call}\n"
    findings = _check(tmp_path, {"lib.py": POSONLY_LIB}, touched)
    assert (findings == []) == python_accepts, (call, findings)


SEED = "09-models_deepseek_v41_nvidia_flashinfer_sparse.py.diff"


@pytest.mark.slow
@pytest.mark.parametrize("base", ["default", "cpu"])
def test_the_command_finds_nothing_on_the_full_series(base):
    proc = run_cli("linkcheck", "--base", base)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
def test_seed_alone_reports_the_seven_known_faults():
    proc = run_cli("linkcheck", "--base", "cpu", "--only", SEED)
    assert proc.returncode == 1
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 7 and all(line.startswith("models/deepseek_v41/") for line in lines)
    for name in (
        "dsv41_dcp_combine",  # patch 02's, since patch 09 reads --dcp-comm-backend
        "_PREFILL_TIMING",
        "_PrefillTimer",
        "prefill_acc_add",
        "self.dcp_world_size",
        "self.dcp_rank",
        "self.cp_kv_cache_interleave_size",
    ):
        assert sum(name in line for line in lines) == 1, name
    assert proc.stderr.startswith("error: 7 unresolved name(s)")
