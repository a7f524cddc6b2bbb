"""Unit and property tests of bakery.verify.metrics on synthetic but realistic inputs."""

from __future__ import annotations

import math

import msgspec
import pytest
from _verify_support import case_result
from hypothesis import given, settings
from hypothesis import strategies as st

from bakery.verify.bundle import Completion, TeacherScores
from bakery.verify.metrics import (
    bucket_kl,
    compare_completions,
    compare_teacher_forced,
    first_mismatch,
    is_low_margin,
    top1_margin,
    topk_overlap,
)
from bakery.verify.result import CaseResult, Fork


def completion(
    steps: list[dict[str, float]],
    tokens: list[str] | None = None,
    prompt: tuple[int, ...] | None = (1, 2, 3),
) -> Completion:
    """Greedy by default: each step's token is its top-1, with that logprob."""
    chosen = tokens if tokens is not None else [next(iter(s)) for s in steps]
    return Completion(
        tokens=tuple(chosen),
        token_logprobs=tuple(s.get(t) for s, t in zip(steps, chosen, strict=True)),
        top_logprobs=tuple(steps),
        prompt_token_ids=prompt,
        token_ids=None,
    )


STEPS = [
    {"a": -0.1, "b": -2.5, "c": -3.0},
    {"b": -0.4, "a": -1.2, "d": -4.0},
    {"c": -0.7, "d": -0.9, "a": -5.0},
]


def test_margin_uses_served_order_not_sorted_order() -> None:
    # Served order is authoritative even when it is not descending.
    assert top1_margin({"x": -2.0, "y": -1.0}) == pytest.approx(-1.0)
    assert top1_margin({"x": -1.0}) is None


def test_low_margin_threshold_is_inclusive_and_uses_the_smaller_margin() -> None:
    assert is_low_margin(0.5, 3.0, 0.5) is True
    assert is_low_margin(0.50001, 3.0, 0.5) is False
    assert is_low_margin(None, 0.2, 0.5) is True
    assert is_low_margin(None, None, 0.5) is False


def test_first_mismatch_at_length_difference() -> None:
    assert first_mismatch(["a", "b"], ["a", "b", "c"]) == Fork(2, None, "c")
    assert first_mismatch(["a"], ["a"]) is None


def test_overlap_is_relative_to_the_baseline_keys() -> None:
    assert topk_overlap({"a": 0, "b": 0, "c": 0, "d": 0}, {"a": 0, "z": 0}, 20) == 0.25
    assert topk_overlap({"a": 0, "b": 0}, {"b": 0, "a": 0, "z": 0}, 1) == 0.0
    assert topk_overlap({}, {"a": 0}, 20) is None


def test_identical_runs() -> None:
    base = completion(STEPS)
    case = msgspec.to_builtins(compare_completions("c", base, base, top_n=20, low_margin=0.5))
    assert case["tokens_match"] is True
    assert case["first_token_mismatch"] is None
    assert case["first_token_mismatch_low_margin"] is False
    assert case["top1_match_rate"] == 1.0
    assert case["topk_overlap_min"] == 1.0
    assert case["max_common_logprob_abs_error"] == 0.0
    assert case["max_chosen_token_logprob_abs_error"] == 0.0
    assert case["oracle_top1_margin_min"] == pytest.approx(0.2)


def test_fork_details_and_trajectory() -> None:
    base = completion(STEPS)
    # Candidate prefers "d" at step 2 by 0.1: a low-margin fork (smaller margin 0.1).
    cand_steps = [STEPS[0], {"b": -0.3, "a": -1.2, "d": -4.0}, {"d": -0.75, "c": -0.85, "e": -3}]
    cand = completion(cand_steps)
    case = msgspec.to_builtins(compare_completions("c", base, cand, top_n=20, low_margin=0.5))
    assert case["first_token_mismatch"] == {"step": 2, "oracle": "c", "actual": "d"}
    assert case["first_token_mismatch_oracle_top1_margin"] == pytest.approx(0.2)
    assert case["first_token_mismatch_actual_top1_margin"] == pytest.approx(0.1)
    assert case["first_token_mismatch_oracle_actual_rank"] == 2  # "d" in the baseline's list
    assert case["first_token_mismatch_actual_oracle_rank"] == 2  # "c" in the candidate's list
    assert case["first_token_mismatch_topk_overlap"] == pytest.approx(2 / 3)
    assert case["first_token_mismatch_low_margin"] is True
    assert case["first_token_mismatch_oracle_top5"] == (("c", -0.7), ("d", -0.9), ("a", -5.0))
    assert case["trajectory_stop_step"] == 2
    assert case["trajectory_compared_steps"] == 2
    assert case["top1_match_rate"] == pytest.approx(2 / 3)
    # Chosen-token delta only where tokens match: steps 0 and 1 -> |−0.4 − (−0.3)|.
    assert case["max_chosen_token_logprob_abs_error"] == pytest.approx(0.1)
    assert case["mean_chosen_token_logprob_abs_error"] == pytest.approx(0.05)


def test_high_margin_fork_does_not_stop_the_trajectory() -> None:
    base = completion(STEPS)
    cand = completion([{"z": -0.01, "a": -6.0}, *STEPS[1:]])
    case = msgspec.to_builtins(compare_completions("c", base, cand, top_n=20, low_margin=0.5))
    assert case["first_token_mismatch_low_margin"] is False
    assert case["trajectory_stopped_at_low_margin_fork"] is False
    assert case["trajectory_compared_steps"] == 3


def test_unknown_prompt_ids_are_none_not_false() -> None:
    base, cand = completion(STEPS), completion(STEPS, prompt=None)
    result = compare_completions("c", base, cand, top_n=20, low_margin=0.5)
    assert result.prompt_token_ids_match is None


# --- teacher forcing -----------------------------------------------------------------


def scores(
    positions: list[dict[int, float] | None], sequence: list[int], start: int
) -> TeacherScores:
    return TeacherScores(tuple(sequence), start, tuple(positions))


def test_bucket_kl_matches_hand_computation() -> None:
    p = {1: math.log(0.6), 2: math.log(0.3)}
    q = {1: math.log(0.5), 2: math.log(0.3), 3: math.log(0.1)}
    # Shared {1, 2}; tails p 0.1, q 0.2 (q's token 3 joins its tail).
    expected = 0.6 * math.log(0.6 / 0.5) + 0.3 * math.log(1.0) + 0.1 * math.log(0.1 / 0.2)
    assert bucket_kl(p, q) == pytest.approx(expected, abs=1e-12)
    assert bucket_kl({1: 0.0}, {2: 0.0}) is None


def test_teacher_forced_per_position_delta_and_kl() -> None:
    seq = [5, 7, 9, 11]
    base = scores(
        [
            None,
            {7: math.log(0.9), 8: math.log(0.05)},
            {9: math.log(0.5), 4: math.log(0.4)},
            {11: math.log(0.99)},
        ],
        seq,
        2,
    )
    cand = scores(
        [
            None,
            {7: math.log(0.9), 8: math.log(0.05)},
            {4: math.log(0.6), 9: math.log(0.3)},
            {11: math.log(0.98)},
        ],
        seq,
        2,
    )
    tf = msgspec.to_builtins(compare_teacher_forced(base, cand).onto(case_result()))
    assert tf["tf_logprob_delta"][0] is None
    assert tf["tf_logprob_delta"][1] == pytest.approx(0.0)
    assert tf["tf_logprob_delta"][2] == pytest.approx(math.log(0.3 / 0.5))
    assert tf["tf_kl"][1] == pytest.approx(0.0, abs=1e-15)
    kl2 = 0.5 * math.log(0.5 / 0.3) + 0.4 * math.log(0.4 / 0.6) + 0.1 * math.log(0.1 / 0.1)
    assert tf["tf_kl"][2] == pytest.approx(kl2)
    assert tf["tf_max_kl_position"] == 2
    assert tf["tf_completion_max_abs_logprob_delta"] == pytest.approx(abs(math.log(0.3 / 0.5)))
    assert tf["tf_completion_start"] == 2 and tf["tf_positions"] == 4


def test_teacher_forced_refuses_different_sequences() -> None:
    with pytest.raises(ValueError, match="different token sequences"):
        compare_teacher_forced(
            scores([None, {1: 0.0}], [0, 1], 1), scores([None, {2: 0.0}], [0, 2], 1)
        )


probabilities = st.lists(st.floats(min_value=1e-6, max_value=1.0), min_size=1, max_size=20)


def as_logprobs(weights: list[float], mass: float) -> dict[int, float]:
    total = sum(weights)
    return {i: math.log(w / total * mass) for i, w in enumerate(weights)}


@settings(max_examples=200, deadline=None)
@given(probabilities, probabilities, st.floats(0.5, 1.0), st.floats(0.5, 1.0))
def test_bucket_kl_is_a_nonnegative_divergence(
    pw: list[float], qw: list[float], pm: float, qm: float
) -> None:
    p, q = as_logprobs(pw, pm), as_logprobs(qw, qm)
    kl = bucket_kl(p, q)
    assert kl is not None and kl >= 0.0
    assert bucket_kl(p, p) == pytest.approx(0.0, abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.dictionaries(st.sampled_from("abcdefgh"), st.floats(-20, 0), min_size=1),
        min_size=1,
        max_size=12,
    )
)
def test_a_run_compared_with_itself_is_perfect(steps: list[dict[str, float]]) -> None:
    run = completion(steps)
    case = msgspec.to_builtins(compare_completions("self", run, run, top_n=20, low_margin=0.5))
    assert case["tokens_match"] is True
    assert case["top1_match_rate"] == 1.0 and case["topk_overlap_min"] == 1.0
    assert case["max_common_logprob_abs_error"] == 0.0


def test_a_bound_whose_metric_could_not_be_computed_fails_the_gate():
    from bakery.verify.compare import BOUND_GATES, ParityGates, evaluate_gates

    for name, (key, _kind) in BOUND_GATES.items():
        # A low-margin fork at step 0 leaves the trajectory empty: nothing was compared.
        case = case_result(
            tokens_match=False,
            first_token_mismatch_low_margin=True,
            first_token_mismatch=Fork(0, "a", "b"),
            first_token_mismatch_oracle_actual_rank=2,  # a near tie: the fork gate
            first_token_mismatch_actual_oracle_rank=2,  # excuses it
            first_token_mismatch_topk_overlap=1.0,
            **{key: None},
        )
        assert evaluate_gates(case, ParityGates()) == []
        (failure,) = evaluate_gates(case, ParityGates(**{name: 1.0}))
        assert "could not be computed" in failure and name in failure


# An asymmetric fork, worked by hand: top lists of different sizes on each side, a fork
# where each side ranks the other's token differently (4 and 3), a baseline that runs one
# step longer. Swapped ranks or overlap denominators, a min taken as a mean, or the
# common-logprob error over a subset of the shared tokens all change a value below.
ASYM_BASELINE = [
    {"a": -0.1, "b": -2.0, "c": -3.0, "d": -4.0},
    {"x": -0.2, "y": -0.6, "z": -1.5, "w": -2.0, "v": -3.0},
    {"q": -0.1, "r": -1.0},
]
ASYM_CANDIDATE = [
    {"a": -0.3, "c": -2.5},
    {"w": -0.5, "z": -0.7, "x": -0.9},
]
ASYM_EXPECTED = {
    "tokens_match": False,
    "first_token_mismatch": {"step": 1, "oracle": "x", "actual": "w"},
    "first_token_mismatch_oracle_actual_rank": 4,  # "w" in x, y, z, w, v
    "first_token_mismatch_actual_oracle_rank": 3,  # "x" in w, z, x
    "first_token_mismatch_oracle_top1_margin": 0.4,  # -0.2 - -0.6
    "first_token_mismatch_actual_top1_margin": 0.2,  # -0.5 - -0.7
    "first_token_mismatch_topk_overlap": 0.6,  # {x, z, w} of 5 baseline keys
    "first_token_mismatch_low_margin": True,
    "matching_prefix_tokens": 1,
    "oracle_token_count": 3,
    "actual_token_count": 2,
    "compared_steps": 2,
    "top1_matches": 1,
    "top1_match_rate": 0.5,
    "topk_overlap_mean": 0.55,  # (2/4 + 3/5) / 2: over the baseline's keys, not 2/2
    "topk_overlap_min": 0.5,
    # |a|, |c| at step 0; |x|, |z|, |w| at step 1: 0.2, 0.5, 0.7, 0.8, 1.5
    "max_common_logprob_abs_error": 1.5,
    "mean_common_logprob_abs_error": 0.74,
    "max_chosen_token_logprob_abs_error": 0.2,  # step 0 only: step 1 forked
    "mean_chosen_token_logprob_abs_error": 0.2,
    "trajectory_stopped_at_low_margin_fork": True,
    "trajectory_stop_step": 1,
    "trajectory_compared_steps": 1,
    "trajectory_top1_matches": 1,
    "trajectory_top1_match_rate": 1.0,
    "trajectory_topk_overlap_mean": 0.5,
    "trajectory_topk_overlap_min": 0.5,
    "oracle_top1_margin_mean": (1.9 + 0.4 + 0.9) / 3,  # every baseline step, not only compared
    "oracle_top1_margin_min": 0.4,
    "actual_top1_margin_mean": (2.2 + 0.2) / 2,
    "actual_top1_margin_min": 0.2,
}


def test_asymmetric_fork_worked_by_hand() -> None:
    base = completion(ASYM_BASELINE, ["a", "x", "q"])
    cand = completion(ASYM_CANDIDATE, ["a", "w"])
    case = msgspec.to_builtins(compare_completions("c", base, cand, top_n=20, low_margin=0.5))
    for field, expected in ASYM_EXPECTED.items():
        if isinstance(expected, float):
            assert case[field] == pytest.approx(expected, abs=1e-12), field
        else:
            assert case[field] == expected, field


def test_asymmetric_fork_seen_from_the_other_side() -> None:
    # Swapping the roles swaps the ranks and the overlap denominators.
    base = completion(ASYM_CANDIDATE, ["a", "w"])
    cand = completion(ASYM_BASELINE, ["a", "x", "q"])
    case = msgspec.to_builtins(compare_completions("c", base, cand, top_n=20, low_margin=0.5))
    assert case["first_token_mismatch_oracle_actual_rank"] == 3
    assert case["first_token_mismatch_actual_oracle_rank"] == 4
    assert case["topk_overlap_mean"] == pytest.approx((2 / 2 + 3 / 3) / 2)
    assert case["first_token_mismatch_topk_overlap"] == 1.0


def test_the_teacher_forced_mean_gate_tells_a_few_rounded_positions_from_a_wrong_selection():
    from bakery.verify.compare import ParityGates, evaluate_gates
    from bakery.verify.metrics import TeacherForced

    def case(deltas: list[float]) -> CaseResult:
        scores = TeacherForced(completion_start=8, logprob_deltas=tuple(deltas), kls=(None,) * 10)
        return scores.onto(case_result())

    gates = ParityGates(max_tf_mean_abs_logprob_delta=0.04)
    rounding = case([0.0] * 8 + [0.2, -0.1])  # two positions moved: mean 0.03
    selection = case([0.0] * 4 + [0.07, -0.08, 0.07, 0.09, -0.07, 0.08])  # every late one: 0.046
    assert rounding.tf_max_abs_logprob_delta > selection.tf_max_abs_logprob_delta
    assert evaluate_gates(rounding, gates) == []
    (failure,) = evaluate_gates(selection, gates)
    assert "max_tf_mean_abs_logprob_delta" in failure
    assert evaluate_gates(case([float("nan")] + [0.0] * 9), gates)  # NaN never passes
