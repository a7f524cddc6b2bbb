"""Capture: run a prompt suite against a live OpenAI-compatible vLLM server into a bundle.

Greedy ``/v1/completions`` (temperature 0, ``logprobs`` 20) plus ``/tokenize`` for the
prompt ids, with bounded concurrency, a per-request timeout and retries on
connection errors; a progress bar only on a TTY. With ``teacher_forced`` it also
scores a fixed token sequence (prompt plus a completion: its own, or a reference
bundle's) through ``prompt_logprobs``. Everything is checked before the first
request; the bundle format itself lives in ``bundle``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec
from packaging.version import InvalidVersion, Version

from bakery import __version__
from bakery.errors import UsageError
from bakery.progress import step
from bakery.tree import remove_tree, sha256_file, sweep_dead
from bakery.verify.bundle import (
    COMPLETIONS_PATH,
    TEACHER_PREFIX,
    BundleMeta,
    CaseRecord,
    MetaSettings,
    MetaSuite,
    MetaTeacherForced,
    MetaTool,
    case_from_document,
    load_bundle,
    record_name,
    teacher_from_document,
    write_bundle_meta,
    write_case_file,
)
from bakery.verify.errors import BundleError, CaptureError
from bakery.verify.server import (
    CaptureSettings,
    Client,
    batch_choices,
    batch_prompts,
    gather_all,
    resolve_prompt,
)
from bakery.verify.spec_decode import METRICS_PATH, SpecCase, SpecCounts, settled_counts
from bakery.verify.suite import Suite, SuiteCase

__all__ = ["CaptureSettings", "ServerInfo", "capture_bundle", "completion_request"]

GATE_ENV_PREFIX = "DSV41_"

Json = dict[str, Any]
# The server's vLLM version (None: /version gave none) and, if it is odd, a note saying so.
VersionFields = tuple[str | None, str | msgspec.UnsetType]


@dataclass(frozen=True)
class ServerInfo:
    """What is known about how the server was started (recorded in ``bundle.json``)."""

    command: str | None = None
    env: Mapping[str, str] | None = None
    baked_json: Path | None = None


def completion_request(
    model: str,
    prompt: str | list[int] | list[list[int]],
    max_tokens: int,
    settings: CaptureSettings,
) -> Json:
    request: Json = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "logprobs": settings.logprobs,
        # Token strings collide (two ids, one text), which drops top-k entries; ids do not.
        **({"return_tokens_as_token_ids": True} if settings.token_ids else {}),
    }
    return request


@dataclass(frozen=True)
class _CaseResult:
    record: CaseRecord
    unique_sequences: int


class _Capture:
    """One capture run: the client, the destination and what each case needs."""

    def __init__(
        self,
        client: Client,
        out_dir: Path,
        model: str,
        reference: Mapping[str, CaseRecord] | None,
        teacher_forced: bool,
    ) -> None:
        self.client, self.out_dir, self.model = client, out_dir, model
        self.reference, self.teacher_forced = reference, teacher_forced
        # case -> vLLM's speculative-decoding counts of its generation (one request in
        # flight only: with more, a case's difference would hold the others' steps)
        self.spec_decode: dict[str, SpecCase] = {}
        self.no_spec_counts = False

    async def _spec_counts(self) -> SpecCounts | None:
        if self.client.settings.concurrency != 1 or self.no_spec_counts:
            return None
        counts = await settled_counts(lambda: self.client.text(METRICS_PATH, "spec-decode counts"))
        self.no_spec_counts = counts is None  # a server without them never grows them
        return counts

    def _spec_delta(
        self, case: SuiteCase, before: SpecCounts | None, after: SpecCounts | None
    ) -> None:
        if before is not None and after is not None:
            records = tuple(record_name(m) for m in case.members)
            self.spec_decode[case.case] = SpecCase(records, after.minus(before))

    async def case(self, case: SuiteCase) -> list[_CaseResult]:
        """The case's records: one, or one per prompt of a batch."""
        if case.batch_prompt_tokens is not None:
            return await self._batch(case)
        return [await self._single(case)]

    async def _single(self, case: SuiteCase) -> _CaseResult:
        prompt, tok_request, tok_response = await resolve_prompt(self.client, self.model, case)
        request = completion_request(self.model, prompt, case.max_tokens, self.client.settings)
        what = f"case {case.case}"
        before = await self._spec_counts()
        started = time.monotonic()
        response = await self.client.call("POST", COMPLETIONS_PATH, what, request)
        elapsed = round(time.monotonic() - started, 3)
        self._spec_delta(case, before, await self._spec_counts())
        name = record_name(case.case)
        document = {
            "name": name,
            "path": COMPLETIONS_PATH,
            "status": 200,
            "elapsed_seconds": elapsed,
            "request": request,
            "tokenize_request": tok_request,
            "tokenize_response": tok_response,
            "response": response,
        }
        path = self.out_dir / f"{name}.json"
        record = _checked_record(document, path)
        unique = await self._repeat(request, record, what)
        write_case_file(path, document)
        if self.teacher_forced:
            await self._teacher(case.case, record)
        return _CaseResult(record, unique)

    async def _batch(self, case: SuiteCase) -> list[_CaseResult]:
        """One request carrying every prompt of the batch (the server adds them together,
        so they are scheduled together); a record per prompt, each holding its own prompt
        as ``request.prompt``, its choice, and ``batch`` (the case, its index, the size)."""
        prompts, tok_request, tok_response = await batch_prompts(self.client, self.model, case)
        request = completion_request(self.model, prompts, case.max_tokens, self.client.settings)
        what = f"case {case.case}"
        started = time.monotonic()
        sequences: list[set[tuple[str, ...]]] = [set() for _ in prompts]
        first: list[tuple[Path, Json, CaseRecord]] = []  # the first answer's, written below
        before = await self._spec_counts()
        for attempt in range(self.client.settings.repeat):
            response = await self.client.call("POST", COMPLETIONS_PATH, what, request)
            elapsed = round(time.monotonic() - started, 3)
            if attempt == 0:
                self._spec_delta(case, before, await self._spec_counts())
            for i, choice in enumerate(batch_choices(response, len(prompts), what)):
                name = record_name(case.members[i])
                document = {
                    "name": name,
                    "path": COMPLETIONS_PATH,
                    "status": 200,
                    "elapsed_seconds": elapsed,
                    "batch": {"case": case.case, "index": i, "size": len(prompts)},
                    "request": {**request, "prompt": prompts[i]},
                    "tokenize_request": tok_request,
                    "tokenize_response": tok_response,
                    "response": {**response, "choices": [choice]},
                }
                path = self.out_dir / f"{name}.json"
                record = _checked_record(document, path)
                sequences[i].add(record.completion.tokens)
                if attempt == 0:
                    first.append((path, document, record))
        results = []
        for member, (path, document, record), seen in zip(
            case.members, first, sequences, strict=True
        ):
            write_case_file(path, document)
            if self.teacher_forced:
                await self._teacher(member, record)
            results.append(_CaseResult(record, len(seen)))
        return results

    async def _repeat(self, request: Json, record: CaseRecord, what: str) -> int:
        sequences = {record.completion.tokens}
        for _ in range(self.client.settings.repeat - 1):
            again = await self.client.call("POST", COMPLETIONS_PATH, what, request)
            sequences.add(_checked_record(_wrap(request, again), record.file).completion.tokens)
        return len(sequences)

    async def _teacher(self, case: str, own: CaseRecord) -> None:
        source = self.reference[own.name] if self.reference is not None else own
        prompt_ids, output_ids = source.completion.prompt_token_ids, source.completion.token_ids
        if prompt_ids is None or output_ids is None:
            raise CaptureError(
                f"case {case}: teacher forcing needs prompt and output token ids "
                f"({source.file} has none; capture with token ids)"
            )
        sequence = [*prompt_ids, *output_ids]
        request = {
            "model": self.model,
            "prompt": sequence,
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": self.client.settings.logprobs,
            "echo": True,
        }
        response = await self.client.call("POST", COMPLETIONS_PATH, f"case {case}", request)
        name = f"{TEACHER_PREFIX}{case}"
        path = self.out_dir / f"{name}.json"
        document = {
            "name": name,
            "case": own.name,
            "path": COMPLETIONS_PATH,
            "status": 200,
            "scored_from": "self" if self.reference is None else str(source.file.parent),
            "sequence": sequence,
            "completion_start": len(prompt_ids),
            "request": request,
            "response": response,
        }
        try:  # what compare will read back, checked before it is written
            teacher_from_document(document, path)
        except BundleError as exc:
            raise CaptureError(f"server answer is not usable teacher-forced scores: {exc}") from exc
        write_case_file(path, document)


def _wrap(request: Json, response: Json) -> Json:
    return {
        "name": "repeat",
        "path": COMPLETIONS_PATH,
        "status": 200,
        "request": request,
        "response": response,
    }


def _checked_record(document: Json, path: Path) -> CaseRecord:
    """Parse what the server sent with the bundle loader, so a bad answer fails the capture."""
    try:
        return case_from_document(document, path)
    except BundleError as exc:
        raise CaptureError(f"server answer is not a usable completion: {exc}") from exc


async def _model_and_version(
    client: Client, settings: CaptureSettings
) -> tuple[str, VersionFields]:
    model = settings.model
    if model is None:
        models = await client.call("GET", "/v1/models", "model list")
        data = models.get("data")
        if not isinstance(data, list) or not data or not isinstance(data[0], dict):
            raise CaptureError("/v1/models lists no model; pass --model")
        model = str(data[0].get("id"))
    version = await client.call("GET", "/version", "server version")
    return model, _version_fields(version.get("version"))


def _version_fields(raw: Any) -> VersionFields:
    """The server's vLLM version and, where it is none or not PEP 440, a note saying so."""
    if not isinstance(raw, str):
        return None, "/version gave no version string"
    try:
        return str(Version(raw)), msgspec.UNSET
    except InvalidVersion:
        return raw, "not a PEP 440 version"


async def _run(
    url: str,
    out_dir: Path,
    suite: Suite,
    settings: CaptureSettings,
    reference: Mapping[str, CaseRecord] | None,
    teacher_forced: bool,
) -> tuple[str, VersionFields, list[_CaseResult], dict[str, SpecCase]]:
    limits = httpx.Timeout(settings.timeout_s)
    async with httpx.AsyncClient(base_url=url, timeout=limits) as http:
        client = Client(http, settings)
        model, version = await _model_and_version(client, settings)
        capture = _Capture(client, out_dir, model, reference, teacher_forced)
        gate = asyncio.Semaphore(settings.concurrency)
        total = len(suite.cases)
        with step(f"capturing {total} case(s)", total, show=settings.progress) as advance:

            async def one(case: SuiteCase) -> list[_CaseResult]:
                async with gate:
                    result = await capture.case(case)
                advance()
                return result

            results = await gather_all(one(case) for case in suite.cases)
    return model, version, [record for case in results for record in case], capture.spec_decode


def _sha256(path: Path) -> str:
    try:
        return sha256_file(path)
    except OSError as exc:
        raise UsageError(f"cannot read BAKED.json {path} ({exc.strerror})") from exc


def _meta(
    url: str,
    model: str,
    version: VersionFields,
    suite: Suite,
    settings: CaptureSettings,
    server: ServerInfo,
    results: list[_CaseResult],
    reference: Path | None,
    teacher_forced: bool,
    spec_decode: dict[str, SpecCase],
) -> BundleMeta:
    env = server.env if server.env is not None else os.environ
    fingerprints = {r.record.system_fingerprint for r in results if r.record.system_fingerprint}
    return BundleMeta(
        tool=MetaTool("bakery", __version__),
        url=url,
        model=model,
        vllm_version=version[0],
        vllm_version_note=version[1],
        system_fingerprints=tuple(sorted(fingerprints)),
        server_command=server.command,
        dsv41_gates={k: env[k] for k in sorted(env) if k.startswith(GATE_ENV_PREFIX)},
        baked_json_sha256=_sha256(server.baked_json) if server.baked_json else None,
        suite=MetaSuite(name=suite.name, sha256=suite.sha256, cases=len(suite.cases)),
        settings=MetaSettings(
            logprobs=settings.logprobs,
            repeat=settings.repeat,
            token_keys="ids" if settings.token_ids else "strings",
        ),
        repeat_unique_sequences={r.record.name: r.unique_sequences for r in results},
        teacher_forced=MetaTeacherForced(
            enabled=teacher_forced, reference=str(reference) if reference else None
        ),
        spec_decode=dict(sorted(spec_decode.items())) if spec_decode else msgspec.UNSET,
    )


def _check_inputs(
    url: str,
    out_dir: Path,
    suite: Suite,
    settings: CaptureSettings,
    teacher_forced: bool,
    reference: Path | None,
) -> dict[str, CaseRecord] | None:
    """Every check that needs no server, before anything is written or sent."""
    settings.refuse_out_of_range()
    try:
        parsed = httpx.URL(url)
        port = parsed.port  # httpx leaves a port over 65535 to the socket, which overflows
    except httpx.InvalidURL as exc:
        raise UsageError(f"--url is not a URL ({exc}): {url!r}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise UsageError(f"--url must be an http(s) URL with a host, got {url!r}")
    if port is not None and not 0 < port < 65536:
        raise UsageError(f"--url's port must be 1..65535, got {port}")
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out must be a folder for the bundle, not a file: {str(out_dir)!r}")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise UsageError(f"output directory {out_dir} is not empty (pick a new directory)")
    if reference is None:
        if teacher_forced and not settings.token_ids:
            raise UsageError("--teacher-forced needs token ids; drop --token-keys strings")
        return None
    if not teacher_forced:
        raise UsageError("--reference only makes sense with --teacher-forced")
    cases = load_bundle(reference).by_name()
    names = [record_name(member) for c in suite.cases for member in c.members]
    missing = sorted(name for name in names if name not in cases)
    if missing:
        raise BundleError(f"reference bundle {reference} lacks suite cases: {missing}")
    return cases


def capture_bundle(
    url: str,
    out_dir: Path,
    suite: Suite,
    *,
    settings: CaptureSettings | None = None,
    server: ServerInfo | None = None,
    teacher_forced: bool = False,
    reference: Path | None = None,
) -> Path:
    """Capture ``suite`` from the server at ``url`` into the bundle directory ``out_dir``."""
    settings = settings or CaptureSettings()
    out_dir = Path(out_dir)
    ref_cases = _check_inputs(url, out_dir, suite, settings, teacher_forced, reference)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # Capture into a hidden sibling and move it into place at the end, so a failed
    # capture leaves no half bundle that a later compare could mistake for a whole one.
    # Named for this pid (tree.sweep_dead's pattern): a killed capture's is swept here.
    sweep_dead(out_dir.parent)
    staging = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}"
    remove_tree(staging)
    staging.mkdir()
    try:
        model, version, results, spec_decode = asyncio.run(
            _run(url, staging, suite, settings, ref_cases, teacher_forced)
        )
        meta = _meta(
            url,
            model,
            version,
            suite,
            settings,
            server or ServerInfo(),
            results,
            reference,
            teacher_forced,
            spec_decode,
        )
        write_bundle_meta(staging, meta)
        os.replace(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging)
        raise
    return out_dir
