"""Parity metrics: pure functions from two parsed completions to a case's ``CaseResult``.

Free-running metrics follow jasl/vllm-ds4-sm120-harness ``oracle-compare`` (same field
names, same definitions): tokens come from ``logprobs.tokens``; a step's top-1 margin
is the first minus the second ``top_logprobs`` value in served order; a mismatch is
low-margin when the smaller known margin is <= the threshold; top-k overlap is
|baseline ∩ candidate| / |baseline|; the chosen-token delta is taken only where the
tokens match. Teacher-forced metrics compare two servers' scores of one fixed token
sequence. ``None`` always means "could not be computed", never 0 or False.
No I/O and no gates here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import msgspec

from bakery.verify.bundle import Completion, TeacherScores
from bakery.verify.result import CaseResult, Fork

__all__ = [
    "StepStats",
    "FirstMismatch",
    "TeacherForced",
    "compare_completions",
    "compare_teacher_forced",
    "chosen_deltas",
    "top1_margin",
    "first_mismatch",
    "matching_prefix",
    "topk_overlap",
    "is_low_margin",
    "bucket_kl",
]

TOP_LIST_SIZE = 5
# Below this the tail bucket of a distribution is treated as empty mass, so a
# candidate that puts all its top-k mass on the shared tokens gives a finite KL.
TAIL_FLOOR = 1e-12


def _mean(values: Sequence[float]) -> float | None:
    # fsum: exact and independent of iteration order, so results are reproducible.
    return math.fsum(values) / len(values) if values else None


def _max(values: Sequence[float]) -> float | None:
    return max(values) if values else None


def _min(values: Sequence[float]) -> float | None:
    return min(values) if values else None


def top_keys(step: Mapping[str, float], top_n: int) -> list[str]:
    """The first ``top_n`` keys in served order."""
    return list(step)[:top_n]


def top1_margin(step: Mapping[str, float]) -> float | None:
    """First minus second served value; None with fewer than two entries."""
    values = list(step.values())
    return values[0] - values[1] if len(values) >= 2 else None


def first_mismatch(oracle: Sequence[str], actual: Sequence[str]) -> Fork | None:
    """The first differing step, or the shorter run's end; None when the runs agree."""
    for step, (a, b) in enumerate(zip(oracle, actual, strict=False)):
        if a != b:
            return Fork(step, a, b)
    if len(oracle) == len(actual):
        return None
    step = min(len(oracle), len(actual))
    return Fork(
        step,
        oracle[step] if step < len(oracle) else None,
        actual[step] if step < len(actual) else None,
    )


def matching_prefix(oracle: Sequence[str], actual: Sequence[str]) -> int:
    count = 0
    for a, b in zip(oracle, actual, strict=False):
        if a != b:
            break
        count += 1
    return count


def topk_overlap(
    oracle: Mapping[str, float], actual: Mapping[str, float], top_n: int
) -> float | None:
    """|oracle top-n ∩ actual top-n| / |oracle top-n|; None when the oracle step is empty."""
    oracle_keys = set(top_keys(oracle, top_n))
    if not oracle_keys:
        return None
    return len(oracle_keys & set(top_keys(actual, top_n))) / len(oracle_keys)


def is_low_margin(
    oracle_margin: float | None, actual_margin: float | None, threshold: float
) -> bool:
    """True when the smaller known margin is <= threshold; False when neither is known."""
    known = [m for m in (oracle_margin, actual_margin) if m is not None]
    return bool(known) and min(known) <= threshold


def _rank(token: str | None, keys: list[str]) -> int | None:
    if token is None or token not in keys:
        return None
    return keys.index(token) + 1


@dataclass(frozen=True)
class StepStats:
    """Per-step agreement over steps ``0 .. compared_steps-1``."""

    compared_steps: int
    top1_matches: int
    top1_match_rate: float | None
    topk_overlap_mean: float | None
    topk_overlap_min: float | None
    max_common_logprob_abs_error: float | None
    mean_common_logprob_abs_error: float | None
    max_chosen_token_logprob_abs_error: float | None
    mean_chosen_token_logprob_abs_error: float | None


def _chosen_delta(oracle: Completion, actual: Completion, step: int) -> float | None:
    if oracle.tokens[step] != actual.tokens[step]:
        return None
    a = oracle.token_logprobs[step] if step < len(oracle.token_logprobs) else None
    b = actual.token_logprobs[step] if step < len(actual.token_logprobs) else None
    return None if a is None or b is None else abs(a - b)


def step_stats(oracle: Completion, actual: Completion, steps: int, top_n: int) -> StepStats:
    """Aggregate top-1, top-k overlap and logprob errors over the first ``steps`` steps."""
    top1 = 0
    overlaps: list[float] = []
    common: list[float] = []
    chosen: list[float] = []
    for step in range(steps):
        o_step, a_step = oracle.top_logprobs[step], actual.top_logprobs[step]
        o_keys, a_keys = top_keys(o_step, top_n), top_keys(a_step, top_n)
        top1 += bool(o_keys and a_keys and o_keys[0] == a_keys[0])
        overlap = topk_overlap(o_step, a_step, top_n)
        if overlap is not None:
            overlaps.append(overlap)
        shared = set(a_keys)
        common.extend(abs(o_step[k] - a_step[k]) for k in o_keys if k in shared)
        delta = _chosen_delta(oracle, actual, step)
        if delta is not None:
            chosen.append(delta)
    return StepStats(
        compared_steps=steps,
        top1_matches=top1,
        top1_match_rate=top1 / steps if steps else None,
        topk_overlap_mean=_mean(overlaps),
        topk_overlap_min=_min(overlaps),
        max_common_logprob_abs_error=_max(common),
        mean_common_logprob_abs_error=_mean(common),
        max_chosen_token_logprob_abs_error=_max(chosen),
        mean_chosen_token_logprob_abs_error=_mean(chosen),
    )


@dataclass(frozen=True)
class FirstMismatch:
    """Where the two runs first fork (``fork``), with each side's confidence there."""

    fork: Fork
    oracle_top1_margin: float | None
    actual_top1_margin: float | None
    oracle_actual_rank: int | None
    actual_oracle_rank: int | None
    topk_overlap: float | None
    low_margin: bool
    oracle_top5: tuple[tuple[str, float], ...]
    actual_top5: tuple[tuple[str, float], ...]


def _step_or_empty(tops: Sequence[Mapping[str, float]], step: int) -> Mapping[str, float]:
    return tops[step] if step < len(tops) else {}


def _first_mismatch_detail(
    oracle: Completion, actual: Completion, top_n: int, threshold: float
) -> FirstMismatch | None:
    found = first_mismatch(oracle.tokens, actual.tokens)
    if found is None:
        return None
    step = found.step
    o_step = _step_or_empty(oracle.top_logprobs, step)
    a_step = _step_or_empty(actual.top_logprobs, step)
    o_margin, a_margin = top1_margin(o_step), top1_margin(a_step)
    both = step < len(oracle.top_logprobs) and step < len(actual.top_logprobs)
    return FirstMismatch(
        fork=found,
        oracle_top1_margin=o_margin,
        actual_top1_margin=a_margin,
        oracle_actual_rank=_rank(found.actual, top_keys(o_step, top_n)),
        actual_oracle_rank=_rank(found.oracle, top_keys(a_step, top_n)),
        topk_overlap=topk_overlap(o_step, a_step, top_n) if both else None,
        low_margin=is_low_margin(o_margin, a_margin, threshold),
        oracle_top5=tuple(list(o_step.items())[:TOP_LIST_SIZE]),
        actual_top5=tuple(list(a_step.items())[:TOP_LIST_SIZE]),
    )


@dataclass(frozen=True)
class MarginStats:
    mean: float | None
    min: float | None


def _margin_stats(completion: Completion) -> MarginStats:
    known = [m for m in map(top1_margin, completion.top_logprobs) if m is not None]
    return MarginStats(mean=_mean(known), min=_min(known))


def _prompt_ids_match(oracle: Completion, actual: Completion) -> bool | None:
    if oracle.prompt_token_ids is None or actual.prompt_token_ids is None:
        return None
    return oracle.prompt_token_ids == actual.prompt_token_ids


def compare_completions(
    case: str,
    oracle: Completion,
    actual: Completion,
    *,
    top_n: int,
    low_margin: float,
) -> CaseResult:
    """Compare a baseline (``oracle``) and a candidate (``actual``) free-running completion.

    The result is ungated (no failures, not passed): ``compare`` applies the gates."""
    steps = min(
        len(oracle.tokens), len(actual.tokens), len(oracle.top_logprobs), len(actual.top_logprobs)
    )
    m = _first_mismatch_detail(oracle, actual, top_n, low_margin)
    stop = m.fork.step if m is not None and m.low_margin else None
    every = step_stats(oracle, actual, steps, top_n)
    path = step_stats(oracle, actual, steps if stop is None else min(steps, stop), top_n)
    o_margins, a_margins = _margin_stats(oracle), _margin_stats(actual)
    ids = oracle.prompt_token_ids
    return CaseResult(
        case=case,
        tokens_match=m is None,
        prompt_token_ids_match=_prompt_ids_match(oracle, actual),
        matching_prefix_tokens=matching_prefix(oracle.tokens, actual.tokens),
        oracle_token_count=len(oracle.tokens),
        actual_token_count=len(actual.tokens),
        compared_steps=every.compared_steps,
        top1_matches=every.top1_matches,
        top1_match_rate=every.top1_match_rate,
        topk_overlap_mean=every.topk_overlap_mean,
        topk_overlap_min=every.topk_overlap_min,
        max_common_logprob_abs_error=every.max_common_logprob_abs_error,
        mean_common_logprob_abs_error=every.mean_common_logprob_abs_error,
        max_chosen_token_logprob_abs_error=every.max_chosen_token_logprob_abs_error,
        mean_chosen_token_logprob_abs_error=every.mean_chosen_token_logprob_abs_error,
        trajectory_compared_steps=path.compared_steps,
        trajectory_top1_matches=path.top1_matches,
        trajectory_top1_match_rate=path.top1_match_rate,
        trajectory_topk_overlap_mean=path.topk_overlap_mean,
        trajectory_topk_overlap_min=path.topk_overlap_min,
        trajectory_max_common_logprob_abs_error=path.max_common_logprob_abs_error,
        trajectory_mean_common_logprob_abs_error=path.mean_common_logprob_abs_error,
        trajectory_max_chosen_token_logprob_abs_error=path.max_chosen_token_logprob_abs_error,
        trajectory_mean_chosen_token_logprob_abs_error=path.mean_chosen_token_logprob_abs_error,
        trajectory_stopped_at_low_margin_fork=stop is not None,
        trajectory_stop_step=stop,
        oracle_top1_margin_mean=o_margins.mean,
        oracle_top1_margin_min=o_margins.min,
        actual_top1_margin_mean=a_margins.mean,
        actual_top1_margin_min=a_margins.min,
        first_token_mismatch=None if m is None else m.fork,
        first_token_mismatch_oracle_top1_margin=None if m is None else m.oracle_top1_margin,
        first_token_mismatch_actual_top1_margin=None if m is None else m.actual_top1_margin,
        first_token_mismatch_oracle_actual_rank=None if m is None else m.oracle_actual_rank,
        first_token_mismatch_actual_oracle_rank=None if m is None else m.actual_oracle_rank,
        first_token_mismatch_topk_overlap=None if m is None else m.topk_overlap,
        first_token_mismatch_oracle_top5=None if m is None else m.oracle_top5,
        first_token_mismatch_actual_top5=None if m is None else m.actual_top5,
        first_token_mismatch_low_margin=m is not None and m.low_margin,
        prompt_tokens=None if ids is None else len(ids),
        chosen_logprob_abs_deltas=chosen_deltas(oracle, actual),
    )


def bucket_kl(p_logprobs: Mapping[int, float], q_logprobs: Mapping[int, float]) -> float | None:
    """KL(P || Q) over the tokens both top-k lists hold, plus one bucket for the rest.

    Merging the unseen tokens into one tail bucket is a coarsening of both
    distributions, so the value is a true KL of valid distributions and a lower
    bound on the full-vocabulary KL. None when the lists share no token.
    """
    shared = [k for k in p_logprobs if k in q_logprobs]
    if not shared:
        return None
    kl = math.fsum(math.exp(p_logprobs[k]) * (p_logprobs[k] - q_logprobs[k]) for k in shared)
    p_tail = 1.0 - math.fsum(math.exp(p_logprobs[k]) for k in shared)
    q_tail = 1.0 - math.fsum(math.exp(q_logprobs[k]) for k in shared)
    if p_tail > TAIL_FLOOR:
        kl += p_tail * math.log(p_tail / max(q_tail, TAIL_FLOOR))
    # Rounding in exp/fsum can leave -1e-17 for identical inputs; KL is >= 0 by Gibbs.
    return max(kl, 0.0)


@dataclass(frozen=True)
class TeacherForced:
    """Per-position agreement of two servers scoring the same token sequence."""

    completion_start: int
    logprob_deltas: tuple[float | None, ...]
    kls: tuple[float | None, ...]

    def onto(self, case: CaseResult) -> CaseResult:
        """``case`` with these scores and their summaries: over every position (``tf_*``)
        and over the completion only (``tf_completion_*``)."""
        start = self.completion_start
        every = _tf_summary(self.logprob_deltas, self.kls, 0)
        tail = _tf_summary(self.logprob_deltas[start:], self.kls[start:], start)
        return msgspec.structs.replace(
            case,
            tf_positions=len(self.kls),
            tf_completion_start=start,
            tf_logprob_delta=self.logprob_deltas,
            tf_kl=self.kls,
            tf_max_abs_logprob_delta=every.max_abs_logprob_delta,
            tf_mean_abs_logprob_delta=every.mean_abs_logprob_delta,
            tf_max_kl=every.max_kl,
            tf_max_kl_position=every.max_kl_position,
            tf_mean_kl=every.mean_kl,
            tf_completion_max_abs_logprob_delta=tail.max_abs_logprob_delta,
            tf_completion_mean_abs_logprob_delta=tail.mean_abs_logprob_delta,
            tf_completion_max_kl=tail.max_kl,
            tf_completion_max_kl_position=tail.max_kl_position,
            tf_completion_mean_kl=tail.mean_kl,
        )


@dataclass(frozen=True)
class _TfSummary:
    max_abs_logprob_delta: float | None
    mean_abs_logprob_delta: float | None
    max_kl: float | None
    max_kl_position: int | None
    mean_kl: float | None


def _tf_summary(
    deltas: Sequence[float | None], kls: Sequence[float | None], offset: int
) -> _TfSummary:
    abs_deltas = [abs(d) for d in deltas if d is not None]
    known_kls = [(k, i + offset) for i, k in enumerate(kls) if k is not None]
    worst = max(known_kls, default=None)
    return _TfSummary(
        max_abs_logprob_delta=_max(abs_deltas),
        mean_abs_logprob_delta=_mean(abs_deltas),
        max_kl=worst[0] if worst else None,
        max_kl_position=worst[1] if worst else None,
        mean_kl=_mean([k for k, _ in known_kls]),
    )


def _position_delta(
    base: Mapping[int, float] | None, cand: Mapping[int, float] | None, token: int
) -> float | None:
    if base is None or cand is None or token not in base or token not in cand:
        return None
    return cand[token] - base[token]


def compare_teacher_forced(baseline: TeacherScores, candidate: TeacherScores) -> TeacherForced:
    """Per-position signed logprob delta of the scored token and bucketed KL(base || cand)."""
    if baseline.sequence != candidate.sequence:
        raise ValueError("teacher-forced scores are over different token sequences")
    pairs = list(zip(baseline.positions, candidate.positions, strict=True))
    return TeacherForced(
        completion_start=baseline.completion_start,
        logprob_deltas=tuple(
            _position_delta(b, c, tok) for (b, c), tok in zip(pairs, baseline.sequence, strict=True)
        ),
        kls=tuple(None if b is None or c is None else bucket_kl(b, c) for b, c in pairs),
    )


def chosen_deltas(oracle: Completion, actual: Completion) -> tuple[float | None, ...]:
    """|Δ chosen-token logprob| per baseline step while both runs chose the same token;
    None from the first fork on (the two runs then condition on different text)."""
    out: list[float | None] = []
    for step in range(len(oracle.tokens)):
        same = step < len(actual.tokens) and oracle.tokens[step] == actual.tokens[step]
        out.append(_chosen_delta(oracle, actual, step) if same else None)
        if not same:
            out.extend([None] * (len(oracle.tokens) - step - 1))
            break
    return tuple(out)
