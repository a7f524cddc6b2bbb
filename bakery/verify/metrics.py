"""Parity metrics: pure functions from two parsed completions to flat snake_case numbers.

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
from dataclasses import asdict, dataclass
from typing import Any

from bakery.verify.bundle import Completion, TeacherScores

__all__ = [
    "StepStats",
    "FirstMismatch",
    "CaseMetrics",
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


def first_mismatch(oracle: Sequence[str], actual: Sequence[str]) -> dict[str, Any] | None:
    """``{step, oracle, actual}`` at the first differing step, or the shorter run's end."""
    for step, (a, b) in enumerate(zip(oracle, actual, strict=False)):
        if a != b:
            return {"step": step, "oracle": a, "actual": b}
    if len(oracle) == len(actual):
        return None
    step = min(len(oracle), len(actual))
    return {
        "step": step,
        "oracle": oracle[step] if step < len(oracle) else None,
        "actual": actual[step] if step < len(actual) else None,
    }


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
    """Where the two runs first fork, with each side's confidence there."""

    step: int
    oracle: str | None
    actual: str | None
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
    step = found["step"]
    o_step = _step_or_empty(oracle.top_logprobs, step)
    a_step = _step_or_empty(actual.top_logprobs, step)
    o_margin, a_margin = top1_margin(o_step), top1_margin(a_step)
    both = step < len(oracle.top_logprobs) and step < len(actual.top_logprobs)
    return FirstMismatch(
        step=step,
        oracle=found["oracle"],
        actual=found["actual"],
        oracle_top1_margin=o_margin,
        actual_top1_margin=a_margin,
        oracle_actual_rank=_rank(found["actual"], top_keys(o_step, top_n)),
        actual_oracle_rank=_rank(found["oracle"], top_keys(a_step, top_n)),
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


@dataclass(frozen=True)
class CaseMetrics:
    """Everything compare reports for one case; ``as_dict`` gives the flat field names."""

    case: str
    tokens_match: bool
    prompt_token_ids_match: bool | None
    matching_prefix_tokens: int
    oracle_token_count: int
    actual_token_count: int
    steps: StepStats
    trajectory: StepStats
    trajectory_stop_step: int | None
    mismatch: FirstMismatch | None
    oracle_margins: MarginStats
    actual_margins: MarginStats

    @property
    def first_token_mismatch_low_margin(self) -> bool:
        return self.mismatch is not None and self.mismatch.low_margin

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "case": self.case,
            "tokens_match": self.tokens_match,
            "prompt_token_ids_match": self.prompt_token_ids_match,
            "matching_prefix_tokens": self.matching_prefix_tokens,
            "oracle_token_count": self.oracle_token_count,
            "actual_token_count": self.actual_token_count,
            **asdict(self.steps),
            **{f"trajectory_{k}": v for k, v in asdict(self.trajectory).items()},
            "trajectory_stopped_at_low_margin_fork": self.trajectory_stop_step is not None,
            "trajectory_stop_step": self.trajectory_stop_step,
            "oracle_top1_margin_mean": self.oracle_margins.mean,
            "oracle_top1_margin_min": self.oracle_margins.min,
            "actual_top1_margin_mean": self.actual_margins.mean,
            "actual_top1_margin_min": self.actual_margins.min,
        }
        out.update(_mismatch_fields(self.mismatch))
        out["first_token_mismatch_low_margin"] = self.first_token_mismatch_low_margin
        return out


def _mismatch_fields(mismatch: FirstMismatch | None) -> dict[str, Any]:
    names = (
        "oracle_top1_margin",
        "actual_top1_margin",
        "oracle_actual_rank",
        "actual_oracle_rank",
        "topk_overlap",
        "oracle_top5",
        "actual_top5",
    )
    if mismatch is None:
        return {"first_token_mismatch": None, **{f"first_token_mismatch_{n}": None for n in names}}
    fields = asdict(mismatch)
    out: dict[str, Any] = {
        "first_token_mismatch": {k: fields[k] for k in ("step", "oracle", "actual")},
    }
    for name in names:
        value = fields[name]
        out[f"first_token_mismatch_{name}"] = [list(p) for p in value] if "top5" in name else value
    return out


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
) -> CaseMetrics:
    """Compare a baseline (``oracle``) and a candidate (``actual``) free-running completion."""
    steps = min(
        len(oracle.tokens), len(actual.tokens), len(oracle.top_logprobs), len(actual.top_logprobs)
    )
    mismatch = _first_mismatch_detail(oracle, actual, top_n, low_margin)
    stop = mismatch.step if mismatch is not None and mismatch.low_margin else None
    return CaseMetrics(
        case=case,
        tokens_match=mismatch is None,
        prompt_token_ids_match=_prompt_ids_match(oracle, actual),
        matching_prefix_tokens=matching_prefix(oracle.tokens, actual.tokens),
        oracle_token_count=len(oracle.tokens),
        actual_token_count=len(actual.tokens),
        steps=step_stats(oracle, actual, steps, top_n),
        trajectory=step_stats(oracle, actual, steps if stop is None else min(steps, stop), top_n),
        trajectory_stop_step=stop,
        mismatch=mismatch,
        oracle_margins=_margin_stats(oracle),
        actual_margins=_margin_stats(actual),
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

    def as_dict(self) -> dict[str, Any]:
        start = self.completion_start
        out: dict[str, Any] = {
            "tf_positions": len(self.kls),
            "tf_completion_start": start,
            "tf_logprob_delta": list(self.logprob_deltas),
            "tf_kl": list(self.kls),
        }
        out.update(_tf_summary("tf", self.logprob_deltas, self.kls, 0))
        tail = (self.logprob_deltas[start:], self.kls[start:])
        out.update(_tf_summary("tf_completion", *tail, start))
        return out


def _tf_summary(
    prefix: str, deltas: Sequence[float | None], kls: Sequence[float | None], offset: int
) -> dict[str, Any]:
    abs_deltas = [abs(d) for d in deltas if d is not None]
    known_kls = [(k, i + offset) for i, k in enumerate(kls) if k is not None]
    worst = max(known_kls, default=None)
    return {
        f"{prefix}_max_abs_logprob_delta": _max(abs_deltas),
        f"{prefix}_mean_abs_logprob_delta": _mean(abs_deltas),
        f"{prefix}_max_kl": worst[0] if worst else None,
        f"{prefix}_max_kl_position": worst[1] if worst else None,
        f"{prefix}_mean_kl": _mean([k for k, _ in known_kls]),
    }


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
