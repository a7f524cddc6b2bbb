"""Talking to the server for a capture: a client that retries connection errors and turns
failures into ``CaptureError``, and the prompts a case sends (text, exact lengths of filler
ids, or a batch of them), tokenised by the server itself."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from bakery.errors import UsageError
from bakery.verify.errors import CaptureError
from bakery.verify.suite import SuiteCase

__all__ = [
    "CaptureSettings",
    "Client",
    "gather_all",
    "resolve_prompt",
    "batch_prompts",
    "batch_choices",
]

# Connection-level failures worth retrying: the request never reached a server that
# answered. Read timeouts are not retried: a greedy request that hangs will hang again.
RETRYABLE = (httpx.NetworkError, httpx.RemoteProtocolError, httpx.ConnectTimeout)

T = TypeVar("T")
Json = dict[str, Any]


@dataclass(frozen=True)
class CaptureSettings:
    """How to talk to the server; none of these change what a correct server answers."""

    concurrency: int = 4
    timeout_s: float = 600.0
    retries: int = 3
    backoff_s: float = 0.5
    logprobs: int = 20
    token_ids: bool = True
    repeat: int = 1
    model: str | None = None
    progress: bool | None = None

    def refuse_out_of_range(self) -> None:
        for name in ("concurrency", "logprobs", "repeat"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name} must be at least 1, got {getattr(self, name)}")
        if self.retries < 0 or self.backoff_s < 0 or not 0 < self.timeout_s <= MAX_TIMEOUT_S:
            raise UsageError(
                f"retries and backoff must be >= 0 and the timeout 0 < s <= {MAX_TIMEOUT_S:g} "
                f"(got timeout {self.timeout_s})"
            )


MAX_TIMEOUT_S = 86400.0  # a day per request: nan and inf are no timeouts


class Client:
    """An httpx client that retries connection errors and turns failures into CaptureError."""

    def __init__(self, http: httpx.AsyncClient, settings: CaptureSettings) -> None:
        self.http = http
        self.settings = settings

    async def call(self, method: str, path: str, what: str, payload: Json | None = None) -> Json:
        return json_body(await self._send(method, path, what, payload), path, what)

    async def text(self, path: str, what: str) -> str | None:
        """A GET's body as text (``/metrics``); None for 404 (a server without it), any
        other status but 200 is a CaptureError."""
        response = await self._send("GET", path, what, None)
        if response.status_code == 404:
            return None
        return _ok(response, path, what).text

    async def _send(
        self, method: str, path: str, what: str, payload: Json | None
    ) -> httpx.Response:
        attempts = self.settings.retries + 1
        for attempt in range(1, attempts + 1):
            try:
                response = await self.http.request(method, path, json=payload)
            except RETRYABLE as exc:
                if attempt == attempts:
                    raise CaptureError(
                        f"{what}: {path} unreachable after {attempts} attempts "
                        f"({type(exc).__name__}: {exc})"
                    ) from exc
                await asyncio.sleep(self.settings.backoff_s * 2 ** (attempt - 1))
            except httpx.TimeoutException as exc:
                raise CaptureError(
                    f"{what}: {path} timed out after {self.settings.timeout_s}s"
                ) from exc
            else:
                return response
        raise CaptureError(f"{what}: {path} was never attempted (retries < 0)")


def _ok(response: httpx.Response, path: str, what: str) -> httpx.Response:
    if response.status_code != 200:
        body = repr(response.text[:200])
        raise CaptureError(f"{what}: HTTP {response.status_code} from {path} ({body})")
    return response


def json_body(response: httpx.Response, path: str, what: str) -> Json:
    _ok(response, path, what)
    try:
        body = response.json()
    except ValueError as exc:
        raise CaptureError(f"{what}: {path} answered with invalid JSON") from exc
    if not isinstance(body, dict):
        raise CaptureError(f"{what}: {path} answered with {type(body).__name__}, not an object")
    return body


async def gather_all(awaitables: Iterable[Awaitable[T]]) -> list[T]:
    """Like gather, but a failure cancels the rest instead of leaving them running."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def tokenize(client: Client, model: str, text: str, what: str) -> tuple[Json, Json]:
    request = {"model": model, "prompt": text}
    response = await client.call("POST", "/tokenize", what, request)
    tokens = response.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise CaptureError(f"{what}: /tokenize answered without an int list 'tokens'")
    return request, response


async def filler_ids(
    client: Client, model: str, filler: str, need: int, what: str
) -> tuple[list[int], Json, Json]:
    """At least ``need`` ids of the filler text repeated, with the ``/tokenize`` exchange."""
    request, response = await tokenize(client, model, filler, what)
    count = len(response["tokens"])
    if 0 < count < need:
        times = need // count + 2
        request, response = await tokenize(client, model, "\n\n".join([filler] * times), what)
    ids = response["tokens"]
    if len(ids) < need:
        raise CaptureError(f"{what}: filler gives {len(ids)} tokens, need {need}")
    return ids, request, response


async def resolve_prompt(
    client: Client, model: str, case: SuiteCase
) -> tuple[str | list[int], Json, Json]:
    """The prompt to send, plus the ``/tokenize`` request and answer that back it."""
    what = f"case {case.case}"
    if case.prompt is not None:
        request, response = await tokenize(client, model, case.prompt, what)
        return case.prompt, request, response
    assert case.filler is not None and case.prompt_tokens is not None  # suite guarantees
    ids, request, response = await filler_ids(client, model, case.filler, case.prompt_tokens, what)
    return ids[: case.prompt_tokens], request, response


BATCH_STRIDE = 7  # prompt i of a batch starts at the filler's id 7 i: no two are equal


async def batch_prompts(
    client: Client, model: str, case: SuiteCase
) -> tuple[list[list[int]], Json, Json]:
    """A batch case's prompts (token ids), plus the ``/tokenize`` exchange behind them."""
    assert case.filler is not None and case.batch_prompt_tokens is not None  # suite guarantees
    lengths = case.batch_prompt_tokens
    need = max(BATCH_STRIDE * i + n for i, n in enumerate(lengths))
    ids, request, response = await filler_ids(client, model, case.filler, need, f"case {case.case}")
    prompts = [ids[BATCH_STRIDE * i : BATCH_STRIDE * i + n] for i, n in enumerate(lengths)]
    return prompts, request, response


def batch_choices(response: Json, size: int, what: str) -> list[Any]:
    """A batch answer's choices in prompt order (each names its prompt by ``index``)."""
    choices = response.get("choices")
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise CaptureError(f"{what}: the batch answer has no list of choices")
    by_index = {c.get("index"): c for c in choices}
    if len(choices) != size or sorted(by_index, key=str) != sorted(range(size), key=str):
        raise CaptureError(
            f"{what}: the batch of {size} prompts came back with choices "
            f"{sorted(map(str, by_index))}, expected one for each index 0..{size - 1}"
        )
    return [by_index[i] for i in range(size)]
