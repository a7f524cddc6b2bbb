"""linkcheck's drift checks, each planted on a small synthetic tree: a call into a
third-party package that misses a required argument, a vLLM config attribute that is
gone, a bare name no scope binds, and a stages.toml name that does not resolve. Each
test also checks the same tree without the fault, so it can fail both ways.

The real pair (the 0.32.0 series forced onto vllm 0.34.0) is in
tests/maintain/test_rebase_drift.py (slow).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from bakery.check.linkcheck import Finding, SourceTree, check_touched_files, format_finding

TOUCHED = "models/x/attention.py"

CONFIG = {
    "vllm/config/__init__.py": """
        from vllm.config.parallel import ParallelConfig
        from vllm.config.vllm import VllmConfig, get_current_vllm_config
        """,
    "vllm/config/parallel.py": """
        from dataclasses import dataclass

        @dataclass
        class ParallelConfig:
            decode_context_parallel_size: int = 1
            dcp_comm_backend: str | None = None

            def __post_init__(self):
                self.world_size = 1

            @property
            def use_ubatching(self) -> bool:
                return False
        """,
    "vllm/config/vllm.py": """
        from dataclasses import dataclass, field
        from typing import Optional

        from vllm.config.parallel import ParallelConfig

        @dataclass
        class VllmConfig:
            parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
            speculative_config: Optional["ParallelConfig"] = None

            @property
            def use_v2_model_runner(self) -> bool:
                return True

        def get_current_vllm_config() -> VllmConfig:
            return VllmConfig()
        """,
}


def _check(tmp_path: Path, files: dict[str, str], touched: str, stages: Path | None = None):
    root = tmp_path / "tree"
    for rel, text in {"vllm/__init__.py": "", **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    data = textwrap.dedent(touched).encode()
    sources = SourceTree((root,), {f"vllm/{TOUCHED}": data})
    return check_touched_files(sources, {TOUCHED: data}, {}, stages=stages)


def _lines(findings: list[Finding]) -> list[str]:
    return [format_finding(f) for f in findings]


# --- call arity into a third-party package -----------------------------------------------

FLASHINFER = {
    "flashinfer/__init__.py": "",
    "flashinfer/mla/__init__.py": "",
    "flashinfer/mla/_core.py": """
        def _sparse_sm120(query, kv, out, sm_scale, lse, return_lse, lse_scale,
                          kv_scale_format, kv_cache_format="fp8"):
            pass
        """,
}
CALL = """
    def attend(q, kv, out, lse):
        from flashinfer.mla._core import _sparse_sm120

        return _sparse_sm120(q, kv, out, 1.0, lse, True, {extra}kv_scale_format="x")
    """


def test_a_required_argument_the_release_added_is_missing(tmp_path):
    findings = _check(tmp_path, FLASHINFER, CALL.format(extra=""))
    assert [(f.line, f.subject) for f in findings] == [(5, "flashinfer.mla._core._sparse_sm120")]
    assert "is missing required argument 'lse_scale'" in findings[0].missing
    assert "flashinfer/mla/_core.py:2" in findings[0].where


def test_the_call_that_passes_it_binds(tmp_path):
    assert _check(tmp_path, FLASHINFER, CALL.format(extra="1.0, ")) == []


def test_an_unknown_keyword_into_the_release_is_seen(tmp_path):
    call = CALL.format(extra="1.0, lse_base=2, ")
    assert "unexpected keyword argument 'lse_base'" in _lines(_check(tmp_path, FLASHINFER, call))[0]


# --- config attributes -------------------------------------------------------------------

READS = """
    from vllm.config import VllmConfig, get_current_vllm_config


    def refuse(attn_cls, vllm_config: VllmConfig) -> None:
        parallel_config = vllm_config.parallel_config
        if parallel_config.decode_context_parallel_size > 1 and not {read}:
            raise ValueError(parallel_config.dcp_comm_backend)
        if parallel_config.use_ubatching or parallel_config.world_size:
            pass
        pcp = getattr(parallel_config, "prefill_context_parallel_size", 1)  # tolerant


    class Layer:
        def __init__(self, vllm_config):
            self._dcp_parallel_config = vllm_config.parallel_config

        def size(self):
            return self._dcp_parallel_config.{attr}


    def current():
        return get_current_vllm_config().speculative_config.{attr}
    """


def test_config_reads_that_resolve_report_nothing(tmp_path):
    text = READS.format(read="vllm_config.use_v2_model_runner", attr="dcp_comm_backend")
    assert _check(tmp_path, CONFIG, text) == []


def test_a_removed_config_attribute_is_named_with_file_and_line(tmp_path):
    # vLLM 0.34 removed VllmConfig.use_v2_model_runner (the V1 runner is gone).
    files = dict(CONFIG)
    files["vllm/config/vllm.py"] = files["vllm/config/vllm.py"].replace(
        "def use_v2_model_runner", "def uses_mrv2"
    )
    text = READS.format(read="vllm_config.use_v2_model_runner", attr="dcp_comm_backend")
    lines = _lines(_check(tmp_path, files, text))
    assert lines == [
        f"{TOUCHED}:7: VllmConfig has no attribute 'use_v2_model_runner' "
        "(looked in VllmConfig (vllm/config/vllm.py:8))"
    ]


@pytest.mark.parametrize("line", [19, 23])
def test_a_config_read_through_self_or_a_call_is_typed_too(tmp_path, line):
    text = READS.format(read="vllm_config.use_v2_model_runner", attr="dcp_size")
    findings = _check(tmp_path, CONFIG, text)
    assert line in [f.line for f in findings], _lines(findings)
    assert {f.subject for f in findings} == {"ParallelConfig.dcp_size"}


def test_a_config_class_outside_vllm_config_is_not_a_config(tmp_path):
    files = {"vllm/lib.py": "class ParallelConfig:\n    pass\n"}
    text = "from vllm.lib import ParallelConfig\n\ndef f(c: ParallelConfig):\n    return c.x\n"
    assert _check(tmp_path, files, text) == []


def test_a_parameter_annotated_with_another_class_is_not_a_config_by_its_name(tmp_path):
    """``kv_cache_config: KVCacheConfig`` (vLLM's v1 worker) ends like ``cache_config``;
    its annotation, not the name, says what it is. Unannotated, the name still counts."""
    files = {**CONFIG, "vllm/lib.py": "class KVThing:\n    pass\n"}
    annotated = "from vllm.lib import KVThing\n\ndef f(kv_parallel_config: KVThing):\n"
    assert _check(tmp_path, files, annotated + "    return kv_parallel_config.groups\n") == []
    bare = "def f(kv_parallel_config):\n    return kv_parallel_config.groups\n"
    findings = _check(tmp_path / "bare", files, bare)
    assert {f.subject for f in findings} == {"ParallelConfig.groups"}, _lines(findings)


# --- bare names ---------------------------------------------------------------------------

NAMES = textwrap.dedent("""
    import os

    {define}
    LIMITS = [n for n in range(3)]
    TABLE = {{k: v for k, v in zip("ab", "cd")}}


    class Spec:
        sizes = [s * 2 for s in LIMITS]

        def pick(self, heads, item):
            match item:
                case {{"h": h, **rest}}:
                    return h, rest
                case [first, *others]:
                    return first, others
            if _pad(heads) != heads:
                raise ValueError(f"{{_SUPPORTED}}; {{os.sep}} {{len(TABLE)}}")
            return (lambda x: [y for y in x])(heads)
    """)
DEFINED = """_SUPPORTED = (8, 16)


def _pad(n):
    return next(s for s in _SUPPORTED if s >= n)
"""


def test_names_a_release_moved_away_are_not_defined(tmp_path):
    # vLLM 0.34 moved _SPARSE_MLA_SUPPORTED_Q_HEADS / _pad_to_supported_q_heads out.
    findings = _check(tmp_path, {}, NAMES.format(define=""))
    assert [(f.line, f.missing) for f in findings] == [
        (18, "name '_pad' is not defined"),
        (19, "name '_SUPPORTED' is not defined"),
    ]
    assert findings[1].subject == "vllm.models.x.attention._SUPPORTED"


def test_every_scope_python_binds_a_name_in_counts(tmp_path):
    assert _check(tmp_path, {}, NAMES.format(define=DEFINED)) == []


def test_a_name_whose_import_fails_is_reported_once(tmp_path):
    text = "from vllm.lib import gone\n\ndef f():\n    return gone()\n"
    findings = _check(tmp_path, {"vllm/lib.py": ""}, text)
    assert [f.subject for f in findings] == ["vllm.lib.gone"]


# --- stages.toml --------------------------------------------------------------------------

STAGES = """\
# the launcher reads the head set from the baked tree
[gates]
stage_env = "DSV41_DCP_STAGE"
stage_default = 1
stage_min = 1
stage_max = 1
dcp_min_stage = 1
heads_source = "{source}"
"""


def _stages(tmp_path: Path, source: str = f"{TOUCHED}:_SUPPORTED") -> Path:
    root = tmp_path / "patches" / "dcp2"
    root.mkdir(parents=True)
    (root / "stages.toml").write_text(STAGES.format(source=source))
    return root


def test_heads_source_assigned_in_its_file_resolves(tmp_path):
    assert _check(tmp_path, {}, "_SUPPORTED = (8, 16)\n", _stages(tmp_path)) == []


@pytest.mark.parametrize(
    ("touched", "why"),
    [
        ("SUPPORTED = (8, 16)\n", "does not define"),
        ("from vllm.lib import _SUPPORTED\n", "imports but never assigns"),
    ],
)
def test_heads_source_that_does_not_resolve_is_named(tmp_path, touched, why):
    findings = _check(tmp_path, {"vllm/lib.py": "_SUPPORTED = (8,)\n"}, touched, _stages(tmp_path))
    lines = _lines(findings)
    assert len(lines) == 1 and lines[0].startswith("patches/dcp2/stages.toml:8: heads_source")
    assert why in lines[0]


def test_heads_source_naming_a_missing_file_is_named(tmp_path):
    stages = _stages(tmp_path, "models/gone.py:_SUPPORTED")
    findings = _check(tmp_path, {}, "x = 1\n", stages)
    assert [f.missing for f in findings] == ["heads_source names no module vllm.models.gone"]
