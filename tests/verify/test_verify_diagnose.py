"""The parity report's diagnosis and decoded first divergence, each on bundles built to show
one pattern: systematic (every case forks at step 0), layout (only prompts past a page or
shard fail), numerical noise (late low-margin forks and small drift), drift (late forks
above the low-margin threshold, short prompts too), mixed, and a pass.

The bundles are written as a server writes them (``completion_<case>.json``, token ids as
``token_id:N``) and go through ``compare_bundles`` and the Markdown report, as the matrix
runs them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bakery.verify import ParityGates, compare_bundles, render_markdown
from bakery.verify.compare import ParityReport
from bakery.verify.diagnose import NEXT_STEPS, tokenizer_decoder
from lab.tiny_model import DEFAULT_DIR, ensure

LENGTHS = {"a_short": 12, "b_page": 129, "c_shard": 257, "d_long": 300}
BOUNDARIES = (128, 256)
STEPS = 6
LOW = 0.05


def _top(chosen: int, other: int, margin: float) -> dict[str, float]:
    return {f"token_id:{chosen}": -0.1, f"token_id:{other}": -0.1 - margin,
            f"token_id:{chosen + 300}": -6.0}  # fmt: skip


def write_case(bundle: Path, case: str, prompt: list[int], steps: list[tuple]) -> None:
    """``steps``: (token, logprob, runner-up, margin) per decode step."""
    tokens = [s[0] for s in steps]
    doc = {
        "name": f"completion_{case}",
        "path": "/v1/completions",
        "status": 200,
        "request": {"prompt": prompt, "max_tokens": STEPS, "temperature": 0, "logprobs": 20},
        "response": {"choices": [{
            "token_ids": tokens,
            "logprobs": {
                "tokens": [f"token_id:{t}" for t in tokens],
                "token_logprobs": [s[1] for s in steps],
                "top_logprobs": [_top(s[0], s[2], s[3]) for s in steps],
            },
        }]},
    }  # fmt: skip
    bundle.mkdir(parents=True, exist_ok=True)
    (bundle / f"completion_{case}.json").write_text(json.dumps(doc))


def base_steps(fork_margin_at: int | None = None) -> list[tuple]:
    return [(10 + s, -0.1, 100 + s, LOW / 2 if s == fork_margin_at else 2.0) for s in range(STEPS)]


def forked(steps: list[tuple], at: int, margin: float = 2.0) -> list[tuple]:
    """The candidate takes the runner-up at ``at`` (its own margin ``margin``), then other text."""
    out = list(steps[:at])
    out.append((steps[at][2], -0.1, steps[at][0], margin))
    out += [(200 + s, -0.1, 250 + s, 2.0) for s in range(at + 1, STEPS)]
    return out


def run(tmp_path: Path, plan: dict, gates: ParityGates | None = None, **kwargs) -> ParityReport:
    """``plan``: case -> (baseline steps, candidate steps); the report over both bundles."""
    for case, (base, cand) in plan.items():
        prompt = [5 + i % 7 for i in range(LENGTHS[case])]
        write_case(tmp_path / "base", case, prompt, base)
        write_case(tmp_path / "cand", case, prompt, cand)
    return compare_bundles(
        tmp_path / "base", tmp_path / "cand", gates, low_margin=LOW, boundaries=BOUNDARIES,
        **kwargs,
    )  # fmt: skip


def test_every_case_forking_at_step_0_is_systematic(tmp_path):
    plan = {case: (base_steps(), forked(base_steps(), 0)) for case in LENGTHS}
    diagnosis = run(tmp_path, plan).diagnosis
    assert diagnosis.pattern == "systematic", diagnosis
    assert diagnosis.next_step == NEXT_STEPS["systematic"] and "bisect" in diagnosis.next_step


def test_only_prompts_past_the_page_failing_is_layout(tmp_path):
    plan = {case: (base_steps(), base_steps() if n <= 128 else forked(base_steps(), 1))
            for case, n in LENGTHS.items()}  # fmt: skip
    report = run(tmp_path, plan)
    assert report.diagnosis.pattern == "layout", report.diagnosis
    assert report.diagnosis.boundary == 128
    assert "--teacher-forced" in report.diagnosis.next_step
    # past the shard only: the boundary named is the shard's
    plan = {case: (base_steps(), base_steps() if n <= 256 else forked(base_steps(), 2))
            for case, n in LENGTHS.items()}  # fmt: skip
    shard = run(tmp_path / "shard", plan).diagnosis
    assert (shard.pattern, shard.boundary) == ("layout", 256)


def test_late_low_margin_forks_and_drift_are_noise(tmp_path):
    gates = ParityGates().with_values("test", max_chosen_token_logprob_abs_error=0.001)
    drift = [(t, lp + 0.01, o, m) for t, lp, o, m in base_steps()]
    late = forked(base_steps(3), 3, LOW / 2)  # a near tie at step 3, both sides
    late[1] = (11, -0.1 + 0.01, 101, 2.0)  # and drift before it: a bound fails
    plan = {
        "a_short": (base_steps(), base_steps()),
        "b_page": (base_steps(3), late),
        "c_shard": (base_steps(), drift),
        "d_long": (base_steps(), base_steps()),
    }
    report = run(tmp_path, plan, gates)
    assert sorted(n for n, c in report.cases.items() if not c.passed) == [
        "completion_b_page", "completion_c_shard"]  # fmt: skip
    assert report.cases["completion_b_page"].first_token_mismatch_low_margin is True
    assert report.diagnosis.pattern == "noise", report.diagnosis
    assert "off by up to 0.01 nats" in report.diagnosis.line
    assert "calibrate" in report.diagnosis.next_step


def test_late_forks_above_the_threshold_at_any_length_are_drift(tmp_path):
    plan = {case: (base_steps(), forked(base_steps(), 3 + i % 2))
            for i, case in enumerate(LENGTHS)}  # fmt: skip
    diagnosis = run(tmp_path, plan).diagnosis
    assert diagnosis.pattern == "drift", diagnosis
    assert "steps [3, 4]" in diagnosis.line and "--teacher-forced" in diagnosis.next_step


def test_no_single_pattern_is_mixed_and_a_clean_run_passes(tmp_path):
    plan = {case: (base_steps(), base_steps()) for case in LENGTHS}
    plan["a_short"] = (base_steps(), forked(base_steps(), 2))
    plan["d_long"] = (base_steps(), forked(base_steps(), 0))
    mixed = run(tmp_path / "m", plan).diagnosis
    assert mixed.pattern == "mixed" and "--teacher-forced" in mixed.next_step
    clean = run(tmp_path / "c", {c: (base_steps(), base_steps()) for c in LENGTHS})
    assert clean.passed and clean.diagnosis.pattern == "pass"


def test_a_planted_wrong_rule_is_caught(tmp_path, monkeypatch):
    """The layout test fails when the diagnosis ignores boundaries (a planted bug)."""
    from bakery.verify import diagnose

    monkeypatch.setattr(diagnose, "_layout_boundary", lambda views, bounds: None)
    with pytest.raises(AssertionError):
        test_only_prompts_past_the_page_failing_is_layout(tmp_path)


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer

    folder = ensure(Path(__file__).resolve().parents[2] / DEFAULT_DIR)
    return folder, Tokenizer.from_file(str(folder / "tokenizer.json"))


def test_the_first_divergence_is_decoded_with_the_models_tokenizer(tmp_path, tokenizer):
    folder, tok = tokenizer
    prompt_text, common_text = "Le chat dort sur le canapé. The quick brown fox", " jumps"
    base_text, cand_text = " over the lazy dog. One, two", " Hello, world! How are you"
    prompt, common = tok.encode(prompt_text).ids, tok.encode(common_text).ids
    base_ids, cand_ids = tok.encode(base_text).ids, tok.encode(cand_text).ids
    assert min(len(base_ids), len(cand_ids)) >= 4 and base_ids[0] != cand_ids[0]
    base = [(t, -0.1, cand_ids[0], 2.0) for t in common + base_ids]
    cand = [(t, -0.1, base_ids[0], 2.0) for t in common + cand_ids]
    write_case(tmp_path / "b", "a_short", prompt, base)
    write_case(tmp_path / "c", "a_short", prompt, cand)
    report = compare_bundles(tmp_path / "b", tmp_path / "c", decode=tokenizer_decoder(folder))
    case = report.cases["completion_a_short"]
    assert case.first_token_mismatch.step == len(common)
    text = case.first_token_mismatch_text
    # the truth is the strings encoded above: each decoded piece is where it must be
    assert text.context.endswith(common_text) and len(text.context) > len(common_text)
    assert (prompt_text + common_text).endswith(text.context)
    assert text.baseline and base_text.startswith(text.baseline)
    assert text.candidate and cand_text.startswith(text.candidate)
    assert text.baseline != text.candidate
    markdown = render_markdown(report)
    assert "## Diagnosis" in markdown and "- next: " in markdown
    assert json.dumps(text.candidate, ensure_ascii=False) in markdown
    assert json.dumps(text.context, ensure_ascii=False) in markdown


def test_a_fork_decoded_one_step_late_is_caught(tmp_path, tokenizer, monkeypatch):
    """Planted: the text taken one step past the fork."""
    from bakery.verify import compare, diagnose

    late = diagnose.first_divergence_text
    monkeypatch.setattr(
        compare,
        "first_divergence_text",
        lambda base, cand, step, decode: late(base, cand, step + 1, decode),
    )
    with pytest.raises(AssertionError):
        test_the_first_divergence_is_decoded_with_the_models_tokenizer(tmp_path, tokenizer)
