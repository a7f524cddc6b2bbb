"""The ``bakery verify`` click group: capture, compare, calibrate.

Each command parses its options, makes one library call and prints a short
summary. Failures are ``BakeryError`` subclasses that the top-level ``bakery``
boundary turns into one ``error:`` line and an exit code (0 pass, 1 parity
failure, 2 usage error or unreadable input).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from bakery.errors import UsageError
from bakery.schema import encode_json
from bakery.verify.calibrate import CalibrationPolicy, calibrate_bundles, write_calibration
from bakery.verify.capture import CaptureSettings, ServerInfo, capture_bundle
from bakery.verify.compare import CaseResult, ParityGates, compare_bundles, load_gates
from bakery.verify.errors import ParityFailure
from bakery.verify.report import format_value, write_reports
from bakery.verify.suite import load_suite

__all__ = ["verify"]

PathType = click.Path(path_type=Path)


@click.group("verify")
def verify() -> None:
    """Check that a candidate server answers like a baseline server (parity harness)."""


def _comparison_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--top-n and --low-margin: how compare (and calibrate, through it) reads two bundles."""
    func = click.option(
        "--low-margin",
        type=click.FloatRange(min=0),
        default=0.5,
        show_default=True,
        help="A fork is low-margin when the smaller top-1 margin is <= this.",
    )(func)
    return click.option(
        "--top-n",
        type=click.IntRange(min=1),
        default=20,
        show_default=True,
        help="Top logprobs compared per step (the first N the server returned).",
    )(func)


def _capture_options(func: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option(
            "--suite",
            default="dcp2",
            show_default=True,
            help="Suite name under bakery/verify/suites/ or a .jsonl path.",
        ),
        click.option(
            "--concurrency",
            type=click.IntRange(min=1),
            default=4,
            show_default=True,
            help="Requests in flight at once.",
        ),
        click.option(
            "--timeout",
            "timeout_s",
            type=click.FloatRange(min=0, min_open=True),
            default=600.0,
            show_default=True,
            help="Per-request timeout in seconds.",
        ),
        click.option(
            "--retries",
            type=click.IntRange(min=0),
            default=3,
            show_default=True,
            help="Retries per request on connection errors.",
        ),
        click.option("--model", default=None, help="Model name (default: first of /v1/models)."),
        click.option(
            "--token-keys",
            type=click.Choice(["ids", "strings"]),
            default="ids",
            show_default=True,
            help="Key tokens by id (return_tokens_as_token_ids) or by string.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _settings(
    concurrency: int,
    timeout_s: float,
    retries: int,
    model: str | None,
    token_keys: str,
    repeat: int = 1,
) -> CaptureSettings:
    return CaptureSettings(
        concurrency=concurrency,
        timeout_s=timeout_s,
        retries=retries,
        model=model,
        token_ids=token_keys == "ids",
        repeat=repeat,
    )


@verify.command()
@click.option("--url", required=True, help="Base URL of the server, e.g. http://127.0.0.1:8000")
@click.option("--out", "out_dir", type=PathType, required=True, help="New bundle directory.")
@click.option(
    "--repeat",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Send each case N times and record how many distinct outputs came back.",
)
@click.option(
    "--teacher-forced", is_flag=True, help="Also score prompt+completion through prompt_logprobs."
)
@click.option(
    "--reference",
    type=PathType,
    default=None,
    help="With --teacher-forced: score this baseline bundle's outputs instead.",
)
@click.option("--server-cmd", default=None, help="The command that started the server.")
@click.option("--baked", type=PathType, default=None, help="BAKED.json of the served tree.")
@_capture_options
def capture(
    url: str,
    out_dir: Path,
    repeat: int,
    teacher_forced: bool,
    reference: Path | None,
    server_cmd: str | None,
    baked: Path | None,
    suite: str,
    concurrency: int,
    timeout_s: float,
    retries: int,
    model: str | None,
    token_keys: str,
) -> None:
    """Run a prompt suite against a vLLM server and write a bundle."""
    settings = _settings(concurrency, timeout_s, retries, model, token_keys, repeat)
    capture_bundle(
        url,
        out_dir,
        load_suite(suite),
        settings=settings,
        server=ServerInfo(command=server_cmd, baked_json=baked),
        teacher_forced=teacher_forced,
        reference=reference,
    )
    click.echo(f"captured {out_dir}")


GATE_OPTIONS = {
    "max_chosen_token_logprob_abs_error": "--max-chosen-logprob-error",
    "max_common_logprob_abs_error": "--max-common-logprob-error",
    "min_topk_overlap_mean": "--min-topk-overlap-mean",
    "min_topk_overlap_min": "--min-topk-overlap-min",
    "max_tf_kl": "--max-tf-kl",
    "max_tf_abs_logprob_delta": "--max-tf-logprob-delta",
    "max_tf_mean_abs_logprob_delta": "--max-tf-mean-logprob-delta",
    "min_fork_topk_overlap": "--min-fork-topk-overlap",
}


def _gate_options(func: Callable[..., Any]) -> Callable[..., Any]:
    for name, flag in reversed(GATE_OPTIONS.items()):
        func = click.option(
            flag,
            name,
            type=click.FloatRange(min=0),
            default=None,
            help=f"Bound for {name} (default: {getattr(ParityGates(), name) or 'off'}, "
            "or from --gates).",
        )(func)
    return func


def _summary_line(name: str, case: CaseResult) -> str:
    verdict = "pass" if case.passed else "FAIL"
    where = (
        "tokens match"
        if case.fork_step is None
        else (
            f"fork at step {case.fork_step} "
            f"({'low' if case.first_token_mismatch_low_margin else 'HIGH'} margin)"
        )
    )
    overlap = format_value(case.topk_overlap_mean)
    return f"{verdict}  {name}: {where}, top-k overlap {overlap}"


@verify.command()
@click.argument("baseline_dir", type=PathType)
@click.argument("candidate_dir", type=PathType)
@click.option(
    "--json",
    "json_path",
    type=PathType,
    default=None,
    help="Write the JSON report to this file ('-': stdout, the summary then goes to stderr).",
)
@click.option(
    "--markdown", "markdown_path", type=PathType, default=None, help="Write the Markdown report."
)
@_comparison_options
@click.option("--teacher-forced", is_flag=True, help="Also compare teacher-forced scores.")
@click.option(
    "--gates",
    "gates_path",
    type=PathType,
    default=None,
    help="Gates file (as written by calibrate); flags below override it.",
)
@click.option(
    "--allow-high-margin-mismatch", is_flag=True, help="Do not fail on high-margin forks."
)
@click.option("--ignore-prompt-ids", is_flag=True, help="Do not require equal prompt token ids.")
@_gate_options
def compare(
    baseline_dir: Path,
    candidate_dir: Path,
    json_path: Path | None,
    markdown_path: Path | None,
    top_n: int,
    low_margin: float,
    teacher_forced: bool,
    gates_path: Path | None,
    allow_high_margin_mismatch: bool,
    ignore_prompt_ids: bool,
    **bounds: float | None,
) -> None:
    """Compare a candidate bundle against a baseline bundle; exit 1 on parity failure."""
    gates = load_gates(gates_path) if gates_path is not None else ParityGates()
    gates = gates.with_values(
        "cli",
        fail_on_high_margin_mismatch=False if allow_high_margin_mismatch else None,
        require_prompt_ids_equal=False if ignore_prompt_ids else None,
        **bounds,
    )
    report = compare_bundles(
        baseline_dir,
        candidate_dir,
        gates,
        top_n=top_n,
        low_margin=low_margin,
        teacher_forced=teacher_forced,
    )
    to_stdout = json_path == Path("-")  # as everywhere in bakery: "-" is stdout
    if to_stdout:
        json_path = None
        click.echo(encode_json(report, sort_keys=True, ascii_only=False).decode(), nl=False)
    write_reports(report, json_path=json_path, markdown_path=markdown_path)
    for name, case in report.cases.items():
        click.echo(_summary_line(name, case), err=to_stdout)
    failed = report.failing()
    if failed:
        where = markdown_path or json_path
        raise ParityFailure(
            f"parity failed for {len(failed)} of {len(report.cases)} cases: {', '.join(failed)}",
            hint=f"see {where}" if where else "rerun with --markdown REPORT.md for details",
        )
    click.echo(f"parity passed: {len(report.cases)} cases", err=to_stdout)


@verify.command()
@click.option(
    "--out",
    "out_dir",
    type=PathType,
    required=True,
    help="Directory for run_NN bundles, gates.json and calibration.md.",
)
@click.option("--url", default=None, help="Capture --runs baseline bundles from this server.")
@click.option(
    "--runs",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Baseline bundles to capture from --url.",
)
@click.option(
    "--bundle",
    "bundles",
    type=PathType,
    multiple=True,
    help="An existing baseline bundle (e.g. captured after a restart); repeatable.",
)
@click.option(
    "--factor",
    type=click.FloatRange(min=1),
    default=2.0,
    show_default=True,
    help="Threshold = noise floor widened by this factor.",
)
@_comparison_options
@click.option("--teacher-forced", is_flag=True, help="Capture and calibrate teacher-forced KL too.")
@_capture_options
def calibrate(
    out_dir: Path,
    url: str | None,
    runs: int,
    bundles: tuple[Path, ...],
    factor: float,
    top_n: int,
    low_margin: float,
    teacher_forced: bool,
    suite: str,
    concurrency: int,
    timeout_s: float,
    retries: int,
    model: str | None,
    token_keys: str,
) -> None:
    """Derive gate thresholds from repeated baseline captures (the noise floor)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out must be a folder, not a file: {str(out_dir)!r}")
    dirs = list(bundles)
    if len(dirs) + (runs if url is not None else 0) < 2:
        raise UsageError(
            "calibration needs at least two baseline bundles: give --url with "
            "--runs >= 2, or --bundle DIR twice or more"
        )
    if url is not None:
        settings = _settings(concurrency, timeout_s, retries, model, token_keys)
        loaded = load_suite(suite)
        for run in range(1, runs + 1):
            dirs.append(
                capture_bundle(
                    url,
                    out_dir / f"run_{run:02d}",
                    loaded,
                    settings=settings,
                    teacher_forced=teacher_forced,
                )
            )
    calibration = calibrate_bundles(
        dirs,
        CalibrationPolicy(factor=factor),
        top_n=top_n,
        low_margin=low_margin,
        teacher_forced=teacher_forced,
    )
    gates_path, md_path = write_calibration(calibration, out_dir)
    click.echo(f"wrote {gates_path} and {md_path}")
    if calibration.high_margin_mismatches:
        click.echo(
            f"warning: the baseline forks at high margin against itself; see {md_path}", err=True
        )
