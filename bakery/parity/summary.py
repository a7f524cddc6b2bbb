"""The matrix's summary: its types (summary.json), and for a person summary.md (parity,
serving figures, diagnosis, the plots linked) and the PNG plots beside it (drawn by
``bakery.parity.plots``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from bakery import markdown
from bakery.launch.errors import LaunchError
from bakery.parity import plots
from bakery.parity.serving import Exercised, Ratios, ServingRow
from bakery.schema import decode, read_json
from bakery.verify.compare import ParityReport
from bakery.verify.diagnose import case_views
from bakery.verify.report import format_value
from bakery.verify.result import Diagnosis, Fork, ForkText, GateSetting
from bakery.verify.spec_decode import SpecCounts

__all__ = [
    "FirstDivergence",
    "CandidateRow",
    "BaselineRow",
    "MatrixSummary",
    "summary_markdown",
    "write_plots",
    "KV_PLOT",
    "BENCH_PLOT",
]

KV_PLOT = "kv_tokens.png"
BENCH_PLOT = "bench.png"


class FirstDivergence(msgspec.Struct, frozen=True, kw_only=True):
    """A candidate's first failing case (by name): its fork (None: the tokens match, a
    bound failed), the fork as text when compare decoded it, and the gates it failed."""

    case: str
    first_token_mismatch: Fork | None
    text: ForkText | None
    gate_failures: tuple[str, ...]


class CandidateRow(msgspec.Struct, frozen=True, kw_only=True):
    """One candidate of summary.json: compared (its report named; ``boot_s``, ``record``
    and ``exercised`` from its run), or stopped by ``error`` before any comparison. The
    fields in the order summary.json has them; an UNSET one is not written."""

    name: str
    profile: str
    flags: dict[str, Any]
    expect: str
    passed: bool
    as_expected: bool
    error: str | msgspec.UnsetType = msgspec.UNSET
    failing_cases: list[str]
    first_divergence: FirstDivergence | None
    diagnosis: Diagnosis | None
    layout_boundaries: list[int]
    report_json: str | None
    report_markdown: str | None
    boot_s: float | msgspec.UnsetType = msgspec.UNSET
    record: str | msgspec.UnsetType = msgspec.UNSET
    exercised: Exercised | msgspec.UnsetType = msgspec.UNSET
    # vLLM's speculative-decoding counts over the suite (a server with drafts)
    spec_decode: SpecCounts | msgspec.UnsetType = msgspec.UNSET


class BaselineRow(msgspec.Struct, frozen=True, kw_only=True):
    """The baseline of summary.json; a reused bundle has no run of its own."""

    name: str
    bundle: str
    reused: bool
    boot_s: float | msgspec.UnsetType = msgspec.UNSET
    record: str | msgspec.UnsetType = msgspec.UNSET
    exercised: Exercised | msgspec.UnsetType = msgspec.UNSET
    # vLLM's speculative-decoding counts over the suite (a server with drafts)
    spec_decode: SpecCounts | msgspec.UnsetType = msgspec.UNSET


class MatrixSummary(msgspec.Struct, frozen=True, kw_only=True):
    """summary.json. ``serving``: each entry's figures and ratios; ``plots`` is set once
    they are drawn."""

    matrix: str
    suite: str
    gates: dict[str, GateSetting]
    low_margin: float
    top_n: int
    baseline: BaselineRow
    candidates: list[CandidateRow]
    serving: dict[str, ServingRow]
    passed: bool
    plots: list[str] | msgspec.UnsetType = msgspec.UNSET
    cases: list[str] | msgspec.UnsetType = msgspec.UNSET  # `--case`: only these ran


def _order(summary: MatrixSummary) -> list[str]:
    return [summary.baseline.name, *(r.name for r in summary.candidates)]


def write_plots(summary: MatrixSummary, out: Path, say=print) -> list[str]:
    """Draw the plots beside summary.md; their file names (relative to ``out``)."""
    if not plots.available():
        say("note: matplotlib is not installed (the `plots` extra): no plots drawn")
        return []
    names, figures = _order(summary), summary.serving
    written = []
    served = [figures.get(n) for n in names]
    tokens = [_value(r.kv_cache_tokens) if r else None for r in served]
    if any(t is not None for t in tokens):
        plots.kv_plot(names, tokens, names[0], out / KV_PLOT)
        written.append(KV_PLOT)
    benched = [_value(r.bench) if r else None for r in served]
    if any(benched):
        plots.bench_plot(names, benched, out / BENCH_PLOT)
        written.append(BENCH_PLOT)
    for row in summary.candidates:
        if isinstance(row.error, str) or row.report_json is None:  # nothing was compared
            continue
        report = decode(
            read_json(Path(row.report_json), "parity report", LaunchError),
            ParityReport,
            where=row.report_json,
            error=LaunchError,
            hint="written by this matrix run; run the matrix again",
        )
        rows = [
            plots.HeatRow(v.case, v.prompt_tokens, v.deltas, v.fork_step)
            for v in case_views(report.cases)
        ]
        name = f"parity-{row.name}.png"
        title = f"{row.name} vs {names[0]}: {report.diagnosis.pattern}"
        bounds = _bounds(row, report.diagnosis.boundary)
        plots.parity_heatmap(rows, out / name, title=title, boundaries=bounds)
        written.append(name)
    return written


def _bounds(row: CandidateRow, found: int | None) -> list[int]:
    return [found] if found else list(row.layout_boundaries)


def _divergence_text(row: CandidateRow) -> str:
    first = row.first_divergence
    if first is None:
        return "–"
    fork, text = first.first_token_mismatch, first.text
    if fork is not None:
        said = (
            f": …`{text.context!r}` → `{text.baseline!r}` vs `{text.candidate!r}`"
            if text
            else f": `{fork.oracle!r}` vs `{fork.actual!r}`"
        )
        return f"{first.case} step {fork.step}{said}"
    return f"{first.case}: {'; '.join(first.gate_failures)}"


def _value(field: Any) -> Any:
    """An UNSET field as None (as a dict's ``get`` read a missing key)."""
    return None if field is msgspec.UNSET else field


def _exercised_text(counts: Exercised | None) -> str:
    if not counts:
        return "–"
    return (
        f"{counts.indexer_calls} / {counts.candidate_masked_positions} / "
        f"{counts.index_k_publishes} / {counts.index_k_keyless_gathers} / "
        f"{counts.multi_request_steps}"
    )


def _drafts_text(counts: SpecCounts | None) -> str:
    if not counts:
        return "–"
    rate = counts.acceptance
    share = "" if rate is None else f" ({rate:.0%})"
    return f"{counts.accepted} / {counts.draft_tokens}{share}"


def _result(row: CandidateRow) -> str:
    if isinstance(row.error, str):
        return f"ERROR: {row.error}"
    verdict = "pass" if row.passed else "FAIL"
    counts = _value(row.exercised)
    if counts is not None and counts.swa_kv_replicated is False:
        verdict += " (the ranks wrote different sliding-window KV)"
    if row.expect == "fail":
        return f"{verdict} (planted bug: {'caught' if not row.passed else 'MISSED'})"
    return verdict


def _serving_section(summary: MatrixSummary) -> list[str]:
    figures = summary.serving
    header = (
        "entry", "KV tokens", "×", "max concurrency", "×", "TTFT p50 / p99 ms",
        "ITL p50 / p99 ms", "output tok/s", "×",
    )  # fmt: skip
    rows = []
    for name in _order(summary):
        f = figures.get(name)
        ratio = f.vs_baseline if f else Ratios()
        bench = _value(f.bench) if f else None

        def pair(p50: float | None, p99: float | None) -> str:
            return "–" if p50 is None else f"{p50:.1f} / {p99:.1f}"

        rows.append((
            name,
            format_value(_value(f.kv_cache_tokens) if f else None),
            format_value(_value(ratio.kv_cache_tokens)),
            format_value(_value(f.max_concurrency) if f else None),
            format_value(_value(ratio.max_concurrency)),
            pair(bench.ttft_ms_p50, bench.ttft_ms_p99) if bench else "–",
            pair(bench.itl_ms_p50, bench.itl_ms_p99) if bench else "–",
            format_value(bench.output_tok_s if bench else None),
            format_value(_value(ratio.output_tok_s)),
        ))  # fmt: skip
    lengths = (f.max_model_len for f in figures.values())
    length = next((n for n in lengths if not isinstance(n, msgspec.UnsetType)), None)
    return [
        "## Serving",
        "",
        f"KV tokens and max concurrency (at max_model_len {format_value(length)}) are vLLM's "
        "own startup figures; × is the ratio to the baseline.",
        "",
        markdown.table(header, rows),
        "",
    ]


def _plots_section(summary: MatrixSummary) -> list[str]:
    names = summary.plots if isinstance(summary.plots, list) else []
    if not names:
        return []
    lines = ["## Plots", ""]
    for name in names:
        lines += [f"![{name}]({name})", ""]
    lines.append(
        "A parity heatmap has one row per case, shortest prompt at the top (a dashed line "
        "where the prompts cross a page or shard boundary), one column per decode step; the "
        "colour is |Δ chosen logprob| against the baseline, the first divergence red, the "
        "steps after it grey."
    )
    return [*lines, ""]


def summary_markdown(summary: MatrixSummary) -> str:
    base = summary.baseline
    lines = [
        "# DCP parity matrix",
        "",
        f"- matrix: `{summary.matrix}`, suite `{summary.suite}`"
        + (f" (cases {', '.join(summary.cases)} only)" if summary.cases else "")
        + f", low margin {summary.low_margin}, top-n {summary.top_n}",
        f"- baseline `{base.name}`: `{base.bundle}`"
        + (" (reused)" if base.reused else f" (booted in {_value(base.boot_s)} s)")
        + (
            f", accepted / drafted tokens {_drafts_text(base.spec_decode)}"
            if isinstance(base.spec_decode, SpecCounts)
            else ""
        ),
        f"- result: **{'PASS' if summary.passed else 'FAIL'}**",
        "",
    ]
    header = (
        "candidate", "profile", "flags", "result", "failing cases", "first divergence",
        "indexer calls / masked positions / index-K publishes / keyless index-K gathers "
        "/ steps of 2+ requests", "accepted / drafted tokens", "report",
    )  # fmt: skip
    rows = [
        (
            row.name,
            row.profile,
            ", ".join(f"{k}={v}" for k, v in row.flags.items()) or "–",
            _result(row),
            len(row.failing_cases),
            _divergence_text(row),
            _exercised_text(_value(row.exercised)),
            _drafts_text(_value(row.spec_decode)),
            f"`{row.report_markdown}`" if row.report_markdown else "–",
        )
        for row in summary.candidates
    ]
    lines += [markdown.table(header, rows), "", "## Diagnosis", ""]
    for row in summary.candidates:
        diagnosis = row.diagnosis
        if diagnosis:
            lines.append(f"- `{row.name}`: {diagnosis.line}; next: {diagnosis.next_step}")
    lines.append("")
    lines += _serving_section(summary) + _plots_section(summary)
    return "\n".join(lines).rstrip() + "\n"
