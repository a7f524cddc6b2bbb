"""What a parity failure looks like, in words a person can act on.

``case_views`` reads, per case, what the pictures and the diagnosis need (prompt length,
|Δ chosen logprob| per step, the first fork and its margin) from the compare report's
``CaseResult`` values. ``diagnose`` names the pattern in one line and the next step:

- every case diverges at step 0: **systematic** (wrong on any prompt: a stage, a combine
  or a kernel, not rounding): bisect by stage or combine;
- late, low-margin forks (or logprob drift with the same tokens) only: **numerical noise**:
  calibrate the gates on repeated baseline captures;
- only prompts past a page or shard boundary fail: **layout** (the KV cache's placement or
  index conversion): ``--teacher-forced`` to find the first position that differs, then
  bisect by stage;
- failures with no step-0 fork and no length pattern, forking above the low-margin
  threshold: **drift** (an error growing along the sequence): ``--teacher-forced`` tells a
  smooth growth (rounding: calibrate) from a jump (a bug: bisect by stage);
- anything else: **mixed**: ``--teacher-forced`` so a fork no longer hides the rest.

``first_divergence_text`` decodes the first fork with the served model's tokenizer: a few
tokens of context, then both continuations.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bakery.verify.bundle import Completion
from bakery.verify.result import CaseResult, Diagnosis, DiagnosisPattern, ForkText

__all__ = [
    "CaseView",
    "Diagnosis",
    "case_views",
    "diagnose",
    "first_divergence_text",
    "tokenizer_decoder",
    "NEXT_STEPS",
]

NEXT_STEPS: dict[DiagnosisPattern, str] = {
    "pass": "none: every case is within its gates",
    "systematic": "bisect by stage or combine: serve the candidate at a lower `stage` or "
    "the other `combine` in the matrix, or `bakery bisect -- <a command that fails>` to "
    "name the first bad patch",
    "noise": "calibrate: `bakery verify calibrate` over repeated baseline captures, then "
    "rerun with `--gates` set to its output",
    "layout": "capture with `--teacher-forced` to find the first position past the "
    "boundary that differs, then bisect by stage (`bakery bisect`)",
    "drift": "capture with `--teacher-forced` (the baseline's tokens scored through the "
    "candidate): an error that grows smoothly along the sequence is rounding (calibrate), "
    "one that jumps at a position is a bug (bisect by stage)",
    "mixed": "capture with `--teacher-forced` (the baseline's tokens scored through the "
    "candidate, so a fork no longer hides the rest), then bisect by stage or combine",
}
CONTEXT_TOKENS = 8
CONTINUATION_TOKENS = 4


@dataclass(frozen=True)
class CaseView:
    case: str
    prompt_tokens: int | None
    deltas: tuple[float | None, ...]
    fork_step: int | None
    low_margin: bool
    passed: bool
    max_chosen_error: float | None = None  # |Δ chosen logprob| up to the fork


def case_views(cases: Mapping[str, CaseResult]) -> list[CaseView]:
    """One view per case of a compare report's ``cases``, shortest prompt first (ties by
    name)."""
    views = [
        CaseView(
            case=name,
            prompt_tokens=case.prompt_tokens,
            deltas=case.chosen_logprob_abs_deltas,
            fork_step=case.fork_step,
            low_margin=case.first_token_mismatch_low_margin,
            passed=case.passed,
            max_chosen_error=case.trajectory_max_chosen_token_logprob_abs_error,
        )
        for name, case in cases.items()
    ]
    return sorted(views, key=lambda v: (v.prompt_tokens or 0, v.case))


def _noise_like(view: CaseView) -> bool:
    """A late, low-margin fork, or the same tokens with drifting logprobs."""
    return view.fork_step is None or (view.fork_step > 0 and view.low_margin)


def _layout_boundary(views: Sequence[CaseView], boundaries: Sequence[int]) -> int | None:
    """The largest boundary that splits the cases: all failing ones past it, all the
    ones within it passing (and there are some): the one closest to the failures."""
    for bound in sorted(set(boundaries), reverse=True):
        within = [v for v in views if (v.prompt_tokens or 0) <= bound]
        past = [v for v in views if (v.prompt_tokens or 0) > bound]
        if within and all(v.passed for v in within) and any(not v.passed for v in past):
            return bound
    return None


def _diagnosis(pattern: DiagnosisPattern, line: str, boundary: int | None = None) -> Diagnosis:
    return Diagnosis(pattern, line, NEXT_STEPS[pattern], boundary)


def diagnose(views: Sequence[CaseView], boundaries: Sequence[int] = ()) -> Diagnosis:
    """The pattern of the failing cases, in one line, and the next step it suggests."""
    failing = [v for v in views if not v.passed]
    total = len(views)
    if not failing:
        return _diagnosis("pass", f"all {total} cases pass")
    if len(failing) == total and all(v.fork_step == 0 for v in failing):
        line = (
            f"systematic: all {total} cases diverge at step 0, so the candidate is wrong "
            "on any prompt (a stage, a combine or a kernel, not rounding)"
        )
        return _diagnosis("systematic", line)
    if all(_noise_like(v) for v in failing):
        forks = sorted({v.fork_step for v in failing if v.fork_step is not None})
        where = f"fork late (steps {forks}) at low margin" if forks else "keep every token"
        errors = [v.max_chosen_error for v in failing if v.max_chosen_error is not None]
        size = f", chosen logprobs off by up to {max(errors):.3g} nats" if errors else ""
        line = (
            f"numerical noise: {len(failing)} of {total} cases fail, and all {where}{size}; "
            "rounding, not a wrong token"
        )
        return _diagnosis("noise", line)
    bound = _layout_boundary(views, boundaries)
    if bound is not None:
        line = (
            f"layout: only prompts past {bound} tokens fail ({len(failing)} of {total}); "
            f"every case within {bound} passes, so the KV placement or index conversion "
            "past that page or shard is suspect"
        )
        return _diagnosis("layout", line, bound)
    steps = sorted({v.fork_step for v in failing if v.fork_step is not None})
    if 0 not in steps:
        line = (
            f"drift: {len(failing)} of {total} cases fail, none at step 0 and not by prompt "
            f"length: the runs agree, then part (first forks at steps {steps}) above the "
            "low-margin threshold: an error that grows along the sequence"
        )
        return _diagnosis("drift", line)
    line = f"mixed: {len(failing)} of {total} cases fail, first forks at steps {steps}"
    return _diagnosis("mixed", line)


def tokenizer_decoder(model_dir: Path | None) -> Callable[[Sequence[int]], str] | None:
    """Decode ids with the served model's ``tokenizer.json`` (the ``tokenizers`` library,
    vLLM's own dependency); None when there is none to read."""
    path = None if model_dir is None else Path(model_dir) / "tokenizer.json"
    if path is None or not path.is_file():
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    tokenizer = Tokenizer.from_file(str(path))
    return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False)


def first_divergence_text(
    base: Completion, cand: Completion, step: int, decode: Callable[[Sequence[int]], str]
) -> ForkText | None:
    """The last few tokens before the fork (prompt and common output), then each side's
    next few tokens, decoded; None without token ids."""
    base_ids, cand_ids = base.token_ids, cand.token_ids
    if base_ids is None or cand_ids is None:
        return None
    before = list(base.prompt_token_ids or ()) + list(base_ids[:step])
    return ForkText(
        context=decode(before[-CONTEXT_TOKENS:]),
        baseline=decode(base_ids[step : step + CONTINUATION_TOKENS]),
        candidate=decode(cand_ids[step : step + CONTINUATION_TOKENS]),
    )
