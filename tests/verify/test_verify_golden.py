"""Golden test: the anchor comparator's own numbers on real B200 TP2 data (issue 6 table).

Baseline b200_tp2_nomtp, candidate b200_tp2_mtp, top-n 20, low-margin 0.5. Every value
below is copied from the issue, which took them from jasl/vllm-ds4-sm120-harness
``oracle-compare``; none is computed here.
"""

from __future__ import annotations

import json

import msgspec
import pytest
from _verify_support import MTP, NOMTP, ORACLE, require_fixtures, run_cli

from bakery.schema import decode, encode_json, read_json
from bakery.verify import compare_bundles
from bakery.verify.compare import BOUND_GATES, ParityReport
from bakery.verify.errors import BundleError
from bakery.verify.report import CASE_METRICS, write_reports
from bakery.verify.result import CaseResult, Fork

# case: (tokens_match, matching_prefix, first mismatch (step, oracle, actual) or None,
#        low_margin, top1_match_rate, topk_overlap_mean, max_chosen_token_logprob_abs_error)
ISSUE_TABLE = {
    "completion_code_probe_logprobs20": (
        True,
        160,
        None,
        False,
        1.0,
        0.8959375,
        0.14795970916748047,
    ),
    "completion_long_prefill_2048_logprobs20": (
        False,
        7,
        (7, " stable", " deterministic"),
        True,
        0.3333333333,
        0.3904761905,
        0.21342873573303223,
    ),
    "completion_raw_intro_logprobs20": (
        False,
        48,
        (48, " advantages", " benefits"),
        True,
        0.9895833333,
        0.9420036765,
        0.2505389451980591,
    ),
    "completion_short_math_logprobs20": (
        False,
        8,
        (8, "5", "9"),
        True,
        0.8125,
        0.79375,
        0.07169325649738312,
    ),
    "completion_translation_logprobs20": (
        True,
        22,
        None,
        False,
        1.0,
        0.9386363636,
        0.21436558663845062,
    ),
}
# The issue prints the two rates to 10 decimals; the exact fractions behind them.
EXACT_RATES = {
    "completion_long_prefill_2048_logprobs20": 7 / 21,
    "completion_raw_intro_logprobs20": 95 / 96,
}


@pytest.fixture(scope="module")
def report() -> ParityReport:
    require_fixtures()
    return compare_bundles(NOMTP, MTP, top_n=20, low_margin=0.5)


def test_report_covers_exactly_the_issue_cases(report: ParityReport) -> None:
    assert sorted(report.cases) == sorted(ISSUE_TABLE)


@pytest.mark.parametrize("name", sorted(ISSUE_TABLE))
def test_case_matches_issue_table(report: ParityReport, name: str) -> None:
    match, prefix, mismatch, low, top1, overlap, chosen = ISSUE_TABLE[name]
    case = report.cases[name]
    assert case.tokens_match is match
    assert case.matching_prefix_tokens == prefix
    if mismatch is None:
        assert case.first_token_mismatch is None
    else:
        step, oracle, actual = mismatch
        assert case.first_token_mismatch == Fork(step, oracle, actual)
    assert case.first_token_mismatch_low_margin is low
    # The table rounds these two to 10 decimals; 1e-9 is the issue's tolerance.
    assert case.top1_match_rate == pytest.approx(top1, abs=1e-9)
    assert case.topk_overlap_mean == pytest.approx(overlap, abs=1e-9)
    assert case.max_chosen_token_logprob_abs_error == pytest.approx(chosen, abs=1e-9)


@pytest.mark.parametrize("name", sorted(EXACT_RATES))
def test_top1_rate_is_the_exact_fraction(report: ParityReport, name: str) -> None:
    assert report.cases[name].top1_match_rate == EXACT_RATES[name]


def test_real_data_passes_default_gates(report: ParityReport) -> None:
    # Every fork in this data is low-margin and prompts tokenise identically.
    assert report.passed is True
    assert all(case.prompt_token_ids_match is True for case in report.cases.values())


def test_trajectory_stops_at_the_low_margin_fork(report: ParityReport) -> None:
    case = report.cases["completion_long_prefill_2048_logprobs20"]
    assert case.trajectory_stopped_at_low_margin_fork is True
    assert case.trajectory_stop_step == 7
    assert case.trajectory_compared_steps == 7
    assert case.trajectory_top1_match_rate == 1.0
    assert case.compared_steps == 21  # the MTP run stopped after 21 tokens


def test_cli_on_real_data_exits_zero(tmp_path) -> None:
    require_fixtures()
    code, out = run_cli(["compare", str(NOMTP), str(MTP), "--json", str(tmp_path / "r.json")])
    assert code == 0, out
    assert "parity passed: 5 cases" in out


# Every field the anchor's own comparator reports, as its code computed them on these two
# bundles (see "source" in the file): ranks, topk_overlap_min, the common-logprob errors,
# margins and the trajectory fields included.
ANCHOR = json.loads((ORACLE.parent / "anchor_compare_b200_tp2.json").read_text())


def test_anchor_table_is_not_trivial() -> None:
    cases = ANCHOR["cases"].values()
    # Distinct fork ranks (2 and 3) and a zero overlap minimum: swaps and means show up.
    assert any(
        c["first_token_mismatch_oracle_actual_rank"] != c["first_token_mismatch_actual_oracle_rank"]
        for c in cases
    )
    assert any(c["topk_overlap_min"] != c["topk_overlap_mean"] for c in cases)


@pytest.mark.parametrize("name", sorted(ANCHOR["cases"]))
def test_every_anchor_field_matches(report: ParityReport, name: str) -> None:
    ours = msgspec.to_builtins(report.cases[name])  # as the JSON report holds it
    for field, expected in ANCHOR["cases"][name].items():
        if isinstance(expected, float):
            # The anchor sums with sum(), we with math.fsum: equal to the last few ulps.
            assert ours[field] == pytest.approx(expected, rel=1e-12, abs=1e-15), field
        else:
            assert ours[field] == expected, field


def test_the_report_read_back_decodes_into_its_types_and_writes_the_same_bytes(
    report: ParityReport, tmp_path
) -> None:
    path = tmp_path / "r.json"
    write_reports(report, json_path=path, markdown_path=None)
    again = decode(
        read_json(path, "report", BundleError), ParityReport, where="r", error=BundleError, hint=""
    )
    assert again == report
    assert encode_json(again, sort_keys=True, ascii_only=False, strict=True) == path.read_bytes()


def test_the_gates_and_the_report_table_name_case_fields() -> None:
    fields = set(CaseResult.__struct_fields__)
    assert {key for key, _kind in BOUND_GATES.values()} <= fields
    assert set(CASE_METRICS) <= fields
