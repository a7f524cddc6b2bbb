"""Bundles: a directory of captured server answers, read and written at one border.

A bundle is the wrapped format of the real oracle fixtures: one
``completion_<case>.json`` per case (``name``, ``path``, ``status``, ``request``,
``tokenize_response``, ``response``), optional ``teacher_<case>.json`` files with
teacher-forced scores, and an optional ``bundle.json`` describing the server.
Everything past this module sees frozen ``CaseRecord``/``Completion`` values,
never raw JSON; nothing here computes a metric.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bakery.tree import write_json_atomic
from bakery.verify.errors import BundleError

__all__ = [
    "Bundle",
    "CaseRecord",
    "Completion",
    "TeacherScores",
    "load_bundle",
    "load_json_object",
    "logprob",
    "case_from_document",
    "teacher_from_document",
    "token_key",
    "write_case_file",
    "write_bundle_meta",
    "CASE_PREFIX",
    "TEACHER_PREFIX",
    "META_NAME",
]

CASE_PREFIX = "completion_"
TEACHER_PREFIX = "teacher_"
META_NAME = "bundle.json"
COMPLETIONS_PATH = "/v1/completions"
TOKEN_ID_PREFIX = "token_id:"
# What a served logprob may be: vLLM floors at -9999; the slack above 0 absorbs
# rounding. Anything outside makes the metrics' sums and exps non-finite.
LOGPROB_RANGE = (-1e30, 1e-3)

Json = dict[str, Any]


@dataclass(frozen=True)
class Completion:
    """One greedy completion: per-step tokens, their logprobs and the served top-k.

    ``top_logprobs`` dicts keep the server's order; ``prompt_token_ids`` is None
    when neither the request, ``/tokenize`` nor the response recorded them.
    """

    tokens: tuple[str, ...]
    token_logprobs: tuple[float | None, ...]
    top_logprobs: tuple[dict[str, float], ...]
    prompt_token_ids: tuple[int, ...] | None
    token_ids: tuple[int, ...] | None


@dataclass(frozen=True)
class TeacherScores:
    """A server's logprobs for a fixed token sequence (prompt plus reference output).

    ``positions[j]`` maps token id to logprob for the distribution that predicts
    ``sequence[j]``; it is None where the server gave none (position 0).
    """

    sequence: tuple[int, ...]
    completion_start: int
    positions: tuple[dict[int, float] | None, ...]


@dataclass(frozen=True)
class CaseRecord:
    """One case of a bundle, as read from ``completion_<case>.json``."""

    name: str
    file: Path
    request: Json
    completion: Completion
    system_fingerprint: str | None
    teacher: TeacherScores | None


@dataclass(frozen=True)
class Bundle:
    """All cases of one bundle directory, sorted by file name, plus its metadata."""

    path: Path
    cases: tuple[CaseRecord, ...]
    meta: Json

    def by_name(self) -> dict[str, CaseRecord]:
        return {case.name: case for case in self.cases}

    @property
    def token_key_kind(self) -> str:
        """``"ids"`` when tokens are ``token_id:N`` keys, else ``"strings"``."""
        for case in self.cases:
            if case.completion.tokens:
                return "ids" if case.completion.tokens[0].startswith(TOKEN_ID_PREFIX) else "strings"
        return "strings"


def load_json_object(path: Path, what: str, error: type[Exception] = BundleError) -> Json:
    """Read ``path`` as one JSON object or raise ``error`` naming the file and the problem."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"cannot read {what} {path} ({exc.strerror})") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}: {exc.msg}"
        raise error(f"cannot read {what} {path} (invalid JSON, {where})") from exc
    if not isinstance(data, dict):
        got = type(data).__name__
        raise error(f"cannot read {what} {path} (expected a JSON object, got {got})")
    return data


def load_bundle(directory: Path) -> Bundle:
    """Load every case of ``directory``; any malformed file is a ``BundleError``."""
    if not directory.is_dir():
        raise BundleError(f"bundle directory not found: {str(directory)!r}")
    files = sorted(directory.glob(f"{CASE_PREFIX}*.json"))
    if not files:
        raise BundleError(
            f"bundle {directory} has no cases (expected {CASE_PREFIX}<case>.json files)"
        )
    teachers = _load_teachers(directory)
    cases = tuple(_load_case(path, teachers) for path in files)
    _reject_duplicate_names(cases)
    meta_path = directory / META_NAME
    meta = load_json_object(meta_path, "bundle metadata") if meta_path.exists() else {}
    return Bundle(path=directory, cases=cases, meta=meta)


def _reject_duplicate_names(cases: tuple[CaseRecord, ...]) -> None:
    seen: dict[str, Path] = {}
    for case in cases:
        if case.name in seen:
            raise BundleError(
                f"duplicate case name {case.name!r} in {seen[case.name].name} and {case.file.name}"
            )
        seen[case.name] = case.file


def _require(data: Json, key: str, kind: type | tuple[type, ...], path: Path) -> Any:
    value = data.get(key)
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        got = repr(value)[:60]
        raise BundleError(f"bundle case {path} (field {key!r}: expected {names}, got {got})")
    return value


def _load_case(path: Path, teachers: Mapping[str, TeacherScores]) -> CaseRecord:
    record = case_from_document(load_json_object(path, "bundle case"), path)
    return replace(record, teacher=teachers.get(record.name))


def case_from_document(data: Json, path: Path) -> CaseRecord:
    """Parse one wrapped case document (as read from, or about to go to, ``path``)."""
    name = _require(data, "name", str, path)
    endpoint = _require(data, "path", str, path)
    if endpoint != COMPLETIONS_PATH:
        raise BundleError(f"bundle case {path} (path {endpoint!r}, expected {COMPLETIONS_PATH!r})")
    status = _require(data, "status", int, path)
    if status != 200:
        raise BundleError(f"bundle case {path} (status {status}, expected 200)")
    request = _require(data, "request", dict, path)
    response = _require(data, "response", dict, path)
    choice = _first_choice(response, path)
    completion = _parse_completion(choice, request, data.get("tokenize_response"), path)
    fingerprint = response.get("system_fingerprint")
    return CaseRecord(
        name=name,
        file=path,
        request=request,
        completion=completion,
        system_fingerprint=fingerprint if isinstance(fingerprint, str) else None,
        teacher=None,
    )


def _first_choice(response: Json, path: Path) -> Json:
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise BundleError(f"bundle case {path} (response.choices[0]: expected an object)")
    return choices[0]


def token_key(token: Any) -> str:
    """The comparison key of a served token: strings as-is, ints as ``token_id:N``."""
    if isinstance(token, int) and not isinstance(token, bool):
        return f"{TOKEN_ID_PREFIX}{token}"
    return str(token)


def _parse_completion(choice: Json, request: Json, tokenize: Any, path: Path) -> Completion:
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        raise BundleError(
            f"bundle case {path} (response.choices[0].logprobs: expected an object; "
            "capture with logprobs=20)"
        )
    tokens = _list_field(logprobs, "tokens", path)
    values = _list_field(logprobs, "token_logprobs", path)
    tops = _list_field(logprobs, "top_logprobs", path)
    where = f"bundle case {path}"
    if not len(tokens) == len(values) == len(tops):
        raise BundleError(
            f"{where} (logprobs: tokens, token_logprobs and top_logprobs have "
            f"{len(tokens)}, {len(values)} and {len(tops)} entries; expected one per step)"
        )
    return Completion(
        tokens=tuple(token_key(t) for t in tokens),
        token_logprobs=tuple(
            None if v is None else logprob(v, f"{where} (logprobs.token_logprobs[{i}]")
            for i, v in enumerate(values)
        ),
        top_logprobs=tuple(
            _parse_top(step, f"{where} (logprobs.top_logprobs[{i}]") for i, step in enumerate(tops)
        ),
        prompt_token_ids=_prompt_ids(request, tokenize, choice),
        token_ids=_completion_ids(choice, tokens),
    )


def _list_field(logprobs: Json, key: str, path: Path) -> list[Any]:
    value = logprobs.get(key)
    if not isinstance(value, list):
        got = repr(value)[:60]
        raise BundleError(f"bundle case {path} (logprobs.{key}: expected a list, got {got})")
    return value


def logprob(value: Any, where: str) -> float:
    """A logprob as read from JSON: a number in ``LOGPROB_RANGE``, or a ``BundleError`` (exit 2).

    NaN compares false with every bound, so one NaN would pass any gate; strings,
    objects, infinities, ``10**400`` and values far above 0 (``exp`` overflows) are
    no logprob either."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # an int past the float range
            number = math.inf
        if LOGPROB_RANGE[0] <= number <= LOGPROB_RANGE[1]:  # False for NaN
            return number
    raise BundleError(
        f"{where}: expected a logprob (a finite number <= 0), got {repr(value)[:60]})"
    )


def _parse_top(step: Any, where: str) -> dict[str, float]:
    if step is None:
        return {}
    if not isinstance(step, dict):
        raise BundleError(f"{where}: expected an object)")
    return {
        token_key(token): logprob(value, f"{where}[{token!r}]") for token, value in step.items()
    }


def _int_list(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return tuple(value)
    return None


def _prompt_ids(request: Json, tokenize: Any, choice: Json) -> tuple[int, ...] | None:
    """Prompt ids, most authoritative first: ids sent, ``/tokenize``, then the response."""
    sent = _int_list(request.get("prompt"))
    if sent:
        return sent
    if isinstance(tokenize, dict):
        ids = _int_list(tokenize.get("tokens")) or _int_list(tokenize.get("token_ids"))
        if ids:
            return ids
    return _int_list(choice.get("prompt_token_ids"))


def _completion_ids(choice: Json, tokens: list[Any]) -> tuple[int, ...] | None:
    """Generated ids from ``token_ids`` or from ``token_id:N`` tokens; None for plain strings."""
    listed = _int_list(choice.get("token_ids"))
    if listed is not None:
        return listed
    keys = [token_key(t) for t in tokens]
    if not all(k.startswith(TOKEN_ID_PREFIX) for k in keys):
        return None
    try:
        return tuple(int(k.removeprefix(TOKEN_ID_PREFIX)) for k in keys)
    except ValueError:
        return None


def _load_teachers(directory: Path) -> dict[str, TeacherScores]:
    scores: dict[str, TeacherScores] = {}
    for path in sorted(directory.glob(f"{TEACHER_PREFIX}*.json")):
        data = load_json_object(path, "teacher-forced case")
        case = _require(data, "case", str, path)
        scores[case] = teacher_from_document(data, path)
    return scores


def teacher_from_document(data: Json, path: Path) -> TeacherScores:
    sequence = _int_list(data.get("sequence"))
    start = data.get("completion_start")
    if sequence is None or not isinstance(start, int):
        raise BundleError(
            f"teacher-forced case {path} (expected int list 'sequence' and int 'completion_start')"
        )
    choice = _first_choice(_require(data, "response", dict, path), path)
    raw = choice.get("prompt_logprobs")
    if not isinstance(raw, list) or len(raw) != len(sequence):
        raise BundleError(
            f"teacher-forced case {path} (response.choices[0].prompt_logprobs: expected a list "
            f"of {len(sequence)} positions)"
        )
    return TeacherScores(
        sequence=sequence,
        completion_start=start,
        positions=tuple(_parse_position(entry, path) for entry in raw),
    )


def _parse_position(entry: Any, path: Path) -> dict[int, float] | None:
    """vLLM's ``prompt_logprobs`` entry: ``{"<id>": {"logprob": x, ...}}`` or None."""
    if entry is None:
        return None
    if not isinstance(entry, dict):
        raise BundleError(f"teacher-forced case {path} (a prompt_logprobs entry is not an object)")
    scores = {}
    for key, value in entry.items():
        where = f"teacher-forced case {path} (prompt_logprobs entry {key!r}"
        try:
            token = int(key)
        except ValueError:
            raise BundleError(f"{where}: expected a token id key)") from None
        scores[token] = logprob(value.get("logprob") if isinstance(value, dict) else value, where)
    return scores


def write_case_file(directory: Path, document: Json) -> Path:
    """Write one wrapped case document as ``<name>.json``; key order is kept as served."""
    path = directory / f"{document['name']}.json"
    write_json_atomic(path, document, sort_keys=False)
    return path


def write_bundle_meta(directory: Path, meta: Json) -> Path:
    path = directory / META_NAME
    write_json_atomic(path, meta, sort_keys=True)
    return path
