"""`bakery verify compare` end to end: exit codes 0/1/2, perturbed real data, reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _verify_support import MTP, NOMTP, copy_bundle, edit_case, logprobs_of, run_cli

from bakery.verify import compare_bundles

MATH = "completion_short_math_logprobs20"
CODE = "completion_code_probe_logprobs20"
LONG = "completion_long_prefill_2048_logprobs20"


@pytest.fixture
def candidate(tmp_path: Path) -> Path:
    """A writable copy of the MTP bundle, compared against the read-only baseline."""
    return copy_bundle(MTP, tmp_path / "candidate")


def force_token(doc: dict, step: int, token: str) -> None:
    """The candidate confidently emits ``token`` at ``step`` (a high-margin fork)."""
    lp = logprobs_of(doc)
    rest = {k: v for k, v in lp["top_logprobs"][step].items() if k != token}
    lp["tokens"][step] = token
    lp["token_logprobs"][step] = -0.01
    lp["top_logprobs"][step] = {token: -0.01, **{k: v - 5.0 for k, v in rest.items()}}


def test_high_margin_fork_fails_with_exit_1_and_names_it(candidate: Path, tmp_path: Path) -> None:
    edit_case(candidate, MATH, lambda d: force_token(d, 3, " Answer"))
    md, js = tmp_path / "out" / "report.md", tmp_path / "out" / "report.json"
    code, out = run_cli(
        ["compare", str(NOMTP), str(candidate), "--markdown", str(md), "--json", str(js)]
    )
    assert code == 1, out
    assert f"error: parity failed for 1 of 5 cases: {MATH}" in out
    report = json.loads(js.read_text())
    case = report["cases"][MATH]
    assert report["passed"] is False and case["passed"] is False
    assert case["first_token_mismatch"] == {"step": 3, "oracle": "Question", "actual": " Answer"}
    assert case["first_token_mismatch_low_margin"] is False
    assert case["gate_failures"] == ["high-margin token mismatch at step 3"]
    assert "### First divergence at step 3 (HIGH-margin)" in md.read_text()


def test_markdown_shows_both_top5_lists_at_the_first_divergence(tmp_path: Path) -> None:
    md = tmp_path / "report.md"
    code, _ = run_cli(["compare", str(NOMTP), str(MTP), "--markdown", str(md)])
    assert code == 0
    text = md.read_text()
    section = text.split(f"## {MATH}: passed")[1].split("\n## ")[0]
    assert "### First divergence at step 8 (low-margin)" in section
    base = logprobs_of(json.loads((NOMTP / f"{MATH}.json").read_text()))["top_logprobs"][8]
    cand = logprobs_of(json.loads((MTP / f"{MATH}.json").read_text()))["top_logprobs"][8]
    rows = [line for line in section.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 5
    for rank, (row, b, c) in enumerate(zip(rows, base.items(), cand.items(), strict=False), 1):
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[0] == str(rank)
        assert cells[1] == f"`` {json.dumps(b[0])} ``"
        assert float(cells[2]) == pytest.approx(b[1], abs=1e-5)
        assert cells[3] == f"`` {json.dumps(c[0])} ``"
        assert float(cells[4]) == pytest.approx(c[1], abs=1e-5)


def test_logprob_bound_gate_flips_on_a_perturbed_logprob(candidate: Path) -> None:
    def bump(doc: dict) -> None:
        lp = logprobs_of(doc)
        lp["token_logprobs"][10] -= 1.0
        first = next(iter(lp["top_logprobs"][10]))
        lp["top_logprobs"][10][first] -= 1.0

    edit_case(candidate, CODE, bump)
    before = compare_bundles(NOMTP, MTP).cases[CODE].max_chosen_token_logprob_abs_error
    after = compare_bundles(NOMTP, candidate).cases[CODE].max_chosen_token_logprob_abs_error
    assert before == pytest.approx(0.14795970916748047, abs=1e-12)
    assert after > 1.0
    args = ["compare", str(NOMTP), str(candidate), "--max-chosen-logprob-error", "0.5"]
    code, out = run_cli(args)
    assert code == 1, out
    # The same bound on the unperturbed data passes: the perturbation is what fails it.
    assert run_cli(["compare", str(NOMTP), str(MTP), "--max-chosen-logprob-error", "0.5"])[0] == 0


def test_low_margin_sets_which_forks_are_near_ties_and_a_high_one_can_be_allowed(tmp_path):
    """The real fork at step 7 of the long prompt has a smaller top-1 margin of 0.25: low
    under the default --low-margin 0.5, high under 0.2, and then excused only by
    --allow-high-margin-mismatch (which the report names as the command line's)."""
    report = tmp_path / "r.json"
    plain = ["compare", str(NOMTP), str(MTP), "--json", str(report)]
    assert run_cli(plain)[0] == 0
    args = [*plain, "--low-margin", "0.2"]
    code, out = run_cli(args)
    assert code == 1 and f"parity failed for 1 of 5 cases: {LONG}" in out, out
    doc = json.loads(report.read_text())
    assert doc["settings"]["low_margin"] == 0.2
    assert doc["cases"][LONG]["gate_failures"] == ["high-margin token mismatch at step 7"]
    code, out = run_cli([*args, "--allow-high-margin-mismatch"])
    assert code == 0, out
    gate = json.loads(report.read_text())["gates"]["fail_on_high_margin_mismatch"]
    assert gate == {"source": "cli", "value": False}


def test_prompt_id_mismatch_fails(candidate: Path) -> None:
    edit_case(candidate, MATH, lambda d: d["tokenize_response"]["tokens"].__setitem__(0, 1))
    code, out = run_cli(["compare", str(NOMTP), str(candidate)])
    assert code == 1 and "parity failed" in out
    assert run_cli(["compare", str(NOMTP), str(candidate), "--ignore-prompt-ids"])[0] == 0


def test_missing_directory_is_exit_2(tmp_path: Path) -> None:
    code, out = run_cli(["compare", str(tmp_path / "nope"), str(MTP)])
    assert code == 2
    missing = tmp_path / "nope"
    assert out.strip().splitlines()[-1] == f"error: bundle directory not found: '{missing}'"


def test_invalid_json_is_exit_2_naming_the_file(candidate: Path) -> None:
    (candidate / f"{MATH}.json").write_text("{not json", encoding="utf-8")
    code, out = run_cli(["compare", str(NOMTP), str(candidate)])
    assert code == 2
    assert f"{MATH}.json (invalid JSON, line 1" in out
    assert "Traceback" not in out


def test_malformed_case_is_exit_2(candidate: Path) -> None:
    edit_case(candidate, MATH, lambda d: logprobs_of(d).pop("top_logprobs"))
    code, out = run_cli(["compare", str(NOMTP), str(candidate)])
    assert code == 2 and "$.response.choices[0].logprobs.top_logprobs: missing" in out


def test_different_case_sets_are_exit_2(candidate: Path) -> None:
    (candidate / f"{MATH}.json").unlink()
    code, out = run_cli(["compare", str(NOMTP), str(candidate)])
    assert code == 2 and f"missing in candidate: ['{MATH}']" in out


def test_different_question_is_exit_2(candidate: Path) -> None:
    edit_case(candidate, MATH, lambda d: d["request"].__setitem__("max_tokens", 17))
    code, out = run_cli(["compare", str(NOMTP), str(candidate)])
    assert code == 2 and "request.max_tokens differs" in out


def test_empty_directory_is_exit_2(tmp_path: Path) -> None:
    code, out = run_cli(["compare", str(tmp_path), str(MTP)])
    assert code == 2 and "expected completion_<case>.json files" in out


def test_bad_flag_value_is_exit_2() -> None:
    code, _ = run_cli(["compare", str(NOMTP), str(MTP), "--top-n", "0"])
    assert code == 2


def test_bad_gates_file_is_exit_2(tmp_path: Path) -> None:
    gates = tmp_path / "gates.json"
    gates.write_text(json.dumps({"gates": {"max_tf_kl": "big"}, "sources": {}}))
    code, out = run_cli(["compare", str(NOMTP), str(MTP), "--gates", str(gates)])
    assert code == 2 and "gate 'max_tf_kl' must be a finite number" in out


def test_teacher_forced_without_scores_is_exit_2() -> None:
    code, out = run_cli(["compare", str(NOMTP), str(MTP), "--teacher-forced"])
    assert code == 2 and "no teacher-forced scores" in out


def test_reports_are_written_atomically_and_leave_no_temp_files(tmp_path: Path) -> None:
    out = tmp_path / "reports"
    js, md = out / "r.json", out / "r.md"
    args = ["compare", str(NOMTP), str(MTP), "--json", str(js), "--markdown", str(md)]
    assert run_cli(args)[0] == 0
    assert sorted(p.name for p in out.iterdir()) == ["r.json", "r.md"]
    first = js.read_bytes()
    assert run_cli(["compare", str(NOMTP), str(MTP), "--json", str(js)])[0] == 0
    assert js.read_bytes() == first  # stable output: no timestamps, sorted keys
