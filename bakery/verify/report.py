"""Render a comparison report as JSON and as Markdown, and write both atomically.

The JSON is the ``ParityReport`` itself (sorted keys, so reruns diff cleanly); the
Markdown is for a person: a gate table, a summary row per case, then per case its
metrics and the first divergence with both sides' top-5 lists. Rendering is pure;
only ``write_reports`` touches the disk.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bakery import markdown
from bakery.schema import write_json_atomic
from bakery.tree import write_text_atomic
from bakery.verify.result import CaseResult, Diagnosis, ForkText, GateSetting, ParityReport

__all__ = ["render_markdown", "write_reports", "format_value", "code"]

CASE_METRICS = (  # CaseResult fields, in the order the table shows them
    "tokens_match",
    "prompt_token_ids_match",
    "matching_prefix_tokens",
    "oracle_token_count",
    "actual_token_count",
    "top1_match_rate",
    "topk_overlap_mean",
    "topk_overlap_min",
    "trajectory_stop_step",
    "trajectory_top1_match_rate",
    "trajectory_topk_overlap_mean",
    "max_common_logprob_abs_error",
    "mean_common_logprob_abs_error",
    "max_chosen_token_logprob_abs_error",
    "mean_chosen_token_logprob_abs_error",
    "tf_max_abs_logprob_delta",
    "tf_mean_abs_logprob_delta",
    "tf_max_kl",
    "tf_max_kl_position",
    "tf_mean_kl",
    "tf_completion_max_kl",
    "tf_completion_mean_kl",
)


def format_value(value: Any) -> str:
    """Readable cell text: ``–`` for None (not computed), 6 significant digits for floats."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def code(token: Any) -> str:
    """A token as inline code, JSON-quoted so whitespace and newlines stay visible
    (a table cell's ``|`` is escaped by ``markdown.table``)."""
    if token is None:
        return "–"
    return f"`` {json.dumps(token, ensure_ascii=False)} ``"


def _gates_section(gates: Mapping[str, GateSetting]) -> list[str]:
    rows = [
        (name, format_value(g.value) if g.value is not None else "off", g.source)
        for name, g in sorted(gates.items())
    ]
    return ["## Gates", "", markdown.table(("gate", "value", "source"), rows), ""]


def _mismatch_cell(case: CaseResult) -> str:
    fork = case.first_token_mismatch
    if fork is None:
        return "–"
    return f"{fork.step}: {code(fork.oracle)} vs {code(fork.actual)}"


def _summary_section(cases: Mapping[str, CaseResult]) -> list[str]:
    header = (
        "case",
        "result",
        "tokens_match",
        "matching_prefix",
        "first mismatch",
        "low_margin",
        "top1_match_rate",
        "topk_overlap_mean",
        "max_chosen_token_logprob_abs_error",
    )
    rows = [
        (
            name,
            "pass" if c.passed else "**FAIL**",
            format_value(c.tokens_match),
            format_value(c.matching_prefix_tokens),
            _mismatch_cell(c),
            format_value(c.first_token_mismatch_low_margin),
            format_value(c.top1_match_rate),
            format_value(c.topk_overlap_mean),
            format_value(c.max_chosen_token_logprob_abs_error),
        )
        for name, c in sorted(cases.items())
    ]
    return ["## Summary", "", markdown.table(header, rows), ""]


def _divergence_section(case: CaseResult) -> list[str]:
    fork = case.first_token_mismatch
    if fork is None:
        return ["No divergence: every generated token matches.", ""]
    low = "low-margin" if case.first_token_mismatch_low_margin else "HIGH-margin"
    intro = (
        f"### First divergence at step {fork.step} ({low})",
        "",
        f"- baseline chose {code(fork.oracle)}, top-1 margin "
        f"{format_value(case.first_token_mismatch_oracle_top1_margin)}, its rank in the "
        f"candidate's top-k: {format_value(case.first_token_mismatch_actual_oracle_rank)}",
        f"- candidate chose {code(fork.actual)}, top-1 margin "
        f"{format_value(case.first_token_mismatch_actual_top1_margin)}, its rank in the "
        f"baseline's top-k: {format_value(case.first_token_mismatch_oracle_actual_rank)}",
        "",
    )
    text = case.first_token_mismatch_text
    said = []
    if isinstance(text, ForkText):
        said = [
            f"- as text (the served model's tokenizer): …{code(text.context)}",
            f"  - the baseline continues {code(text.baseline)}",
            f"  - the candidate continues {code(text.candidate)}",
            "",
        ]
    return [*intro, *said, _top5_table(case), ""]


def _diagnosis_section(diagnosis: Diagnosis) -> list[str]:
    return ["## Diagnosis", "", f"- {diagnosis.line}", f"- next: {diagnosis.next_step}", ""]


def _top5_table(case: CaseResult) -> str:
    base = case.first_token_mismatch_oracle_top5 or ()
    cand = case.first_token_mismatch_actual_top5 or ()
    rows = []
    for rank in range(max(len(base), len(cand))):
        b = base[rank] if rank < len(base) else (None, None)
        c = cand[rank] if rank < len(cand) else (None, None)
        rows.append((str(rank + 1), code(b[0]), format_value(b[1]), code(c[0]), format_value(c[1])))
    header = ("rank", "baseline token", "baseline logprob", "candidate token", "candidate logprob")
    return markdown.table(header, rows)


def _case_section(name: str, case: CaseResult) -> list[str]:
    verdict = "passed" if case.passed else "FAILED"
    lines = [f"## {name}: {verdict}", ""]
    lines.extend(f"- gate failed: {failure}" for failure in case.gate_failures)
    if case.gate_failures:
        lines.append("")
    rows = [(key, format_value(case.value(key))) for key in CASE_METRICS if case.has(key)]
    lines.extend([markdown.table(("metric", "value"), rows), ""])
    return lines + _divergence_section(case)


def render_markdown(report: ParityReport) -> str:
    settings = report.settings
    verdict = "PASSED" if report.passed else "FAILED"
    lines = [
        f"# Parity report: {verdict}",
        "",
        f"- baseline: `{report.baseline.path}`",
        f"- candidate: `{report.candidate.path}`",
        f"- top-n {settings.top_n}, low-margin threshold {settings.low_margin}, "
        f"teacher-forced {format_value(settings.teacher_forced)}",
        "",
        *_diagnosis_section(report.diagnosis),
        *_gates_section(report.gates),
        *_summary_section(report.cases),
    ]
    for name, case in sorted(report.cases.items()):
        lines.extend(_case_section(name, case))
    return "\n".join(lines).rstrip() + "\n"


def write_reports(
    report: ParityReport, *, json_path: Path | None, markdown_path: Path | None
) -> None:
    """Write the requested reports; each file appears whole or not at all."""
    if json_path is not None:
        write_json_atomic(json_path, report, sort_keys=True, strict=True)
    if markdown_path is not None:
        write_text_atomic(markdown_path, render_markdown(report))
