"""The comparison report's types: ``ParityReport`` (``compare --json``, the matrix's
reports/<entry>.json) holds one ``CaseResult`` per case, its ``Diagnosis`` and each gate's
``GateSetting``.

A case is one flat JSON object (the field names of jasl/vllm-ds4-sm120-harness
``oracle-compare``, which readers of the report already know), so ``CaseResult`` is flat
too; its parts are named by their prefix: the token match, the step statistics over every
common step and over the trajectory (``trajectory_*``, up to a low-margin fork), the first
mismatch (``first_token_mismatch*``, its tokens a ``Fork``), the teacher-forced scores
(``tf_*``, left out of the JSON unless compare ran with them), the gates' verdict
(``gate_failures``, ``passed``) and what the diagnosis reads (``prompt_tokens``,
``chosen_logprob_abs_deltas``, the fork as text). ``None`` means "could not be computed".
A report read back from disk is decoded into these types (``bakery.schema.decode``).
"""

from __future__ import annotations

from typing import Any, Literal

from msgspec import UNSET, UnsetType

from bakery.schema import Document

__all__ = [
    "Fork",
    "ForkText",
    "CaseResult",
    "Diagnosis",
    "DiagnosisPattern",
    "GateSetting",
    "ReportSettings",
    "ReportSide",
    "ParityReport",
]

Top = tuple[tuple[str, float], ...]  # (token, logprob) in served order
Scores = tuple[float | None, ...]


class Fork(Document, frozen=True):
    """Where the two runs first part: the step and each side's token (None: that run had
    ended there)."""

    step: int
    oracle: str | None
    actual: str | None


class ForkText(Document, frozen=True):
    """The first fork decoded with the served model's tokenizer: a few tokens before it,
    then each side's next few."""

    context: str
    baseline: str
    candidate: str


class CaseResult(Document, frozen=True, kw_only=True):
    """One case of the report: every metric, the gates' verdict and what the diagnosis reads."""

    case: str
    tokens_match: bool
    prompt_token_ids_match: bool | None
    matching_prefix_tokens: int
    oracle_token_count: int
    actual_token_count: int
    # every step both runs have
    compared_steps: int
    top1_matches: int
    top1_match_rate: float | None
    topk_overlap_mean: float | None
    topk_overlap_min: float | None
    max_common_logprob_abs_error: float | None
    mean_common_logprob_abs_error: float | None
    max_chosen_token_logprob_abs_error: float | None
    mean_chosen_token_logprob_abs_error: float | None
    # the trajectory: the steps before a low-margin fork (the gates read these)
    trajectory_compared_steps: int
    trajectory_top1_matches: int
    trajectory_top1_match_rate: float | None
    trajectory_topk_overlap_mean: float | None
    trajectory_topk_overlap_min: float | None
    trajectory_max_common_logprob_abs_error: float | None
    trajectory_mean_common_logprob_abs_error: float | None
    trajectory_max_chosen_token_logprob_abs_error: float | None
    trajectory_mean_chosen_token_logprob_abs_error: float | None
    trajectory_stopped_at_low_margin_fork: bool
    trajectory_stop_step: int | None
    oracle_top1_margin_mean: float | None
    oracle_top1_margin_min: float | None
    actual_top1_margin_mean: float | None
    actual_top1_margin_min: float | None
    # the first mismatch, with each side's confidence there
    first_token_mismatch: Fork | None
    first_token_mismatch_oracle_top1_margin: float | None
    first_token_mismatch_actual_top1_margin: float | None
    first_token_mismatch_oracle_actual_rank: int | None
    first_token_mismatch_actual_oracle_rank: int | None
    first_token_mismatch_topk_overlap: float | None
    first_token_mismatch_oracle_top5: Top | None
    first_token_mismatch_actual_top5: Top | None
    first_token_mismatch_low_margin: bool
    # teacher-forced: the baseline's tokens scored by both servers (compare --teacher-forced)
    tf_positions: int | UnsetType = UNSET
    tf_completion_start: int | UnsetType = UNSET
    tf_logprob_delta: Scores | UnsetType = UNSET
    tf_kl: Scores | UnsetType = UNSET
    tf_max_abs_logprob_delta: float | None | UnsetType = UNSET
    tf_mean_abs_logprob_delta: float | None | UnsetType = UNSET
    tf_max_kl: float | None | UnsetType = UNSET
    tf_max_kl_position: int | None | UnsetType = UNSET
    tf_mean_kl: float | None | UnsetType = UNSET
    tf_completion_max_abs_logprob_delta: float | None | UnsetType = UNSET
    tf_completion_mean_abs_logprob_delta: float | None | UnsetType = UNSET
    tf_completion_max_kl: float | None | UnsetType = UNSET
    tf_completion_max_kl_position: int | None | UnsetType = UNSET
    tf_completion_mean_kl: float | None | UnsetType = UNSET
    # the gates' verdict (an ungated result, as metrics makes it, has not passed)
    gate_failures: tuple[str, ...] = ()
    passed: bool = False
    # for the pictures and the diagnosis
    prompt_tokens: int | None
    chosen_logprob_abs_deltas: Scores
    first_token_mismatch_text: ForkText | None | UnsetType = UNSET  # set when compare decodes

    @property
    def fork_step(self) -> int | None:
        """The first mismatch's step; None when every token matches."""
        return None if self.first_token_mismatch is None else self.first_token_mismatch.step

    def has(self, name: str) -> bool:
        """Whether this report holds the field (``tf_*`` only with teacher-forced scores)."""
        return getattr(self, name) is not UNSET

    def value(self, name: str) -> Any:
        """A metric by its field name (the gates and the report's table name them); None
        when it is not in this report (``tf_*`` without teacher-forced scores)."""
        found = getattr(self, name)
        return None if found is UNSET else found


DiagnosisPattern = Literal["pass", "systematic", "noise", "layout", "drift", "mixed"]


class Diagnosis(Document, frozen=True):
    """The pattern of the failing cases in one line, and the next step it suggests."""

    pattern: DiagnosisPattern
    line: str
    next_step: str
    boundary: int | None = None  # layout: the page or shard length the failures lie past


class GateSetting(Document, frozen=True):
    """One gate as the report shows it: its bound or switch (None: off) and who set it."""

    value: bool | float | None
    source: str


class ReportSettings(Document, frozen=True, kw_only=True):
    top_n: int
    low_margin: float
    teacher_forced: bool


class ReportSide(Document, frozen=True, kw_only=True):
    """A compared bundle: its folder, its bundle.json as captured, the servers' fingerprints."""

    path: str
    meta: dict[str, Any]  # another tool's bundle.json is kept as it is
    system_fingerprints: tuple[str, ...]


class ParityReport(Document, frozen=True, kw_only=True):
    """The comparison report (``compare --json``, the matrix's reports/<entry>.json)."""

    cases: dict[str, CaseResult]
    diagnosis: Diagnosis
    passed: bool
    gates: dict[str, GateSetting]
    settings: ReportSettings
    baseline: ReportSide
    candidate: ReportSide

    def failing(self) -> list[str]:
        """The names of the cases that failed a gate, sorted."""
        return sorted(name for name, case in self.cases.items() if not case.passed)
