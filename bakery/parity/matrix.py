"""The parity matrix: boot each profile with the launcher, capture, stop, compare to DCP1.

A matrix file (``launcher/dcp2/matrix*.toml``) names a baseline entry (DCP1)
and candidate entries. An entry is a profile plus the same overrides the
``start`` flags take. Every entry is preflighted before the first server boots.
Then each entry, in turn, is started through ``lifecycle.start``, captured with
``bakery.verify.capture_bundle``, and stopped. Each candidate is compared with
``bakery.verify.compare_bundles``. A baseline bundle given with ``--baseline``
is reused instead of booting the baseline. The run writes one folder,
``artifacts/dcp2/matrix/<UTC timestamp>/``: bundles/, reports/ (JSON + Markdown
per candidate), and summary.json + summary.md. Boundary: the capture, the
metrics and the gates are the parity harness's (``bakery.verify``); this
module only sequences servers.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from bakery import project
from bakery.bake.bake import tree_dir
from bakery.bake.manifest import MANIFEST
from bakery.clock import FOLDER, utc_stamp
from bakery.errors import BakeryError
from bakery.launch import lifecycle, preflight
from bakery.launch.errors import PreflightError, Problem, ProfileError
from bakery.launch.gates import GateTable
from bakery.launch.plan import LaunchPlan, make_plan
from bakery.launch.profiles import Port, TimeoutS, load_profile, override
from bakery.parity import serving
from bakery.parity.serving import Bench
from bakery.parity.summary import (
    BaselineRow,
    CandidateRow,
    FirstDivergence,
    MatrixSummary,
    summary_markdown,
    write_plots,
)
from bakery.schema import Document, decode, read_toml, refuse, write_json_atomic
from bakery.series.series import Series
from bakery.tree import own_path, write_text_atomic
from bakery.verify import (
    CaptureSettings,
    ParityGates,
    ServerInfo,
    capture_bundle,
    compare_bundles,
    load_gates,
    load_suite,
    write_reports,
)
from bakery.verify.bundle import load_bundle, record_name
from bakery.verify.compare import ParityReport, spec_counts
from bakery.verify.diagnose import tokenizer_decoder
from bakery.verify.errors import ParityFailure
from bakery.verify.result import ForkText
from bakery.verify.spec_decode import SpecCounts

__all__ = [
    "Entry",
    "Matrix",
    "Context",
    "load_matrix",
    "matrix_from_data",
    "run_matrix",
    "summary_markdown",
]


# A matrix file's schema, the one place that knows its shape (bakery.schema decodes it).
class FlagsDoc(Document, frozen=True):
    """The ``start`` flags an entry may override (None: the profile's value)."""

    model: str | None = None
    tp: int | None = None
    pp: int | None = None
    dcp: int | None = None
    stage: int | None = None
    combine: str | None = None
    prefill_gather: bool | None = None
    timing: bool | None = None
    host: str | None = None
    port: Port | None = None
    base: str | None = None
    startup_timeout_s: TimeoutS | None = None  # as in a profile
    vllm_args: tuple[str, ...] | None = None


class Entry(Document, frozen=True):
    """One matrix entry: a profile and the ``start`` flags put over it."""

    profile: str
    given_name: str | None = msgspec.field(default=None, name="name")  # see ``name``
    overrides: FlagsDoc = msgspec.field(default_factory=FlagsDoc, name="flags")
    # "fail": a planted bug the gates must catch (the matrix fails if it passes)
    expect: Literal["pass", "fail"] = "pass"

    @property
    def name(self) -> str:
        """The entry's name: the profile's when the file gives none."""
        return self.profile if self.given_name is None else self.given_name

    @property
    def flags(self) -> tuple[tuple[str, Any], ...]:
        """The flags the entry sets (None: the profile's value), sorted by name."""
        flags = msgspec.structs.asdict(self.overrides)
        return tuple(sorted((k, v) for k, v in flags.items() if v is not None))


class MatrixDoc(Document, frozen=True):
    baseline: Entry
    candidates: tuple[Entry, ...]
    description: str = ""
    suite: str = "dcp2"
    low_margin: Annotated[
        float, Meta(ge=0, le=sys.float_info.max, description="a finite number >= 0")
    ] = 0.5
    top_n: Annotated[int, Meta(ge=1, le=1000, description="1..1000")] = 20
    concurrency: Annotated[int, Meta(ge=1, le=256, description="1..256")] = 4
    # The bound on one request: a server stuck in a collective fails its entry then, and
    # the matrix stops it and goes on (capture's own default: 600 s).
    request_timeout_s: Annotated[int, Meta(ge=1, le=86400, description="1..86400")] = 600
    # Each candidate also scores the baseline's prompt + completion (prompt_logprobs), so a
    # fork in the trajectory cannot hide what the candidate does with the same text.
    teacher_forced: bool = False
    gates: dict[str, bool | int | float] = {}  # checked by the parity harness's ParityGates
    bench: Bench | None = None


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_HINT = f"see {project.MATRIX} for the expected fields and types"


@dataclass(frozen=True)
class Matrix:
    """A matrix file, decoded and checked: its document, and where it was read."""

    source: Path
    doc: MatrixDoc


@dataclass(frozen=True)
class Context:
    """Where things are and which Python serves; the same for every entry."""

    python: Path
    build: Path
    root: Path
    profiles: Path
    artifacts: Path
    series: Series
    table: GateTable
    grace_s: float = 30.0
    model: str | None = None  # `run.sh matrix --model`: every entry serves this model


def load_matrix(path: Path) -> Matrix:
    where = str(path)
    if not Path(path).exists():
        raise ProfileError(f"no matrix file (missing file): {where!r}")
    return matrix_from_data(read_toml(Path(path), ProfileError), Path(path))


def matrix_from_data(data: object, path: Path) -> Matrix:
    """A parsed matrix file (as read from ``path``) as a ``Matrix``, or one ProfileError."""
    where = str(path)
    doc = decode(data, MatrixDoc, where=where, error=ProfileError, hint=_HINT)
    candidates = doc.candidates
    names = [e.name for e in candidates]
    # A name may come from the profile (no name given), so the rule is checked here.
    problems = [
        f"$.{at}.name: {name!r} is not a plain name (letters, digits, ., _, -; it names "
        "files under the run folder)"
        for at, name in [("baseline", doc.baseline.name)]
        + [(f"candidates[{i}]", n) for i, n in enumerate(names)]
        if not _NAME.fullmatch(name)
    ]
    if doc.baseline.expect != "pass":
        problems.append("$.baseline.expect: the baseline is the reference; it cannot fail")
    refuse(problems, where=where, error=ProfileError, hint=_HINT)
    if not candidates or len(set(names)) != len(names):
        raise ProfileError(
            f"{where}: needs one or more candidates with distinct names: {names}", hint=_HINT
        )
    return Matrix(Path(path), doc)


def _plan(entry: Entry, ctx: Context) -> LaunchPlan:
    flags = dict(entry.flags) | ({"model": ctx.model} if ctx.model else {})
    profile = override(load_profile(entry.profile, ctx.profiles, ctx.table), **flags)
    return make_plan(
        profile,
        python=ctx.python,
        tree=tree_dir(ctx.build, profile.base),
        root=ctx.root,
        artifacts=ctx.artifacts,
    )


def _preflight_all(entries: list[Entry], ctx: Context, say) -> dict[str, tuple[LaunchPlan, Any]]:
    """Every entry checked before any server boots; all problems in one refusal."""
    checked, problems = {}, []
    for entry in entries:
        plan = _plan(entry, ctx)
        report = preflight.run_preflight(plan, ctx.table, ctx.series, ctx.build)
        for note in report.notes:
            say(f"note: {entry.name}: {note}")
        problems += [
            Problem(f"{entry.name}: {p.what}", p.why, p.value, p.hint) for p in report.problems
        ]
        checked[entry.name] = (plan, report)
    if problems:
        raise PreflightError(tuple(problems))
    return checked


def _gates(matrix: Matrix, gates_file: Path | None) -> ParityGates:
    base = load_gates(gates_file) if gates_file else ParityGates()
    values = dict(matrix.doc.gates)
    return base.with_values(f"matrix {matrix.source.name}", **values) if values else base


def _serve_and_capture(
    entry: Entry,
    checked,
    out: Path,
    suite,
    settings,
    ctx: Context,
    say,
    bench=None,
    teacher_forced: bool = False,
    reference: Path | None = None,
) -> dict:
    plan, report = checked
    benched: serving.BenchFigures | None = None  # no [bench], or it did not run
    record, boot_s = lifecycle.start(
        plan, report.facts, ["matrix", entry.name], grace_s=ctx.grace_s, say=say
    )
    say(f"{entry.name}: ready after {boot_s:.1f} s; capturing")
    try:
        with lifecycle.torn_down_on_signals(record.log):  # TERM and HUP stop it as INT does
            server = ServerInfo(
                command=shlex.join(plan.command),
                env=dict(plan.env),
                baked_json=plan.tree / MANIFEST,
            )
            capture_bundle(
                plan.url, out, suite, settings=settings, server=server,
                teacher_forced=teacher_forced, reference=reference,
            )  # fmt: skip
            if bench is not None:  # after the capture: its requests must not warm the server
                say(f"{entry.name}: vllm bench serve")
                benched = serving.bench_serve(bench, plan, record.run_dir / "bench")
    finally:
        lifecycle.stop_record(record, ctx.grace_s)
    serving.write_figures(out, serving.served_figures(serving.kv_capacity(record.log), benched))
    run: dict[str, Any] = {"boot_s": round(boot_s, 1), "record": str(record.run_dir)}
    exercised = serving.exercised_counts(record.run_dir)
    if exercised is not None:
        run["exercised"] = exercised
    drafted = spec_counts(load_bundle(out))
    if drafted:
        run["spec_decode"] = SpecCounts.total(c.counts for c in drafted.values())
    return run


def _first_divergence(report: ParityReport) -> FirstDivergence | None:
    for name, case in sorted(report.cases.items()):
        if not case.passed:
            text = case.first_token_mismatch_text
            return FirstDivergence(
                case=name,
                first_token_mismatch=case.first_token_mismatch,
                text=text if isinstance(text, ForkText) else None,
                gate_failures=case.gate_failures,
            )
    return None


def _candidate_row(
    entry: Entry,
    checked,
    bundle: Path,
    baseline_dir: Path,
    out: Path,
    matrix: Matrix,
    suite,
    settings,
    gates: ParityGates,
    ctx: Context,
    say,
    cases: tuple[str, ...] = (),
) -> CandidateRow:
    """Serve and capture one candidate, compare it with the baseline, write its reports."""
    plan = checked[0]
    run = _serve_and_capture(
        entry, checked, bundle, suite, settings, ctx, say, matrix.doc.bench,
        matrix.doc.teacher_forced, baseline_dir if matrix.doc.teacher_forced else None,
    )  # fmt: skip
    boundaries = serving.layout_boundaries(plan)
    report = compare_bundles(
        baseline_dir, bundle, gates, top_n=matrix.doc.top_n, low_margin=matrix.doc.low_margin,
        teacher_forced=matrix.doc.teacher_forced, boundaries=boundaries,
        decode=tokenizer_decoder(serving.model_folder(plan)),
        cases=[record_name(m) for case in suite.cases if case.case in cases for m in case.members],
    )  # fmt: skip
    json_path, md_path = (
        own_path(out / "reports", f"{entry.name}.json", "a matrix name"),
        own_path(out / "reports", f"{entry.name}.md", "a matrix name"),
    )
    json_path.parent.mkdir(parents=True, exist_ok=True)
    write_reports(report, json_path=json_path, markdown_path=md_path)
    # The ranks' sliding-window KV must be one copy (replicated under DCP): a rank that
    # wrote other rows fails the entry whatever its tokens (a draft's KV moves no token).
    exercised = run.get("exercised")
    replicated = exercised is None or exercised.swa_kv_replicated is not False
    passed = report.passed and replicated
    return CandidateRow(
        **_entry_fields(entry),
        passed=passed,
        as_expected=passed == (entry.expect == "pass"),
        failing_cases=report.failing(),
        first_divergence=_first_divergence(report),
        diagnosis=report.diagnosis,
        layout_boundaries=boundaries,
        report_json=str(json_path),
        report_markdown=str(md_path),
        **run,
    )


def _entry_fields(entry: Entry) -> dict[str, Any]:
    return {
        "name": entry.name,
        "profile": entry.profile,
        "flags": dict(entry.flags),
        "expect": entry.expect,
    }


def _errored_row(entry: Entry, exc: BakeryError) -> CandidateRow:
    """A candidate that could not be compared: never a pass, never "as expected" (a
    planted bug that stops the server is not caught by parity)."""
    return CandidateRow(
        **_entry_fields(entry),
        passed=False,
        as_expected=False,
        error=str(exc),
        failing_cases=[],
        first_divergence=None,
        diagnosis=None,
        layout_boundaries=[],
        report_json=None,
        report_markdown=None,
    )


def run_matrix(
    matrix: Matrix,
    ctx: Context,
    *,
    out: Path | None = None,
    baseline_dir: Path | None = None,
    gates_file: Path | None = None,
    cases: tuple[str, ...] = (),
    say=print,
) -> MatrixSummary:
    """Preflight all, then boot/capture/stop each entry, compare, write the summary.
    ``cases`` (none: all) runs only those cases of the suite."""
    suite = load_suite(matrix.doc.suite).only(cases)
    gates = _gates(matrix, gates_file)
    out = out or ctx.artifacts / "matrix" / utc_stamp(FOLDER)
    entries = ([] if baseline_dir else [matrix.doc.baseline]) + list(matrix.doc.candidates)
    checked = _preflight_all(entries, ctx, say)
    settings = CaptureSettings(
        concurrency=matrix.doc.concurrency, timeout_s=float(matrix.doc.request_timeout_s)
    )
    runs: dict[str, dict] = {}
    base = matrix.doc.baseline
    if baseline_dir is None:
        baseline_dir = own_path(out / "bundles", base.name, "a matrix name")
        runs[base.name] = _serve_and_capture(
            base, checked[base.name], baseline_dir, suite, settings, ctx, say, matrix.doc.bench,
            matrix.doc.teacher_forced,
        )  # fmt: skip
    rows: list[CandidateRow] = []
    candidate_figures: dict[str, serving.FiguresDoc] = {}
    for entry in matrix.doc.candidates:
        bundle = own_path(out / "bundles", entry.name, "a matrix name")
        try:
            row = _candidate_row(
                entry, checked[entry.name], bundle, baseline_dir, out, matrix, suite, settings,
                gates, ctx, say, cases,
            )  # fmt: skip
        except BakeryError as exc:  # one entry's boot, capture or compare: the rest still run
            say(f"{entry.name}: ERROR {exc}")
            rows.append(_errored_row(entry, exc))
            continue
        candidate_figures[entry.name] = serving.read_figures(bundle)
        rows.append(row)
        say(f"{entry.name}: {'pass' if row.passed else 'FAIL'} (expected {entry.expect})")
    # A reused baseline bundle keeps the figures of the run that captured it.
    figures = {matrix.doc.baseline.name: serving.read_figures(baseline_dir)} | candidate_figures
    summary = MatrixSummary(
        matrix=str(matrix.source),
        suite=matrix.doc.suite,
        gates=gates.table(),
        low_margin=matrix.doc.low_margin,
        top_n=matrix.doc.top_n,
        baseline=BaselineRow(
            name=matrix.doc.baseline.name,
            bundle=str(baseline_dir),
            reused=matrix.doc.baseline.name not in runs,
            **runs.get(matrix.doc.baseline.name, {}),
        ),
        candidates=rows,
        serving=serving.with_ratios(figures, matrix.doc.baseline.name),
        passed=all(r.as_expected for r in rows),
        cases=list(cases) if cases else msgspec.UNSET,
    )
    plotted = write_plots(summary, out, say)
    summary = msgspec.structs.replace(summary, plots=plotted)
    # A killed run leaves the old summary or the new one, never half of one.
    write_json_atomic(out / "summary.json", summary, default=str, ascii_only=True)
    write_text_atomic(out / "summary.md", summary_markdown(summary))
    missed = [r.name for r in rows if r.expect == "fail" and r.passed]
    if missed:
        raise ParityFailure(
            f"planted-bug candidate(s) passed parity: {missed} (expected to fail)",
            hint=f"the gates cannot see the planted bug; see {out / 'summary.md'}",
        )
    return summary
