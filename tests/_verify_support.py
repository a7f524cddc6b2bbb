"""Shared helpers for the tests/test_verify_*.py files (not a test module).

The oracle fixtures are vendored byte for byte in ``tests/data/oracle`` with their MIT
notice and README, so a plain clone runs every test. Copies made for perturbation
tests carry the MIT notice along, as the fixtures' README asks.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from bakery.cli.root import main
from bakery.verify.bundle import Completion
from bakery.verify.metrics import compare_completions
from bakery.verify.result import CaseResult

ORACLE = Path(__file__).resolve().parent / "data" / "oracle"
NOMTP = ORACLE / "b200_tp2_nomtp"
MTP = ORACLE / "b200_tp2_mtp"
LICENSE = "LICENSE.jasl-vllm-ds4-sm120-harness"


def require_fixtures() -> None:
    if not NOMTP.is_dir() or not MTP.is_dir():
        pytest.fail(f"oracle fixtures missing: expected {ORACLE}")


def copy_bundle(source: Path, dest: Path) -> Path:
    """A writable copy of a fixture bundle (the originals are read-only), with the notice."""
    require_fixtures()
    dest.mkdir(parents=True)
    for path in sorted(source.glob("*.json")):
        shutil.copyfile(path, dest / path.name)
    shutil.copyfile(ORACLE / LICENSE, dest / LICENSE)
    return dest


def edit_case(bundle: Path, name: str, change: Callable[[dict[str, Any]], None]) -> None:
    path = bundle / f"{name}.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(json.dumps(data), encoding="utf-8")


def logprobs_of(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["response"]["choices"][0]["logprobs"]


def run_cli(args: Sequence[str]) -> tuple[int, str]:
    """Run ``bakery verify ARGS`` through the real CLI boundary; (exit code, stdout+stderr)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(["verify", *args])
    return code, out.getvalue()


def case_result(**changes: Any) -> CaseResult:
    """A ``CaseResult`` of a run compared with itself (every token and prompt id the same,
    nothing teacher-forced), with ``changes`` (field name -> value) over it: a case made
    to order for the gates."""
    steps = ({"a": -0.1, "b": -2.0}, {"b": -0.2, "a": -3.0})
    run = Completion(
        tokens=("a", "b"),
        token_logprobs=(-0.1, -0.2),
        top_logprobs=steps,
        prompt_token_ids=(1, 2),
        token_ids=None,
    )
    case = compare_completions("c", run, run, top_n=20, low_margin=0.5)
    return msgspec.structs.replace(case, **changes)
