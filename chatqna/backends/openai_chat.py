"""Chat LLM client for OpenAI-compatible servers (vLLM, TGI, llama.cpp): `/v1/chat/completions`.

Whole completions are one JSON body; streamed ones are Server-Sent Events of
`chat.completion.chunk` objects ending with `data: [DONE]`, read with the shared
`chatqna.upstream.sse.SSEDecoder`. Failures become typed errors:
timeouts `UpstreamTimeout`, HTTP statuses and connection failures `UpstreamError`, and any
body that is not the documented shape `BadUpstreamResponse`. Closing the stream early (a
client that disconnects) closes the upstream response, which cancels generation there.

Two bounds: `timeout_seconds` is the longest wait for the first byte and then for each
streamed chunk (a stalled stream), and `generation_timeout_seconds` bounds a whole answer,
so a stream that never ends still does. Generation is never retried: it is not free, and
once tokens have gone out a second answer cannot be spliced onto the first.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
import httpx2
import orjson

from chatqna.backends.protocols import Completion, Delta, GenerationParams, Usage
from chatqna.errors import (
    BadUpstreamResponse,
    ContextTooLong,
    UpstreamError,
    UpstreamFailure,
    UpstreamTimeout,
)
from chatqna.upstream.client import UpstreamClient, without_credentials
from chatqna.upstream.policy import (
    TRANSPORT_FAILURES,
    UPSTREAM_FAILURES,
    HTTPStatusFailure,
    post_json,
    raise_for_status,
    require,
    translate_http_error,
)
from chatqna.upstream.sse import EventTooLarge, SSEDecoder
from chatqna.upstream.types import ResponseTooLarge, StreamReply

COMPLETIONS_PATH = "/v1/chat/completions"
# Servers that close the connection just after a streamed answer, though their headers say
# keep-alive (llama.cpp's, on cpp-httplib): a call sent on it in between fails, so such a
# stream's connection is closed at once instead of read to its end and reused.
CLOSES_AFTER_STREAM = ("llama.cpp",)

# The most body one token of `max_tokens` may bring: a streamed chunk of one token is 150 to
# 400 bytes of JSON and event framing (vLLM, TGI, llama.cpp), its text rarely over 16 bytes
# even escaped; 2 KiB a token, and `ANSWER_OVERHEAD_BYTES` for the rest (the role, finish
# and usage chunks, an object's fields), is several times what a server generating within
# `max_tokens` sends, streamed or whole. An upstream past it ignores `max_tokens`: the
# answer fails as a bad response, a stream instead of growing until its deadline, a whole
# completion while its body is read, before it is parsed (the client's 64 MiB stays the
# outer bound).
BYTES_PER_TOKEN = 2048
ANSWER_OVERHEAD_BYTES = 64 * 1024
# The bound of a request without `max_tokens` (the service always sends one): the most
# tokens its API accepts.
UNBOUNDED_MAX_TOKENS = 32768


def answer_bytes(max_tokens: int | None) -> int:
    """The most body an answer of `max_tokens` may have, streamed or whole."""
    tokens = UNBOUNDED_MAX_TOKENS if max_tokens is None else max_tokens
    return ANSWER_OVERHEAD_BYTES + tokens * BYTES_PER_TOKEN


def base_url_of(endpoint: str) -> str:
    """Accept an endpoint with or without the `/v1` suffix users often include."""
    endpoint = endpoint.rstrip("/")
    return endpoint[: -len("/v1")] if endpoint.endswith("/v1") else endpoint


# Token counts at or above this are no model's (a context of four billion tokens): a count
# that large is a bad response, rather than a number the answer's JSON or a metric cannot
# hold (the sum of two counts near 2**64 passes a 64-bit integer).
MAX_TOKEN_COUNT = 2**32


def _usage(body: dict[str, Any], backend: str) -> Usage:
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return Usage()
    counts = [usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0]
    require(
        all(
            isinstance(n, int) and not isinstance(n, bool) and 0 <= n < MAX_TOKEN_COUNT
            for n in counts
        ),
        backend=backend,
        what=f"usage token counts are not integers from 0 to {MAX_TOKEN_COUNT - 1}",
    )
    return Usage(prompt_tokens=counts[0], completion_tokens=counts[1])


def _finish_reason(choice: dict[str, Any], backend: str) -> str | None:
    """A choice's `finish_reason`: a string, or None while the answer goes on."""
    reason = choice.get("finish_reason")
    require(
        reason is None or isinstance(reason, str),
        backend=backend,
        what="finish_reason is not a string",
    )
    return reason


def merged(deltas: Sequence[Delta]) -> Delta:
    """Deltas that arrived together as one: their texts as `pieces`, the last finish
    reason and usage."""
    pieces = tuple(piece for delta in deltas for piece in delta.texts())
    finish = next((d.finish_reason for d in reversed(deltas) if d.finish_reason), None)
    usage = next((d.usage for d in reversed(deltas) if d.usage is not None), None)
    return Delta(text="".join(pieces), finish_reason=finish, usage=usage, pieces=pieces)


# How OpenAI-compatible servers say a prompt is longer than the model's context window:
# llama.cpp's error type, OpenAI's error code, and the words of vLLM's and TGI's messages.
CONTEXT_ERROR_KINDS = frozenset({"exceed_context_size_error", "context_length_exceeded"})
CONTEXT_ERROR_WORDS = re.compile(
    r"maximum context length|context (?:size|length|window)|tokens \+ `max_new_tokens` must be",
    re.IGNORECASE,
)


def context_overflow(exc: BaseException | None, backend: str) -> ContextTooLong | None:
    """The typed error for an HTTP error answer that says the prompt does not fit the
    model's context window, or None for any other failure."""
    if not isinstance(exc, HTTPStatusFailure) or exc.status not in (400, 413, 422):
        return None
    try:
        body = orjson.loads(exc.body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(body, dict):
        return None
    error = body.get("error")
    fields: dict[str, Any] = error if isinstance(error, dict) else body
    message = fields.get("message", error)
    kinds = {str(fields.get("type")), str(fields.get("code"))}
    if not kinds & CONTEXT_ERROR_KINDS and not (
        isinstance(message, str) and CONTEXT_ERROR_WORDS.search(message)
    ):
        return None
    prompt, context = fields.get("n_prompt_tokens"), fields.get("n_ctx")
    size = (
        f" ({prompt} prompt tokens, a context of {context})"
        if isinstance(prompt, int) and isinstance(context, int)
        else ""
    )
    return ContextTooLong(
        f"{backend}: the prompt is longer than the model's context window{size}. Shorten the "
        "question or the conversation, or ask for fewer passages (top_n)."
    )


class OpenAIChatLLM:
    """A chat model behind an OpenAI-compatible HTTP server; one client for its lifetime."""

    def __init__(
        self,
        endpoint: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout_seconds: float = 120.0,
        connect_timeout_seconds: float = 5.0,
        generation_timeout_seconds: float | None = None,
        backend: str = "llm",
        transport: httpx2.AsyncBaseTransport | None = None,
        proxies_from_env: bool = True,
    ) -> None:
        self.endpoint = without_credentials(base_url_of(endpoint))
        self.model = model
        self.backend = backend
        self.calls = 0
        self._timeout = timeout_seconds
        self._generation_timeout = generation_timeout_seconds
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        self._client = UpstreamClient(
            base_url_of(endpoint),
            timeout_seconds=timeout_seconds,
            connect_timeout_seconds=connect_timeout_seconds,
            headers=headers,
            transport=transport,
            proxies_from_env=proxies_from_env,
        )

    def _payload(
        self, messages: Sequence[dict[str, str]], params: GenerationParams, stream: bool
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {"model": self.model, "messages": list(messages)}
        payload.update(params.to_openai())
        payload["stream"] = stream
        if stream:
            payload["stream_options"] = {"include_usage": True}
        return payload

    async def complete(
        self, messages: Sequence[dict[str, str]], params: GenerationParams
    ) -> Completion:
        self.calls += 1
        try:
            body = await post_json(
                self._client,
                COMPLETIONS_PATH,
                self._payload(messages, params, False),
                backend=self.backend,
                timeout_seconds=self._generation_timeout,
                max_body_bytes=answer_bytes(params.max_tokens),
            )
        except UpstreamError as exc:
            overflow = context_overflow(exc.__cause__, self.backend)
            if overflow is None:
                raise
            raise overflow from exc
        require(isinstance(body, dict), backend=self.backend, what="body is not an object")
        choices = body.get("choices")
        require(
            isinstance(choices, list) and len(choices) > 0 and isinstance(choices[0], dict),
            backend=self.backend,
            what="no choices",
        )
        message = choices[0].get("message")
        require(isinstance(message, dict), backend=self.backend, what="choice without message")
        content = message.get("content")
        require(
            content is None or isinstance(content, str),
            backend=self.backend,
            what="message content is not a string",
        )
        return Completion(
            text=content or "",
            finish_reason=_finish_reason(choices[0], self.backend),
            usage=_usage(body, self.backend),
        )

    async def stream(
        self, messages: Sequence[dict[str, str]], params: GenerationParams
    ) -> AsyncIterator[Delta]:
        self.calls += 1
        payload = self._payload(messages, params, True)
        what = f"POST {COMPLETIONS_PATH} (stream)"
        deadline = (
            None
            if self._generation_timeout is None
            else asyncio.get_running_loop().time() + self._generation_timeout
        )
        response: StreamReply | None = None
        try:
            # The deadline wraps each wait on the upstream, never a `yield`: a timeout must
            # not fire while the consumer holds the generator suspended.
            async with asyncio.timeout_at(deadline):
                response = await self._client.open_stream(COMPLETIONS_PATH, payload)
                if response.status >= 400:
                    raise HTTPStatusFailure(response.status, await response.read())
            decoder = SSEDecoder()
            reads = response.chunks()
            left = answer_bytes(params.max_tokens)
            while True:
                async with asyncio.timeout_at(deadline):
                    read = await anext(reads, None)
                    # Reads that never wait (a fast or flooding upstream) still let the
                    # event loop run other requests, and the deadline fire, between chunks.
                    await asyncio.sleep(0)
                if read is None:
                    raise self._cut_off(decoder)
                left -= len(read)
                if left < 0:
                    raise self._too_long(params.max_tokens)
                delta, done = self._read_deltas(decoder, read)
                if delta is not None:
                    yield delta
                if done:
                    await self._finish(response)
                    return
        except (*TRANSPORT_FAILURES, HTTPStatusFailure, ResponseTooLarge) as exc:
            overflow = context_overflow(exc, self.backend)
            if overflow is not None:
                raise overflow from exc
            raise translate_http_error(exc, backend=self.backend, what=what) from exc
        except TimeoutError as exc:
            raise UpstreamTimeout(
                f"{self.backend}: generation took longer than {self._generation_timeout}s",
                backend=self.backend,
            ) from exc
        finally:
            # Closing the response is what stops generation upstream when our client
            # disconnects (this generator is then closed or cancelled mid-stream).
            if response is not None:
                with anyio.CancelScope(shield=True):
                    await response.aclose()

    def _cut_off(self, decoder: SSEDecoder) -> UpstreamFailure:
        """The failure of a stream whose body ended before its `[DONE]`."""
        if decoder.pending:
            return BadUpstreamResponse(
                f"{self.backend}: stream cut off inside an event", backend=self.backend
            )
        return UpstreamError(f"{self.backend}: stream ended before [DONE]", backend=self.backend)

    def _too_long(self, max_tokens: int | None) -> BadUpstreamResponse:
        return BadUpstreamResponse(
            f"{self.backend}: the stream passed {answer_bytes(max_tokens):,} bytes, more than "
            f"an answer of max_tokens={max_tokens} has",
            backend=self.backend,
        )

    @staticmethod
    async def _finish(response: StreamReply) -> None:
        """The body's end follows `[DONE]` at once: read it, and the connection is reused
        instead of closed, unless its server closes it anyway (`CLOSES_AFTER_STREAM`)."""
        if not response.server.startswith(CLOSES_AFTER_STREAM):
            await response.finish()

    def _read_deltas(self, decoder: SSEDecoder, read: bytes) -> tuple[Delta | None, bool]:
        """The chunks one read completed, as one Delta (one write downstream), and whether
        the stream's `[DONE]` was among them."""
        deltas: list[Delta] = []
        try:
            events = decoder.feed(read)
        except EventTooLarge as exc:
            raise BadUpstreamResponse(f"{self.backend}: {exc}", backend=self.backend) from exc
        for event in events:
            if event.is_done:
                return (merged(deltas) if deltas else None), True
            delta = self._parse_chunk(event.data)
            if delta is not None:
                deltas.append(delta)
        if not deltas:
            return None, False
        return (deltas[0] if len(deltas) == 1 else merged(deltas)), False

    def _parse_chunk(self, data: str) -> Delta | None:
        """One event's data: a `chat.completion.chunk` (or an error object)."""
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise BadUpstreamResponse(
                f"{self.backend}: stream chunk is not JSON", backend=self.backend
            ) from exc
        require(isinstance(chunk, dict), backend=self.backend, what="stream chunk not an object")
        if "error" in chunk:
            raise UpstreamError(f"{self.backend}: error event in stream", backend=self.backend)
        usage = _usage(chunk, self.backend) if isinstance(chunk.get("usage"), dict) else None
        choices = chunk.get("choices")
        require(isinstance(choices, list), backend=self.backend, what="chunk without choices")
        if not choices:
            return Delta(usage=usage) if usage is not None else None
        choice = choices[0]
        require(isinstance(choice, dict), backend=self.backend, what="choice is not an object")
        delta = choice.get("delta") or {}
        require(isinstance(delta, dict), backend=self.backend, what="delta is not an object")
        text = delta.get("content") or ""
        require(isinstance(text, str), backend=self.backend, what="delta content not a string")
        return Delta(text=text, finish_reason=_finish_reason(choice, self.backend), usage=usage)

    async def describe(self) -> dict[str, Any]:
        # Bounded as a whole: each read's timeout alone lets an upstream that trickles
        # bytes, or sends `103`s forever, hold the probe (and a pooled connection) open.
        try:
            async with asyncio.timeout(self._timeout):
                reply = await self._client.get("/v1/models")
            raise_for_status(reply)
        except UPSTREAM_FAILURES as exc:
            raise translate_http_error(exc, backend=self.backend, what="GET /v1/models") from exc
        return {
            "kind": "openai",
            "endpoint": self.endpoint,
            "model": self.model,
            "calls": self.calls,
        }

    async def aclose(self) -> None:
        await self._client.aclose()
