"""Calibration (noise floor -> thresholds) and the prompt suites as data."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from _verify_support import MTP, NOMTP, copy_bundle, edit_case, logprobs_of, run_cli

from bakery.verify import compare_bundles, load_suite
from bakery.verify.calibrate import (
    CalibrationPolicy,
    calibrate_bundles,
    derive_threshold,
    write_calibration,
)
from bakery.verify.compare import GatesFileDoc, load_gates
from bakery.verify.errors import GatesError, SuiteError

POLICY = CalibrationPolicy(
    factor=2.0, min_logprob_bound=0.05, min_kl_bound=1e-3, min_overlap_slack=0.05
)


@pytest.mark.parametrize(
    ("name", "floor", "expected"),
    [
        ("max_chosen_token_logprob_abs_error", 0.1, 0.2),
        ("max_chosen_token_logprob_abs_error", 0.001, 0.05),  # never tighter than the minimum
        ("max_tf_kl", 0.0, 1e-3),
        ("min_topk_overlap_mean", 0.9, 0.8),  # slack 0.1 doubled
        ("min_topk_overlap_mean", 1.0, 0.95),  # minimum slack
        ("min_topk_overlap_min", 0.2, 0.0),  # clamped at 0
        ("max_tf_kl", None, None),  # never observed: gate stays off
    ],
)
def test_derive_threshold(name: str, floor: float | None, expected: float | None) -> None:
    assert derive_threshold(name, floor, POLICY) == pytest.approx(expected)


def test_calibration_from_bundles_uses_the_worst_pair(tmp_path: Path) -> None:
    again = copy_bundle(NOMTP, tmp_path / "again")
    calibration = calibrate_bundles([NOMTP, MTP, again], POLICY)
    assert calibration.pairs == 3
    worst = max(
        c.trajectory_max_chosen_token_logprob_abs_error
        for c in compare_bundles(NOMTP, MTP).cases.values()
    )
    assert calibration.noise_floor["max_chosen_token_logprob_abs_error"] == worst
    assert calibration.gates.max_chosen_token_logprob_abs_error == pytest.approx(2 * worst)
    assert calibration.gates.sources["max_chosen_token_logprob_abs_error"] == "calibration"
    assert calibration.gates.max_tf_kl is None  # no teacher-forced data: not calibrated
    assert calibration.high_margin_mismatches == ()


def test_the_gates_file_holds_the_calibration_typed_and_refuses_a_mistyped_one(
    tmp_path: Path,
) -> None:
    calibration = calibrate_bundles([NOMTP, MTP], POLICY)
    gates_path, _ = write_calibration(calibration, tmp_path)
    kept = msgspec.convert(json.loads(gates_path.read_text()), GatesFileDoc, strict=True)
    assert kept.calibration == calibration  # the file holds the calibration, whole
    assert load_gates(gates_path).values() == calibration.gates.values()
    doc = json.loads(gates_path.read_text())
    doc["calibration"]["pairs"] = "one"
    gates_path.write_text(json.dumps(doc))
    with pytest.raises(GatesError, match=r"\$\.calibration\.pairs: expected int, got str"):
        load_gates(gates_path)


def test_calibrated_gates_drive_compare(tmp_path: Path) -> None:
    out = tmp_path / "cal"
    code, log = run_cli(
        ["calibrate", "--out", str(out), "--bundle", str(NOMTP), "--bundle", str(MTP)]
    )
    assert code == 0, log
    gates = json.loads((out / "gates.json").read_text())
    assert gates["sources"]["min_topk_overlap_mean"] == "calibration"

    md = tmp_path / "r.md"
    code, log = run_cli(
        ["compare", str(NOMTP), str(MTP), "--gates", str(out / "gates.json"), "--markdown", str(md)]
    )
    assert code == 0, log
    assert "| max_chosen_token_logprob_abs_error |" in md.read_text()
    assert "| calibration |" in md.read_text()

    candidate = copy_bundle(MTP, tmp_path / "cand")

    def bump(doc: dict) -> None:
        lp = logprobs_of(doc)
        lp["token_logprobs"][0] -= 2.0

    edit_case(candidate, "completion_code_probe_logprobs20", bump)
    code, log = run_cli(["compare", str(NOMTP), str(candidate), "--gates", str(out / "gates.json")])
    assert code == 1 and "completion_code_probe_logprobs20" in log


def calibrate_cli(out: Path, *flags: str) -> tuple[int, str, dict]:
    code, log = run_cli(["calibrate", "--out", str(out), "--bundle", str(NOMTP),
                         "--bundle", str(MTP), *flags])  # fmt: skip
    return code, log, json.loads((out / "gates.json").read_text())


def test_factor_widens_every_threshold_by_that_factor(tmp_path: Path) -> None:
    """--factor 3 puts each threshold 1.5x as far from perfect as --factor 2 (the default)
    does: above the floor for an upper bound, below 1 for an overlap's lower bound."""
    code, log, two = calibrate_cli(tmp_path / "two")
    assert code == 0, log
    code, log, three = calibrate_cli(tmp_path / "three", "--factor", "3")
    assert code == 0, log
    assert three["calibration"]["policy"]["factor"] == 3.0
    for name in ("max_chosen_token_logprob_abs_error", "max_common_logprob_abs_error"):
        assert three["gates"][name] == pytest.approx(1.5 * two["gates"][name])
    for name in ("min_topk_overlap_mean", "min_topk_overlap_min"):
        assert 1 - three["gates"][name] == pytest.approx(1.5 * (1 - two["gates"][name]))


def test_low_margin_decides_whether_the_baseline_forks_at_high_margin(tmp_path: Path) -> None:
    """The fixtures fork at step 7 of the long prompt with a smaller top-1 margin of 0.25:
    a near tie under the default --low-margin 0.5, a high-margin fork under 0.2, which
    calibrate warns about and lists."""
    code, log, gates = calibrate_cli(tmp_path / "default")
    assert code == 0 and "warning" not in log, log
    assert gates["calibration"]["high_margin_mismatches"] == []
    code, log, gates = calibrate_cli(tmp_path / "tight", "--low-margin", "0.2")
    assert code == 0 and "warning: the baseline forks at high margin against itself" in log
    fork = f"{MTP}: completion_long_prefill_2048_logprobs20 step 7"
    assert gates["calibration"]["high_margin_mismatches"] == [fork]
    assert f"- {fork}" in (tmp_path / "tight" / "calibration.md").read_text()


def test_calibrate_needs_two_bundles() -> None:
    code, out = run_cli(["calibrate", "--out", "unused", "--bundle", str(NOMTP)])
    assert code == 2 and "at least two baseline bundles" in out


def test_bundled_suites_cover_the_issue() -> None:
    suite = load_suite("dcp2")
    tags = {tag for case in suite.cases for tag in case.tags}
    assert {"math", "code", "prose", "translation", "long_prefill", "dcp_edge"} <= tags
    lengths = {case.prompt_tokens for case in suite.cases if case.prompt_tokens}
    assert any(n >= 4096 for n in lengths)
    assert 1 in lengths and {127, 128, 129} <= lengths  # below DCP size; page x DCP x 1 ± 1
    assert all(case.why for case in suite.cases if "dcp_edge" in case.tags)
    assert len(load_suite("tiny").cases) < len(suite.cases)


def test_a_bad_suite_lists_every_problem(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"case": "Bad Name", "prompt": "x", "max_tokens": 1}\n'
        '{"case": "ok", "max_tokens": 0, "prompt": "x"}\n'
        "not json\n",
        encoding="utf-8",
    )
    with pytest.raises(SuiteError) as info:
        load_suite(str(bad))
    message = str(info.value)
    assert "bad.jsonl:1: $.case: must be a case id (a-z, 0-9 and _, not _ first" in message
    assert "not _ first: it names files), not 'Bad Name'" in message
    assert "bad.jsonl:2: $.max_tokens: must be a positive integer (at most 1048576), not 0" in (
        message
    )
    assert "bad.jsonl:3: invalid JSON" in message


def test_capture_checks_the_suite_before_contacting_the_server(tmp_path: Path) -> None:
    code, out = run_cli(
        [
            "capture",
            "--url",
            "http://127.0.0.1:9",
            "--out",
            str(tmp_path / "b"),
            "--suite",
            "no-such-suite",
        ]
    )
    assert (
        code == 2
        and "unknown suite 'no-such-suite' (available: dcp2, tiny, v41batch, v41cpu, v41spec)"
        in out
    )
    assert not (tmp_path / "b").exists()
