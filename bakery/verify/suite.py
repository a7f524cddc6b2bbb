"""Prompt suites: JSONL data in ``bakery/verify/suites/``, parsed into frozen cases.

One JSON object per line. A case has ``case`` (a file-name-safe id), ``max_tokens``,
optional ``tags`` and ``why``, and either a text ``prompt`` or an exact context
length ``prompt_tokens`` built from ``filler`` text (tokenised by the server,
repeated and cut to exactly that many ids, so ownership edges are hit on any
tokenizer). Every problem in a file is reported at once. No network here.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bakery.verify.errors import SuiteError

__all__ = ["Suite", "SuiteCase", "load_suite", "available_suites", "SUITES_DIR"]

SUITES_DIR = Path(__file__).resolve().parent / "suites"
CASE_ID = re.compile(r"^[a-z0-9][a-z0-9_]*$")


@dataclass(frozen=True)
class SuiteCase:
    case: str
    max_tokens: int
    prompt: str | None
    prompt_tokens: int | None
    filler: str | None
    tags: tuple[str, ...]
    why: str | None


@dataclass(frozen=True)
class Suite:
    name: str
    path: Path
    sha256: str
    cases: tuple[SuiteCase, ...]


def available_suites() -> list[str]:
    return sorted(p.stem for p in SUITES_DIR.glob("*.jsonl"))


def _resolve(name_or_path: str) -> Path:
    as_path = Path(name_or_path)
    if as_path.suffix == ".jsonl" or as_path.parent != Path("."):
        if not as_path.is_file():
            raise SuiteError(f"suite file not found: {name_or_path!r}")
        return as_path
    path = SUITES_DIR / f"{name_or_path}.jsonl"
    if not path.is_file():
        raise SuiteError(
            f"unknown suite {name_or_path!r} (available: {', '.join(available_suites())})"
        )
    return path


def load_suite(name_or_path: str) -> Suite:
    """Load a bundled suite by name (``dcp2``) or any ``.jsonl`` file by path."""
    path = _resolve(name_or_path)
    raw = path.read_bytes()
    cases: list[SuiteCase] = []
    problems: list[str] = []
    for number, line in enumerate(raw.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            cases.append(_parse_case(line))
        except ValueError as exc:
            problems.append(f"{path}:{number}: {exc}")
    problems.extend(_duplicates(path, cases))
    if not cases and not problems:
        problems.append(f"{path}: no cases")
    if problems:
        raise SuiteError("invalid suite (" + "; ".join(problems) + ")")
    return Suite(path.stem, path, hashlib.sha256(raw).hexdigest(), tuple(cases))


def _duplicates(path: Path, cases: list[SuiteCase]) -> list[str]:
    counts = Counter(c.case for c in cases)
    return [f"{path}: duplicate case {name!r}" for name, n in sorted(counts.items()) if n > 1]


def _positive_int(data: dict[str, Any], key: str) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{key} must be a positive integer, got {value!r}")
    return value


def _parse_case(line: str) -> SuiteCase:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON ({exc.msg})") from exc
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object")
    case = data.get("case")
    if not isinstance(case, str) or not CASE_ID.match(case):
        raise ValueError(f"case must match {CASE_ID.pattern}, got {case!r}")
    max_tokens = _positive_int(data, "max_tokens")
    if max_tokens is None:
        raise ValueError(f"{case}: max_tokens is required")
    prompt, filler = data.get("prompt"), data.get("filler")
    prompt_tokens = _positive_int(data, "prompt_tokens")
    if (prompt is None) == (prompt_tokens is None):
        raise ValueError(f"{case}: give exactly one of prompt and prompt_tokens")
    if prompt is not None and (not isinstance(prompt, str) or not prompt):
        raise ValueError(f"{case}: prompt must be a non-empty string")
    if prompt_tokens is not None and (not isinstance(filler, str) or not filler.strip()):
        raise ValueError(f"{case}: prompt_tokens needs a non-empty filler text")
    tags = data.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise ValueError(f"{case}: tags must be a list of strings")
    why = data.get("why")
    return SuiteCase(
        case,
        max_tokens,
        prompt,
        prompt_tokens,
        filler if prompt_tokens is not None else None,
        tuple(tags),
        why if isinstance(why, str) else None,
    )
