"""Prompt suites: JSONL data in ``bakery/verify/suites/``, parsed into frozen cases.

One JSON object per line. A case has ``case`` (a file-name-safe id), ``max_tokens``,
optional ``tags`` and ``why``, and either a text ``prompt``, an exact context
length ``prompt_tokens`` built from ``filler`` text (tokenised by the server,
repeated and cut to exactly that many ids, so ownership edges are hit on any
tokenizer), or ``batch_prompt_tokens``: one request carrying a list of prompts of
those lengths (prompt i: the filler's ids from id 7 i on), which the server takes
together and schedules together; each prompt is a record of its own
(``<case>_00``, ``<case>_01``, ...), compared prompt by prompt. Unknown fields and
wrong types are refused (``SuiteCase``); every problem in a file is reported at once.
No network here.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated

from msgspec import Meta

from bakery.schema import Document, read_text, refuse, try_decode
from bakery.verify.errors import SuiteError

__all__ = ["Suite", "SuiteCase", "load_suite", "available_suites", "SUITES_DIR"]

SUITES_DIR = Path(__file__).resolve().parent / "suites"
CASE_ID = re.compile(r"^[a-z0-9][a-z0-9_]*$")
_CASE_WORDS = "a case id (a-z, 0-9 and _, not _ first: it names files)"


@dataclass(frozen=True)
class Suite:
    name: str
    path: Path
    sha256: str
    cases: tuple[SuiteCase, ...]

    def only(self, names: tuple[str, ...]) -> Suite:
        """These cases of the suite, in its order (none named: all of them)."""
        known = [c.case for c in self.cases]
        unknown = sorted(set(names) - set(known))
        if unknown:
            raise SuiteError(
                f"suite {self.name!r} has no case {', '.join(map(repr, unknown))}",
                hint=f"its cases: {', '.join(known)}",
            )
        if not names:
            return self
        return replace(self, cases=tuple(c for c in self.cases if c.case in names))


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


MAX_TOKENS = 1 << 20  # no model's context is longer; 10**12 filler tokens would fill memory
_Tokens = Annotated[
    int, Meta(ge=1, le=MAX_TOKENS, description=f"a positive integer (at most {MAX_TOKENS})")
]


class SuiteCase(Document, frozen=True):
    """One line of a suite file (the one place that knows its shape)."""

    case: Annotated[str, Meta(pattern=CASE_ID.pattern, description=_CASE_WORDS)]
    max_tokens: _Tokens
    prompt: Annotated[str, Meta(min_length=1, description="a non-empty string")] | None = None
    prompt_tokens: _Tokens | None = None
    batch_prompt_tokens: (
        Annotated[tuple[_Tokens, ...], Meta(min_length=2, max_length=64)] | None
    ) = None
    filler: str | None = None  # the text repeated to the ids of prompt_tokens or the batch
    tags: tuple[str, ...] = ()
    why: str | None = None  # what the case is for (dcp_edge cases say which edge)

    @property
    def members(self) -> tuple[str, ...]:
        """The case ids its records carry: its own, or one per prompt of a batch."""
        if self.batch_prompt_tokens is None:
            return (self.case,)
        return tuple(f"{self.case}_{i:02d}" for i in range(len(self.batch_prompt_tokens)))


def load_suite(name_or_path: str) -> Suite:
    """Load a bundled suite by name (``dcp2``) or any ``.jsonl`` file by path."""
    path = _resolve(name_or_path)
    text = read_text(path, SuiteError, "suite")  # bounded, and a FIFO never hangs it
    raw = text.encode("utf-8")
    cases: list[SuiteCase] = []
    problems: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            cases.append(_parse_case(line))
        except ValueError as exc:
            problems.extend(f"{path}:{number}: {p}" for p in str(exc).split("\n"))
    problems.extend(_duplicates(path, cases))
    if not cases and not problems:
        problems.append(f"{path}: no cases")
    hint = "one JSON object per line: case, max_tokens, and prompt or prompt_tokens + filler"
    refuse(problems, where="invalid suite", error=SuiteError, hint=hint)
    return Suite(path.stem, path, hashlib.sha256(raw).hexdigest(), tuple(cases))


def _duplicates(path: Path, cases: list[SuiteCase]) -> list[str]:
    counts = Counter(name for c in cases for name in {c.case, *c.members})
    return [f"{path}: duplicate case {name!r}" for name, n in sorted(counts.items()) if n > 1]


def _parse_case(line: str) -> SuiteCase:
    """One line as a case; a ValueError holds its problems, one per line of its text."""
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON ({exc.msg})") from exc
    except RecursionError:
        raise ValueError("invalid JSON (nested too deeply)") from None
    doc, problems = try_decode(data, SuiteCase)
    if doc is None:
        raise ValueError("\n".join(problems))
    given = [doc.prompt, doc.prompt_tokens, doc.batch_prompt_tokens]
    if sum(x is not None for x in given) != 1:
        problems.append(
            f"$: case {doc.case!r} gives {sum(x is not None for x in given)} of prompt, "
            "prompt_tokens and batch_prompt_tokens (exactly one)"
        )
    if doc.prompt is None and not (doc.filler or "").strip():
        problems.append("$.filler: prompt_tokens and batch_prompt_tokens need a filler text")
    if problems:
        raise ValueError("\n".join(problems))
    return doc
