"""Bundles: a directory of captured server answers, read and written at one border.

A bundle is the wrapped format of the real oracle fixtures: one
``completion_<case>.json`` per case (``name``, ``path``, ``status``, ``request``,
``tokenize_response``, ``response``), optional ``teacher_<case>.json`` files with
teacher-forced scores, and an optional ``bundle.json`` describing the server.
Everything past this module sees frozen ``CaseRecord``/``Completion`` values,
never raw JSON; nothing here computes a metric.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import msgspec

from bakery.errors import BakeryError
from bakery.schema import Document, decode, read_json, write_json_atomic
from bakery.verify.errors import BundleError
from bakery.verify.spec_decode import SpecCase

__all__ = [
    "Bundle",
    "CaseRecord",
    "Completion",
    "TeacherScores",
    "CaseDoc",
    "TeacherDoc",
    "BundleMeta",
    "MetaTool",
    "MetaSuite",
    "MetaSettings",
    "MetaTeacherForced",
    "load_bundle",
    "load_json_object",
    "logprob",
    "case_from_document",
    "teacher_from_document",
    "token_key",
    "write_case_file",
    "write_bundle_meta",
    "CASE_PREFIX",
    "record_name",
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


def record_name(case: str) -> str:
    """A suite case's name in a bundle (its file's stem)."""
    return f"{CASE_PREFIX}{case}"


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


# The documents' schema, the one place that knows their shape (bakery.schema decodes it).
# The wrappers are ours (and the oracle fixtures'): every field is declared, unknown ones
# are refused. What sits inside ``response`` is vLLM's OpenAI answer, which grows fields
# between releases, so those Structs declare what is read and let the rest pass.
class _ServerDoc(msgspec.Struct):
    """A piece of the server's answer: typed where read, open to fields added upstream."""


class LogprobsDoc(_ServerDoc):
    tokens: list[str | int]
    # Logprob values stay Any here: ``logprob`` judges each one (NaN, strings, 10**400
    # and values above 0 are all "not a logprob", with the step named).
    token_logprobs: list[Any]
    top_logprobs: list[dict[str, Any] | None]


class ChoiceDoc(_ServerDoc):
    logprobs: LogprobsDoc | None = None  # None when captured without logprobs
    token_ids: Any = None  # ids when the server returns them (read leniently: optional data)
    prompt_token_ids: Any = None
    prompt_logprobs: list[dict[str, Any] | None] | None = None  # teacher forcing


class ResponseDoc(_ServerDoc):
    choices: list[ChoiceDoc]
    system_fingerprint: Any = None


class BatchDoc(Document, frozen=True):
    """Where a record's prompt was sent: prompt ``index`` of one request of ``size``."""

    case: str
    index: int
    size: int


class CaseDoc(Document, frozen=True):
    """``completion_<case>.json``: one question and the server's answer (for a prompt
    of a batch: its own prompt as ``request.prompt``, its choice, and ``batch``)."""

    name: str
    path: str
    status: int
    request: dict[str, Any]
    response: ResponseDoc
    elapsed_seconds: float | None = None
    tokenize_request: Any = None  # what /tokenize was asked, if anything
    tokenize_response: Any = None
    batch: BatchDoc | None = None


class TeacherDoc(Document, frozen=True):
    """``teacher_<case>.json``: the server's scores for a fixed token sequence."""

    sequence: list[int]
    completion_start: int
    response: ResponseDoc
    case: str | None = None  # required in a bundle folder: the case it scores
    name: str | None = None
    path: str | None = None
    status: int | None = None
    scored_from: str | None = None  # "self" or the reference bundle's folder
    request: dict[str, Any] | None = None


class MetaTool(Document, frozen=True):
    name: str
    version: str


class MetaSuite(Document, frozen=True, kw_only=True):
    name: str
    sha256: str
    cases: int


class MetaSettings(Document, frozen=True, kw_only=True):
    logprobs: int
    repeat: int
    token_keys: Literal["ids", "strings"]


class MetaTeacherForced(Document, frozen=True, kw_only=True):
    enabled: bool
    reference: str | None  # the bundle whose token sequences were scored (None: its own)


class BundleMeta(Document, frozen=True, kw_only=True):
    """``bundle.json`` as capture writes it: the server, the suite and the settings.

    Written only: ``load_bundle`` keeps any bundle's metadata as it is (the oracle
    fixtures and bundles of other tools carry their own), for the report to show."""

    tool: MetaTool
    url: str
    model: str
    vllm_version: str | None  # None: /version gave no version string
    vllm_version_note: str | msgspec.UnsetType = msgspec.UNSET  # why it is not PEP 440
    system_fingerprints: tuple[str, ...]
    server_command: str | None
    dsv41_gates: dict[str, str]
    baked_json_sha256: str | None
    suite: MetaSuite
    settings: MetaSettings
    repeat_unique_sequences: dict[str, int]  # case -> distinct sequences over the repeats
    teacher_forced: MetaTeacherForced
    # case -> vLLM's speculative-decoding counts of its generation (bakery.verify.spec_decode);
    # only for a server with drafts, captured one request at a time
    spec_decode: dict[str, SpecCase] | msgspec.UnsetType = msgspec.UNSET


def load_json_object(path: Path, what: str, error: type[BakeryError] = BundleError) -> Json:
    """Read ``path`` as one JSON object or raise ``error`` naming the file and the problem."""
    data = read_json(path, what, error)
    if not isinstance(data, dict):
        got = type(data).__name__
        raise error(
            f"cannot read {what} {path} (expected a JSON object, got {got})",
            hint=f"a {what} is one JSON object ({{...}})",
        )
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


def _load_case(path: Path, teachers: Mapping[str, TeacherScores]) -> CaseRecord:
    record = case_from_document(read_json(path, "bundle case", BundleError), path)
    return replace(record, teacher=teachers.get(record.name))


_HINT = "a bundle is what `bakery verify capture` writes; recapture or fix the named field"


def case_from_document(data: object, path: Path) -> CaseRecord:
    """Parse one wrapped case document (as read from, or about to go to, ``path``)."""
    where = f"bundle case {path}"
    doc = decode(data, CaseDoc, where=where, error=BundleError, hint=_HINT)
    if doc.path != COMPLETIONS_PATH:
        raise BundleError(f"{where} (path {doc.path!r}, expected {COMPLETIONS_PATH!r})", hint=_HINT)
    if doc.status != 200:
        raise BundleError(f"{where} (status {doc.status}, expected 200)", hint=_HINT)
    choice = _first_choice(doc.response, where)
    fingerprint = doc.response.system_fingerprint
    return CaseRecord(
        name=doc.name,
        file=path,
        request=doc.request,
        completion=_parse_completion(choice, doc.request, doc.tokenize_response, where),
        system_fingerprint=fingerprint if isinstance(fingerprint, str) else None,
        teacher=None,
    )


def _first_choice(response: ResponseDoc, where: str) -> ChoiceDoc:
    if not response.choices:
        raise BundleError(f"{where} ($.response.choices: empty, expected one choice)", hint=_HINT)
    return response.choices[0]


def token_key(token: Any) -> str:
    """The comparison key of a served token: strings as-is, ints as ``token_id:N``."""
    if isinstance(token, int) and not isinstance(token, bool):
        return f"{TOKEN_ID_PREFIX}{token}"
    return str(token)


def _parse_completion(choice: ChoiceDoc, request: Json, tokenize: Any, where: str) -> Completion:
    logprobs = choice.logprobs
    if logprobs is None:
        raise BundleError(
            f"{where} (response.choices[0].logprobs: expected an object)",
            hint="capture with logprobs=20 (`bakery verify capture` asks for them)",
        )
    tokens, values, tops = logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs
    if not len(tokens) == len(values) == len(tops):
        raise BundleError(
            f"{where} (logprobs: tokens, token_logprobs and top_logprobs have "
            f"{len(tokens)}, {len(values)} and {len(tops)} entries; expected one per step)",
            hint=_HINT,
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
        f"{where}: expected a logprob (a finite number <= 0), got {repr(value)[:60]})",
        hint=_HINT,
    )


def _parse_top(step: dict[str, Any] | None, where: str) -> dict[str, float]:
    if step is None:
        return {}
    return {
        token_key(token): logprob(value, f"{where}[{token!r}]") for token, value in step.items()
    }


def _int_list(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return tuple(value)
    return None


def _prompt_ids(request: Json, tokenize: Any, choice: ChoiceDoc) -> tuple[int, ...] | None:
    """Prompt ids, most authoritative first: ids sent, ``/tokenize``, then the response."""
    sent = _int_list(request.get("prompt"))
    if sent:
        return sent
    if isinstance(tokenize, dict):
        ids = _int_list(tokenize.get("tokens")) or _int_list(tokenize.get("token_ids"))
        if ids:
            return ids
    return _int_list(choice.prompt_token_ids)


def _completion_ids(choice: ChoiceDoc, tokens: list[str | int]) -> tuple[int, ...] | None:
    """Generated ids from ``token_ids`` or from ``token_id:N`` tokens; None for plain strings."""
    listed = _int_list(choice.token_ids)
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
        doc = _teacher_doc(read_json(path, "teacher-forced case", BundleError), path)
        if doc.case is None:
            raise BundleError(f"teacher-forced case {path}: $.case: missing", hint=_HINT)
        scores[doc.case] = _teacher_scores(doc, path)
    return scores


def _teacher_doc(data: object, path: Path) -> TeacherDoc:
    where = f"teacher-forced case {path}"
    return decode(data, TeacherDoc, where=where, error=BundleError, hint=_HINT)


def teacher_from_document(data: object, path: Path) -> TeacherScores:
    return _teacher_scores(_teacher_doc(data, path), path)


def _teacher_scores(doc: TeacherDoc, path: Path) -> TeacherScores:
    where = f"teacher-forced case {path}"
    raw = _first_choice(doc.response, where).prompt_logprobs
    if raw is None or len(raw) != len(doc.sequence):
        raise BundleError(
            f"{where} (response.choices[0].prompt_logprobs: expected a list "
            f"of {len(doc.sequence)} positions)",
            hint=_HINT,
        )
    return TeacherScores(
        sequence=tuple(doc.sequence),
        completion_start=doc.completion_start,
        positions=tuple(_parse_position(entry, path) for entry in raw),
    )


def _parse_position(entry: dict[str, Any] | None, path: Path) -> dict[int, float] | None:
    """vLLM's ``prompt_logprobs`` entry: ``{"<id>": {"logprob": x, ...}}`` or None."""
    if entry is None:
        return None
    scores = {}
    for key, value in entry.items():
        where = f"teacher-forced case {path} (prompt_logprobs entry {key!r}"
        try:
            token = int(key)
        except ValueError:
            raise BundleError(f"{where}: expected a token id key", hint=_HINT) from None
        scores[token] = logprob(value.get("logprob") if isinstance(value, dict) else value, where)
    return scores


def write_case_file(path: Path, document: Json) -> Path:
    """Write one wrapped case document (to ``<its name>.json``); key order is kept as served."""
    write_json_atomic(path, document, sort_keys=False)
    return path


def write_bundle_meta(directory: Path, meta: BundleMeta) -> Path:
    path = directory / META_NAME
    write_json_atomic(path, meta, sort_keys=True)
    return path
