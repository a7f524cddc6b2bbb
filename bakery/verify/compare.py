"""Compare two bundles under configurable gates and produce the report (``ParityReport``).

``compare_bundles`` is the whole pipeline: load both bundles, check they ask the
same questions, compute each case's metrics, apply the gates. It writes nothing;
``report`` renders and writes, ``bakery.cli.verify`` maps the verdict to an exit code.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import msgspec

from bakery.schema import Document, decode, refuse
from bakery.verify.bundle import (
    Bundle,
    CaseRecord,
    TeacherScores,
    load_bundle,
    load_json_object,
)
from bakery.verify.diagnose import case_views, diagnose, first_divergence_text
from bakery.verify.errors import BundleError, GatesError
from bakery.verify.metrics import compare_completions, compare_teacher_forced
from bakery.verify.result import CaseResult, GateSetting, ParityReport, ReportSettings, ReportSide
from bakery.verify.spec_decode import SpecCase

__all__ = [
    "ParityGates",
    "CalibrationPolicy",
    "Calibration",
    "GatesFileDoc",
    "ParityReport",
    "CaseResult",
    "derive_threshold",
    "load_gates",
    "compare_bundles",
    "evaluate_gates",
    "BOUND_GATES",
    "FORK_GATE",
]

# The request fields that make two captures the same question. ``model`` is left
# out on purpose: a candidate may serve a copy of the model under another path.
COMPARABLE_REQUEST_FIELDS = ("prompt", "max_tokens", "temperature", "logprobs")

# gate name -> (CaseResult field it reads, "max" = value must be <= bound, "min" = >=).
# Bounds read the trajectory_* fields: after a low-margin fork the two runs condition
# on different text, so their distributions may differ legitimately.
BOUND_GATES: dict[str, tuple[str, str]] = {
    "max_chosen_token_logprob_abs_error": ("trajectory_max_chosen_token_logprob_abs_error", "max"),
    "max_common_logprob_abs_error": ("trajectory_max_common_logprob_abs_error", "max"),
    "min_topk_overlap_mean": ("trajectory_topk_overlap_mean", "min"),
    "min_topk_overlap_min": ("trajectory_topk_overlap_min", "min"),
    "max_tf_kl": ("tf_max_kl", "max"),
    "max_tf_abs_logprob_delta": ("tf_max_abs_logprob_delta", "max"),
    # The mean over every scored position: rounding moves a few positions, a wrong
    # selection moves every position past the indexer's threshold.
    "max_tf_mean_abs_logprob_delta": ("tf_mean_abs_logprob_delta", "max"),
}


@dataclass(frozen=True)
class ParityGates:
    """What a candidate must satisfy; a bound of None is off. ``sources`` says who set each."""

    require_prompt_ids_equal: bool = True
    fail_on_high_margin_mismatch: bool = True
    max_chosen_token_logprob_abs_error: float | None = None
    max_common_logprob_abs_error: float | None = None
    min_topk_overlap_mean: float | None = None
    min_topk_overlap_min: float | None = None
    max_tf_kl: float | None = None
    max_tf_abs_logprob_delta: float | None = None
    max_tf_mean_abs_logprob_delta: float | None = None
    # On by default: a low-margin fork is excused only where it is a near tie, each side's
    # token in the other's top-k and the top-k lists mostly shared. Without it a candidate
    # with every token different passed on its own small margin at step 0.
    min_fork_topk_overlap: float | None = 0.5
    # Speculative decoding: a case whose tokens agree with the baseline's must have had
    # about as many of its drafted tokens accepted (vLLM's counts, bundle.json's
    # spec_decode). Greedy verification keeps the tokens whatever the draft proposes, so a
    # draft computed wrong (its KV on the wrong rank) shows here and nowhere else.
    max_spec_accepted_delta: float | None = None
    sources: Mapping[str, str] = field(default_factory=dict)

    def values(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "sources"}

    def table(self) -> dict[str, GateSetting]:
        """Each gate's value and who set it, as the report and the matrix's summary show them."""
        return {
            name: GateSetting(value, self.sources.get(name, "default"))
            for name, value in self.values().items()
        }

    def with_values(self, source: str, **values: Any) -> ParityGates:
        """A copy with the given (non-None) values set and attributed to ``source``."""
        given = {k: v for k, v in values.items() if v is not None}
        for name, value in given.items():
            _check_gate_value(name, value)
        return replace(self, **given, sources={**self.sources, **dict.fromkeys(given, source)})


FORK_GATE = "min_fork_topk_overlap"
SPEC_GATE = "max_spec_accepted_delta"
# The gates that take a number (or null: off); the others are switches.
NUMERIC_GATES = frozenset({*BOUND_GATES, FORK_GATE, SPEC_GATE})
# Largest bound a max_* gate takes: above it (1.8e308, the largest float) a bound is an off
# switch in disguise, where inf, the honest spelling, is refused; null switches a gate off.
MAX_BOUND = 1e9


def _gate_range(name: str) -> tuple[float, float]:
    return (0.0, 1.0) if name.startswith("min_") else (0.0, MAX_BOUND)


def _check_gate_value(name: str, value: Any) -> None:
    known = {f.name: f for f in fields(ParityGates) if f.name != "sources"}
    if name not in known:
        raise GatesError(f"unknown gate {name!r} (known: {', '.join(sorted(known))})")
    if name in NUMERIC_GATES:
        low, high = _gate_range(name)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        ok = number and math.isfinite(value) and low <= value <= high
        kind = f"a finite number in {low:g}..{high:g}"
    else:
        ok, kind = isinstance(value, bool), "true/false"
    if not ok:
        raise GatesError(f"gate {name!r} must be {kind}, got {value!r}")


KL_GATES = frozenset({"max_tf_kl"})


class CalibrationPolicy(Document, frozen=True, kw_only=True):
    """How far above the noise floor a threshold sits.

    The minimums keep a bit-deterministic baseline (floor 0) from producing a gate
    that any legitimate reduction-order change would break.
    """

    factor: float = 2.0
    min_logprob_bound: float = 0.05
    min_kl_bound: float = 1e-3
    min_overlap_slack: float = 0.05


def derive_threshold(name: str, floor: float | None, policy: CalibrationPolicy) -> float | None:
    """Widen a floor by ``policy``: upper bounds grow, overlap lower bounds shrink toward 0."""
    if floor is None:
        return None
    if BOUND_GATES[name][1] == "max":
        minimum = policy.min_kl_bound if name in KL_GATES else policy.min_logprob_bound
        return max(floor * policy.factor, minimum)
    slack = max((1.0 - floor) * policy.factor, policy.min_overlap_slack)
    return max(0.0, 1.0 - slack)


class Calibration(Document, frozen=True, kw_only=True):
    """A gates file's ``calibration``: the noise floor each bound gate's threshold was
    derived from, over which bundles and pairs, under which policy."""

    bundles: tuple[str, ...]
    pairs: int
    noise_floor: dict[str, float | None]  # gate name -> worst value seen (None: unseen)
    policy: CalibrationPolicy
    high_margin_mismatches: tuple[str, ...]

    @property
    def gates(self) -> ParityGates:
        """The thresholds: each floor widened by the policy (source ``calibration``)."""
        thresholds = {n: derive_threshold(n, v, self.policy) for n, v in self.noise_floor.items()}
        return ParityGates().with_values("calibration", **thresholds)

    def gates_file(self) -> GatesFileDoc:
        """The gates file ``compare --gates`` reads, this calibration inside."""
        gates = self.gates
        return GatesFileDoc(gates=gates.values(), sources=dict(gates.sources), calibration=self)


class GatesFileDoc(Document, frozen=True):
    """A gates file's shape; each gate's name and kind are ``ParityGates``' own to check."""

    gates: dict[str, Any]  # gate name -> bound or switch; null = the gate is off
    sources: dict[str, str] = {}  # gate name -> who set it ("calibration", ...)
    calibration: Calibration | None = None  # how calibrate derived them (for readers)


def load_gates(path: Path) -> ParityGates:
    """Read a gates file (``{"gates": {...}, "sources": {...}}``, as calibrate writes it)."""
    data = load_json_object(path, "gates file", GatesError)
    hint = "write it with `bakery verify calibrate`, or give gates as flags"
    doc = decode(data, GatesFileDoc, where=f"gates file {path}", error=GatesError, hint=hint)
    values = dict(doc.gates)  # null = gate off
    problems = []
    for name, value in values.items():
        try:
            if value is None and name not in NUMERIC_GATES:
                raise GatesError(f"gate {name!r} must be true/false, got null")
            _check_gate_value(name, 0.0 if value is None else value)
        except GatesError as exc:
            problems.append(f"$.gates: {exc}")
    refuse(problems, where=f"gates file {path}", error=GatesError, hint=hint)
    return replace(ParityGates(), **values, sources={k: doc.sources.get(k, "file") for k in values})


def evaluate_gates(case: CaseResult, gates: ParityGates) -> list[str]:
    """Every gate this case breaks, as one readable line each (empty list = pass)."""
    failures: list[str] = []
    if gates.require_prompt_ids_equal and case.prompt_token_ids_match is not True:
        state = "could not be checked" if case.prompt_token_ids_match is None else "differ"
        failures.append(f"prompt token ids {state}")
    fork = case.first_token_mismatch
    if gates.fail_on_high_margin_mismatch and fork is not None:
        if not case.first_token_mismatch_low_margin:
            failures.append(f"high-margin token mismatch at step {fork.step}")
    if fork is not None and gates.min_fork_topk_overlap is not None and not failures:
        failures.extend(_fork_failure(case, fork.step, gates.min_fork_topk_overlap))
    for name, (key, kind) in BOUND_GATES.items():
        failures.extend(_bound_failure(name, case.value(key), getattr(gates, name), kind, key))
    return failures


def _fork_failure(case: CaseResult, step: int, bound: float) -> list[str]:
    """The fork is no near tie: a chosen token outside the other's top-k, or top-k lists
    that share less than ``bound`` (or that could not be compared)."""
    ranks = (
        case.first_token_mismatch_oracle_actual_rank,
        case.first_token_mismatch_actual_oracle_rank,
    )
    if None in ranks:
        return [f"fork at step {step}: a chosen token is not in the other side's top-k"]
    overlap = case.first_token_mismatch_topk_overlap
    if overlap is None or not math.isfinite(overlap) or overlap < bound:
        return [f"fork at step {step}: top-k overlap {overlap} < {FORK_GATE} {bound:g}"]
    return []


def _bound_failure(name: str, value: Any, bound: float | None, kind: str, key: str) -> list[str]:
    if bound is None:
        return []
    if value is None:  # a bound that could not be checked certifies nothing
        return [f"{key} could not be computed (no common steps), so {name} is not met"]
    if not math.isfinite(value):  # NaN compares false with any bound: it must not pass
        return [f"{key} is {value}, not a finite number, so {name} is not met"]
    broken = value > bound if kind == "max" else value < bound
    if not broken:
        return []
    relation = ">" if kind == "max" else "<"
    return [f"{key} {value:.6g} {relation} {name} {bound:.6g}"]


def _only(bundle: Bundle, names: Collection[str]) -> Bundle:
    missing = sorted(set(names) - bundle.by_name().keys())
    if missing:
        raise BundleError(f"{bundle.path} holds no case {', '.join(map(repr, missing))}")
    if not names:
        return bundle
    return replace(bundle, cases=tuple(c for c in bundle.cases if c.name in names))


def _check_comparable(baseline: Bundle, candidate: Bundle) -> None:
    base, cand = baseline.by_name(), candidate.by_name()
    missing, extra = sorted(base.keys() - cand.keys()), sorted(cand.keys() - base.keys())
    if missing or extra:
        raise BundleError(
            f"bundles hold different cases (missing in candidate: {missing}, "
            f"only in candidate: {extra})"
        )
    if baseline.token_key_kind != candidate.token_key_kind:
        raise BundleError(
            f"bundles key tokens differently (baseline: {baseline.token_key_kind}, "
            f"candidate: {candidate.token_key_kind}); capture both with the same --token-keys"
        )
    for name in sorted(base):
        for key in COMPARABLE_REQUEST_FIELDS:
            if base[name].request.get(key) != cand[name].request.get(key):
                raise BundleError(
                    f"case {name!r} asks a different question in the candidate "
                    f"(request.{key} differs: {base[name].file} vs {cand[name].file})"
                )


def _teacher_of(record: CaseRecord, role: str) -> TeacherScores:
    if record.teacher is None:
        raise BundleError(
            f"{role} has no teacher-forced scores for {record.name!r} "
            f"(expected teacher_*.json beside {record.file.name}; capture with --teacher-forced)"
        )
    return record.teacher


def _with_teacher(case: CaseResult, base: CaseRecord, cand: CaseRecord) -> CaseResult:
    base_scores, cand_scores = _teacher_of(base, "baseline"), _teacher_of(cand, "candidate")
    if base_scores.sequence != cand_scores.sequence:
        raise BundleError(
            f"case {base.name!r}: the candidate scored another token sequence than the baseline "
            "(capture the candidate with --teacher-forced --reference BASELINE_DIR)"
        )
    return compare_teacher_forced(base_scores, cand_scores).onto(case)


def _case_report(
    base: CaseRecord,
    cand: CaseRecord,
    gates: ParityGates,
    top_n: int,
    low_margin: float,
    teacher_forced: bool,
    decode: Callable[[Sequence[int]], str] | None,
) -> CaseResult:
    case = compare_completions(
        base.name, base.completion, cand.completion, top_n=top_n, low_margin=low_margin
    )
    if teacher_forced:
        case = _with_teacher(case, base, cand)
    failures = evaluate_gates(case, gates)
    case = msgspec.structs.replace(case, gate_failures=tuple(failures), passed=not failures)
    if decode is not None and case.first_token_mismatch is not None:
        text = first_divergence_text(
            base.completion, cand.completion, case.first_token_mismatch.step, decode
        )
        case = msgspec.structs.replace(case, first_token_mismatch_text=text)
    return case


def spec_counts(bundle: Bundle) -> dict[str, SpecCase]:
    """bundle.json's spec_decode: suite case -> vLLM's counts of its generation."""
    raw = bundle.meta.get("spec_decode") or {}
    return decode(
        raw,
        dict[str, SpecCase],
        where=f"{bundle.path}/bundle.json:spec_decode",
        error=BundleError,
        hint="written by capture from vLLM's /metrics; capture the bundle again",
    )


def _with_spec_gate(
    compared: dict[str, CaseResult], baseline: Bundle, candidate: Bundle, bound: float | None
) -> dict[str, CaseResult]:
    """``compared`` with each suite case's accepted-token delta gated, where every record
    of the case (a batch's members) has the baseline's tokens: after a fork the drafts
    see other text. A compared case without counts on either side fails the gate."""
    if bound is None:
        return compared
    base, cand = spec_counts(baseline), spec_counts(candidate)
    out = dict(compared)
    counted = {name for entry in base.values() for name in entry.records}
    for name in compared:
        if name not in counted:
            out[name] = _failed(
                out[name], f"no speculative-decoding counts, so {SPEC_GATE} is not met"
            )
    for case, entry in base.items():
        names = [n for n in entry.records if n in compared]
        if not names or any(compared[n].first_token_mismatch is not None for n in names):
            continue
        if case not in cand:
            failure = f"the candidate has no speculative-decoding counts for {case}"
        else:
            delta = abs(cand[case].counts.accepted - entry.counts.accepted)
            if delta <= bound:
                continue
            failure = (
                f"accepted draft tokens {cand[case].counts.accepted} vs "
                f"{entry.counts.accepted} (|delta| {delta} > {SPEC_GATE} {bound:g})"
            )
        for name in names:
            out[name] = _failed(out[name], failure)
    return out


def _failed(result: CaseResult, failure: str) -> CaseResult:
    return msgspec.structs.replace(
        result, gate_failures=(*result.gate_failures, failure), passed=False
    )


def _side(bundle: Bundle) -> ReportSide:
    fingerprints = sorted({c.system_fingerprint for c in bundle.cases if c.system_fingerprint})
    return ReportSide(
        path=str(bundle.path), meta=bundle.meta, system_fingerprints=tuple(fingerprints)
    )


def compare_bundles(
    baseline_dir: Path,
    candidate_dir: Path,
    gates: ParityGates | None = None,
    *,
    top_n: int = 20,
    low_margin: float = 0.5,
    teacher_forced: bool = False,
    boundaries: Sequence[int] = (),
    decode: Callable[[Sequence[int]], str] | None = None,
    cases: Collection[str] = (),
) -> ParityReport:
    """The full comparison report (see ``ParityReport``). ``boundaries`` (page and shard
    lengths in tokens) let the diagnosis name a layout failure; ``decode`` (ids -> text,
    the served model's tokenizer) adds each first fork as text. ``cases`` (none: all)
    compares only those cases of the baseline."""
    gates = gates or ParityGates()
    baseline, candidate = load_bundle(Path(baseline_dir)), load_bundle(Path(candidate_dir))
    baseline = _only(baseline, cases)
    _check_comparable(baseline, candidate)
    cand = candidate.by_name()
    compared = {
        b.name: _case_report(b, cand[b.name], gates, top_n, low_margin, teacher_forced, decode)
        for b in sorted(baseline.cases, key=lambda c: c.name)
    }
    compared = _with_spec_gate(compared, baseline, candidate, gates.max_spec_accepted_delta)
    return ParityReport(
        cases=compared,
        diagnosis=diagnose(case_views(compared), boundaries),
        passed=all(case.passed for case in compared.values()),
        gates=gates.table(),
        settings=ReportSettings(top_n=top_n, low_margin=low_margin, teacher_forced=teacher_forced),
        baseline=_side(baseline),
        candidate=_side(candidate),
    )
