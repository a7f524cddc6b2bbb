"""Issue 22, findings 9 and 10: default gates never pass different output, and a gates file
is read strictly (a key given twice, a huge finite bound, a negative overlap are refused)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _verify_support import NOMTP, copy_bundle, edit_case, logprobs_of, run_cli

from bakery.verify import compare as compare_mod

CASES = sorted(p.stem for p in NOMTP.glob("completion_*.json"))


def all_different(doc: dict) -> None:
    """Every token different, top-k lists disjoint from the baseline's, and a small top-1
    margin at each step (0.1): the candidate's own margin made each step-0 fork low."""
    lp = logprobs_of(doc)
    n = len(lp["tokens"])
    lp["tokens"] = [f"<other {i}>" for i in range(n)]
    lp["token_logprobs"] = [-0.6] * n
    lp["top_logprobs"] = [
        {f"<other {i}>": -0.6, **{f"<alt {i}.{k}>": -0.7 - k for k in range(19)}} for i in range(n)
    ]


@pytest.fixture
def different(tmp_path: Path) -> Path:
    bundle = copy_bundle(NOMTP, tmp_path / "different")
    for name in CASES:
        edit_case(bundle, name, all_different)
    return bundle


def test_default_gates_fail_a_candidate_whose_every_token_differs(different, tmp_path):
    report = tmp_path / "r.json"
    code, out = run_cli(["compare", str(NOMTP), str(different), "--json", str(report)])
    assert code == 1, out
    assert f"error: parity failed for {len(CASES)} of {len(CASES)} cases" in out
    cases = json.loads(report.read_text())["cases"]
    for case in cases.values():  # the anchor's own verdict on the fork is unchanged
        assert case["first_token_mismatch"]["step"] == 0
        assert case["first_token_mismatch_low_margin"] is True
        assert case["first_token_mismatch_topk_overlap"] == 0.0
        assert case["gate_failures"] == [
            "fork at step 0: a chosen token is not in the other side's top-k"
        ]


def test_planting_the_old_default_lets_different_output_pass(different, monkeypatch):
    """The gate is what catches it: with the fork gate off by default, it passed (rc 0)."""
    monkeypatch.setattr(
        compare_mod.ParityGates, "__init__", _with_default(min_fork_topk_overlap=None)
    )
    code, out = run_cli(["compare", str(NOMTP), str(different)])
    assert code == 0 and f"parity passed: {len(CASES)} cases" in out, out


def _with_default(**values):
    real = compare_mod.ParityGates.__init__

    def init(self, *args, **kwargs):
        real(self, *args, **{**values, **kwargs})

    return init


def test_a_near_tie_fork_still_passes_and_a_far_one_fails(tmp_path):
    """One fork at step 3: the candidate's token swapped with the baseline's second choice
    passes (the real B200 forks are such); the same fork onto a token outside the baseline's
    top-k fails, though its margin is as low."""
    name = "completion_short_math_logprobs20"

    def swap(doc: dict, token: str) -> None:
        lp = logprobs_of(doc)
        top = lp["top_logprobs"][3]
        first, second = list(top)[:2]
        new = token or second
        lp["tokens"] = lp["tokens"][:3] + [new]
        lp["token_logprobs"] = lp["token_logprobs"][:3] + [top[first]]
        rest = {k: v for k, v in top.items() if k not in (first, new)}
        lp["top_logprobs"] = lp["top_logprobs"][:3] + [
            {new: top[first], first: top[first] - 0.1, **rest}
        ]

    near = copy_bundle(NOMTP, tmp_path / "near")
    edit_case(near, name, lambda d: swap(d, ""))
    code, out = run_cli(["compare", str(NOMTP), str(near)])
    assert code == 0, out
    far = copy_bundle(NOMTP, tmp_path / "far")
    edit_case(far, name, lambda d: swap(d, "<nowhere>"))
    code, out = run_cli(["compare", str(NOMTP), str(far), "--json", str(tmp_path / "r.json")])
    assert code == 1, out
    case = json.loads((tmp_path / "r.json").read_text())["cases"][name]
    assert case["first_token_mismatch_low_margin"] is True
    assert case["gate_failures"] == [
        "fork at step 3: a chosen token is not in the other side's top-k"
    ]


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"gates": {"max_tf_kl": 0.01, "max_tf_kl": 1e9}}', "key 'max_tf_kl' given twice"),
        ('{"gates": {"max_tf_kl": 1.7976931348623157e308}}', "must be a finite number in 0..1e+09"),
        ('{"gates": {"min_topk_overlap_mean": -0.5}}', "must be a finite number in 0..1"),
        ('{"gates": {"min_topk_overlap_min": 1.5}}', "must be a finite number in 0..1"),
        ('{"gates": {"max_tf_kl": -1}}', "must be a finite number in 0..1e+09"),
        ('{"gates": {"max_tf_kl": Infinity}}', "must be a finite number"),
        ('{"gates": {"require_prompt_ids_equal": null}}', "must be true/false, got null"),
        ('{"gates": {}, "gates": {"max_tf_kl": 1}}', "key 'gates' given twice"),
    ],
)
def test_a_gates_file_that_would_loosen_silently_is_refused(tmp_path, text, expected):
    gates = tmp_path / "gates.json"
    gates.write_text(text)
    code, out = run_cli(["compare", str(NOMTP), str(NOMTP), "--gates", str(gates)])
    assert code == 2 and expected in out, out
    assert out.startswith("error: ") and len(out.splitlines()) == 2 and "Traceback" not in out


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--max-tf-kl", "1.7976931348623157e308"),
        ("--max-chosen-logprob-error", "1e10"),
        ("--min-topk-overlap-mean", "2"),
        ("--min-fork-topk-overlap", "1.01"),
    ],
)
def test_a_flag_bound_outside_its_range_is_refused(flag, value):
    code, out = run_cli(["compare", str(NOMTP), str(NOMTP), flag, value])
    assert code == 2 and "must be a finite number in" in out, out


def test_a_null_bound_switches_the_fork_gate_off(different, tmp_path):
    gates = tmp_path / "gates.json"
    gates.write_text('{"gates": {"min_fork_topk_overlap": null}}')
    code, out = run_cli(["compare", str(NOMTP), str(different), "--gates", str(gates)])
    assert code == 0, out  # asked for, in writing: the report says who switched it off


def test_the_gpu_matrix_sets_gates_that_the_real_b200_data_passes():
    from bakery import project
    from bakery.parity.matrix import load_matrix
    from bakery.verify import compare_bundles
    from bakery.verify.compare import ParityGates

    matrix = load_matrix(Path(__file__).resolve().parents[2] / project.MATRIX)
    values = dict(matrix.doc.gates)
    assert {"min_topk_overlap_min", "min_topk_overlap_mean", "min_fork_topk_overlap"} <= set(values)
    gates = ParityGates().with_values("matrix", **values)
    from _verify_support import MTP

    assert compare_bundles(
        NOMTP, MTP, gates, top_n=matrix.doc.top_n, low_margin=matrix.doc.low_margin
    ).passed
