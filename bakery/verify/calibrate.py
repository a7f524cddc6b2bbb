"""Calibration: gate thresholds from the baseline's measured run-to-run noise.

Given two or more bundles of the *same* server setup (repeated captures, ideally
across restarts), every pair is compared and each bound gate's worst observed
value is its noise floor; the threshold is the floor widened by a policy factor,
never tighter than a policy minimum. The result names every threshold it set
(source ``calibration``). Capturing the runs is the command's job; this is pure
apart from reading bundles and writing the gates file.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

from bakery import markdown
from bakery.errors import UsageError
from bakery.schema import write_json_atomic
from bakery.tree import write_text_atomic
from bakery.verify.compare import (
    BOUND_GATES,
    Calibration,
    CalibrationPolicy,
    ParityGates,
    ParityReport,
    compare_bundles,
    derive_threshold,
)
from bakery.verify.report import format_value

__all__ = [
    "CalibrationPolicy",
    "Calibration",
    "noise_floor",
    "derive_threshold",
    "calibrate_from_reports",
    "calibrate_bundles",
    "write_calibration",
]


def noise_floor(reports: Sequence[ParityReport]) -> dict[str, float | None]:
    """Worst value of each bound gate's field over all cases of all reports (None: unseen)."""
    floor: dict[str, float | None] = {}
    for name, (key, kind) in BOUND_GATES.items():
        values = (case.value(key) for report in reports for case in report.cases.values())
        seen = [value for value in values if value is not None]
        pick = max if kind == "max" else min
        floor[name] = pick(seen) if seen else None
    return floor


def _high_margin(report: ParityReport) -> list[str]:
    return [
        f"{report.candidate.path}: {name} step {case.fork_step}"
        for name, case in sorted(report.cases.items())
        if case.fork_step is not None and not case.first_token_mismatch_low_margin
    ]


def calibrate_from_reports(
    reports: Sequence[ParityReport], bundles: Sequence[str], policy: CalibrationPolicy
) -> Calibration:
    return Calibration(
        noise_floor=noise_floor(reports),
        bundles=tuple(bundles),
        pairs=len(reports),
        policy=policy,
        high_margin_mismatches=tuple(m for r in reports for m in _high_margin(r)),
    )


def calibrate_bundles(
    bundle_dirs: Sequence[Path],
    policy: CalibrationPolicy | None = None,
    *,
    top_n: int = 20,
    low_margin: float = 0.5,
    teacher_forced: bool = False,
) -> Calibration:
    """Compare every pair of same-setup bundles and derive thresholds from the spread."""
    if len(bundle_dirs) < 2:
        raise UsageError(f"calibration needs at least 2 baseline bundles, got {len(bundle_dirs)}")
    reports = [
        compare_bundles(
            a, b, ParityGates(), top_n=top_n, low_margin=low_margin, teacher_forced=teacher_forced
        )
        for a, b in itertools.combinations(bundle_dirs, 2)
    ]
    names = [str(p) for p in bundle_dirs]
    return calibrate_from_reports(reports, names, policy or CalibrationPolicy())


def render_calibration(calibration: Calibration) -> str:
    lines = [
        "# Gate calibration",
        "",
        f"{len(calibration.bundles)} baseline bundles, {calibration.pairs} pairwise comparisons, "
        f"factor {calibration.policy.factor}.",
        "",
    ]
    gates = calibration.gates
    rows = []
    for name in BOUND_GATES:
        value = getattr(gates, name)
        threshold = format_value(value) if value is not None else "off"
        noise = format_value(calibration.noise_floor[name])
        rows.append((name, noise, threshold, gates.sources.get(name, "default")))
    lines.append(markdown.table(("gate", "noise floor", "threshold", "source"), rows))
    if calibration.high_margin_mismatches:
        lines += ["", "The baseline disagrees with itself at high margin (not deterministic):"]
        lines += [f"- {m}" for m in calibration.high_margin_mismatches]
    return "\n".join(lines) + "\n"


def write_calibration(calibration: Calibration, out_dir: Path) -> tuple[Path, Path]:
    """Write ``gates.json`` (for ``compare --gates``) and ``calibration.md`` atomically."""
    gates_path, md_path = out_dir / "gates.json", out_dir / "calibration.md"
    write_json_atomic(gates_path, calibration.gates_file(), sort_keys=True, strict=True)
    write_text_atomic(md_path, render_calibration(calibration))
    return gates_path, md_path
