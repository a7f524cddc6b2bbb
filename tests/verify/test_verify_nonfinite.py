"""Hostile bundle values: NaN, infinities and mistyped logprobs never count as parity."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from _verify_support import NOMTP, case_result, copy_bundle, edit_case, logprobs_of, run_cli

from bakery.verify.bundle import teacher_from_document
from bakery.verify.compare import ParityGates, evaluate_gates
from bakery.verify.errors import BundleError
from bakery.verify.report import write_reports

MATH = "completion_short_math_logprobs20"
BIG = "@@10**400@@"  # json.dumps cannot write it; spliced into the text instead
BAD = {
    "nan": math.nan,
    "infinity": math.inf,
    "-infinity": -math.inf,
    "string": "-0.5",
    "object": {"logprob": -0.5},
    "10**400": BIG,
    "true": True,
    "1e300": 1e300,  # finite, but exp() of it overflows in the metrics
}
TIGHTEST = [  # every bound gate at its strictest: a NaN must still not pass
    "--max-chosen-logprob-error", "0", "--max-common-logprob-error", "0",
    "--min-topk-overlap-mean", "1", "--min-topk-overlap-min", "1",
]  # fmt: skip


def hostile_copy(tmp_path: Path, where: str, value) -> Path:
    bundle = copy_bundle(NOMTP, tmp_path / "candidate")

    def plant(doc: dict) -> None:
        lp = logprobs_of(doc)
        if where == "token_logprobs":
            lp["token_logprobs"][3] = value
        else:
            first = next(iter(lp["top_logprobs"][3]))
            lp["top_logprobs"][3][first] = value

    edit_case(bundle, MATH, plant)
    path = bundle / f"{MATH}.json"
    path.write_text(path.read_text().replace(json.dumps(BIG), "1" + "0" * 400))
    return bundle


@pytest.mark.parametrize("where", ["token_logprobs", "top_logprobs"])
@pytest.mark.parametrize("label", sorted(BAD))
def test_non_finite_or_mistyped_logprobs_are_bad_input(where, label, tmp_path):
    candidate = hostile_copy(tmp_path, where, BAD[label])
    report = tmp_path / "report.json"
    code, out = run_cli(["compare", str(NOMTP), str(candidate), "--json", str(report), *TIGHTEST])
    assert code == 2, out
    assert out.startswith("error: ") and "Traceback" not in out and "expected a logprob" in out
    assert f"logprobs.{where}[3]" in out and MATH in out
    assert not report.exists()
    out_dir = tmp_path / "cal"
    code, out = run_cli(
        ["calibrate", "--out", str(out_dir), "--bundle", str(NOMTP), "--bundle", str(candidate)]
    )
    assert code == 2 and "expected a logprob" in out, out
    assert not (out_dir / "gates.json").exists()


def test_steps_that_do_not_line_up_are_bad_input(tmp_path):
    candidate = copy_bundle(NOMTP, tmp_path / "candidate")
    edit_case(candidate, MATH, lambda doc: logprobs_of(doc)["token_logprobs"].pop())
    code, out = run_cli(["compare", str(NOMTP), str(candidate), *TIGHTEST])
    assert code == 2 and "expected one per step" in out, out


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_metric_fails_every_bound_even_zero(value):
    """Behind the border: a NaN that reached the gates still fails them (NaN > 0 is False)."""
    gates = ParityGates(require_prompt_ids_equal=False).with_values(
        "test", max_chosen_token_logprob_abs_error=0.0, min_topk_overlap_mean=0.0
    )
    case = case_result(
        trajectory_max_chosen_token_logprob_abs_error=value, trajectory_topk_overlap_mean=value
    )
    failures = evaluate_gates(case, gates)
    assert len(failures) == 2 and all("not a finite number" in f for f in failures)


def test_the_report_json_never_holds_a_bare_nan(tmp_path):
    path = tmp_path / "report.json"
    with pytest.raises(ValueError, match="not JSON compliant"):
        write_reports({"cases": {"x": {"value": math.nan}}}, json_path=path, markdown_path=None)
    assert not path.exists() and not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "entry, says",
    [
        ({"7": {"logprob": math.nan}}, "expected a logprob"),
        ({"7": {"rank": 1}}, "expected a logprob"),  # no logprob at all
        ({"7": "-0.5"}, "expected a logprob"),
        ({"x": {"logprob": -0.5}}, "expected a token id key"),
    ],
)
def test_teacher_forced_scores_are_checked_the_same_way(entry, says):
    document = {
        "sequence": [5, 7],
        "completion_start": 1,
        "response": {"choices": [{"prompt_logprobs": [None, entry]}]},
    }
    with pytest.raises(BundleError, match=says):
        teacher_from_document(document, Path("teacher_x.json"))
