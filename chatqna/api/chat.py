"""Chat endpoints: `POST /v1/chatqna` (OPEA's contract) and `POST /v1/chat/completions` (OpenAI's).

Both run the same pipeline. `/v1/chatqna` streams by default and opens its stream with an
`event: metadata` carrying `source_documents`; `/v1/chat/completions` follows OpenAI's
defaults (not streamed unless asked) and carries the same metadata as an extra `metadata`
field of the completion (or of the first chunk), which OpenAI clients ignore.

How many chats run at once is bounded by `chatqna.api.guards` (on `CHAT_PATHS`); a client
that disconnects mid-stream closes the answer's generators, which cancels the upstream call;
one that disconnects before its stream starts, or while a completion that is not streamed is
generated, has its turn cancelled (`chatqna.api.disconnects`). Either way the request is
counted as 499, and a turn stopped for it ends its spans as one its client left, not failed.
One that stops reading a streamed answer without leaving has it stopped at the answer's
deadline (`sse.with_pings`), its spans marked as stalled by the client, not failed.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from chatqna.api import sse
from chatqna.api.chat_metadata_schemas import TurnMetadata
from chatqna.api.chat_schemas import (
    CHAT_RESPONSE,
    ChatQnARequest,
    ChunkDelta,
    ModelCard,
    ModelList,
    OpenAIChatRequest,
)
from chatqna.api.deps import ServiceState, State, require_api_key
from chatqna.api.disconnects import CLIENT_CLOSED_REQUEST, ClientDisconnected, while_connected
from chatqna.api.error_schemas import ANY_ROUTE, error_responses
from chatqna.api.errors import error_reply
from chatqna.api.guards import require_json_body
from chatqna.backends.protocols import GenerationParams
from chatqna.errors import (
    ChatQnAError,
    ClientStalled,
    InvalidRequest,
    PayloadTooLarge,
    UpstreamFailure,
)
from chatqna.multiturn.history import Message, shortened
from chatqna.pipeline.turn import Turn, TurnOptions
from chatqna.settings import Settings

logger = logging.getLogger(__name__)
router = APIRouter(
    dependencies=[Depends(require_api_key)],
    tags=["chat"],
    responses=error_responses(401, *ANY_ROUTE),
)
# What a chat turn can answer besides the router-wide 401, 413 and 500.
CHAT_RESPONSES = {
    200: CHAT_RESPONSE,
    **error_responses(400, 403, 408, 415, 422, 429, 502, 503, 504),
}

STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
CHAT_PATHS = frozenset({"/v1/chatqna", "/v1/chat/completions"})


def _checked_messages(body: ChatQnARequest, settings: Settings) -> list[Message]:
    """The request's conversation, within `CHATQNA_MAX_MESSAGES` and
    `CHATQNA_MAX_MESSAGE_CHARS`.

    The character limit refuses what a user (or a client's system prompt) wrote. An
    assistant message over it is one of this service's own answers sent back as history (an
    answer of `LLM_MAX_TOKENS_LIMIT` tokens can be longer): refusing it would fail every
    later turn of the chat, and history only needs an answer's start, so it is shortened.
    The whole body stays bounded by `CHATQNA_MAX_REQUEST_BYTES`."""
    messages = body.chat_messages()
    limit = settings.chatqna_max_message_chars
    if len(messages) > settings.chatqna_max_messages:
        raise PayloadTooLarge(
            f"{len(messages)} messages exceed the limit of {settings.chatqna_max_messages} "
            "(CHATQNA_MAX_MESSAGES)"
        )
    for position, message in enumerate(messages):
        if len(message.content) <= limit:
            continue
        if message.role == "assistant":
            messages[position] = shortened(message, limit)
            continue
        raise PayloadTooLarge(
            f"message {position} has {len(message.content)} characters, beyond the limit "
            f"of {limit} (CHATQNA_MAX_MESSAGE_CHARS)"
        )
    return messages


def _checked_params(body: ChatQnARequest, settings: Settings) -> GenerationParams:
    """The request's sampling, its `max_tokens` within `LLM_MAX_TOKENS_LIMIT`.

    An answer holds its LLM server (an embedded one has a single slot) for its whole length,
    so one request asking for a very long answer would make other users' answers wait and
    time out: it is refused before anything runs, rather than cut short.
    """
    limit = settings.llm_max_tokens_limit
    if body.max_tokens is not None and body.max_tokens > limit:
        raise InvalidRequest(
            f"max_tokens {body.max_tokens} is beyond the limit of {limit} (LLM_MAX_TOKENS_LIMIT)",
            details=[{"field": "max_tokens", "message": f"must be at most {limit}"}],
        )
    return body.generation_params(settings.llm_max_tokens)


async def _prepare(body: ChatQnARequest, state: ServiceState) -> Turn:
    settings = state.settings
    messages = _checked_messages(body, settings)
    options = TurnOptions.from_settings(
        settings, k=body.k, top_n=body.top_n, params=_checked_params(body, settings)
    )
    return await state.pipeline.prepare(messages, options)


def _error_event(exc: BaseException, path: str) -> bytes:
    """The `event: error` a stream ends with once its status went out: the envelope a
    response would have carried (`error_reply`, which logs as it does for a response)."""
    return sse.event("error", error_reply(exc, path).envelope)


async def _event_stream(
    turn: Turn, writer: sse.ChunkWriter, metadata_event: bool, deadline_seconds: float, path: str
) -> AsyncIterator[bytes]:
    async with turn:
        try:
            metadata = TurnMetadata.of(turn.record())
            # Frames that go out together are one send (fewer trips through every middleware).
            if metadata_event:
                opening = sse.event("metadata", metadata) + sse.data(writer.chunk(writer.opening()))
            else:
                opening = sse.data(writer.chunk(writer.opening(), metadata=metadata))
        except Exception as exc:  # the status is sent already: the stream ends as documented
            turn.error = exc  # the turn's span ends as failed
            yield _error_event(exc, path) + sse.DONE
            return
        yield opening
        finish: str | None = None
        answer = sse.with_pings(
            turn.stream(), sse.KEEPALIVE_SECONDS, deadline_seconds, turn.client_stalled
        )
        async with sse.closing(answer) as deltas:
            try:
                async for delta in deltas:
                    if delta is None:  # the next token is slow to come
                        yield sse.PING
                        continue
                    # One chunk per piece the upstream sent; the pieces of one read in one write.
                    pieces = delta.texts()
                    if len(pieces) == 1:
                        yield writer.content_frame(pieces[0])
                    elif pieces:
                        yield b"".join(writer.content_frame(piece) for piece in pieces)
                    finish = delta.finish_reason or finish
                ending = sse.data(writer.chunk(ChunkDelta(), finish or "stop"))
            except ClientStalled as exc:  # sent in case the client reads on
                logger.info("the client stopped reading its answer: %s", exc.message)
                ending = _error_event(exc, path)
            except Exception as exc:
                if isinstance(exc, ChatQnAError) and not isinstance(exc, UpstreamFailure):
                    # A cut answer is worth a line even where a refused request is not.
                    logger.warning("stream failed after it started: %s", exc.message)
                ending = _error_event(exc, path)
    yield ending + sse.DONE


async def _answer(turn: Turn) -> Any:
    async with turn:
        return await turn.complete()


async def _respond(
    body: ChatQnARequest, state: ServiceState, request: Request, metadata_event: bool
) -> Any:
    receive = request.receive
    try:
        turn = await while_connected(receive, _prepare(body, state))
        writer = sse.ChunkWriter(state.backends.llm.model)
        if body.stream:
            return sse.EventStreamResponse(
                _event_stream(
                    turn,
                    writer,
                    metadata_event,
                    state.settings.llm_generation_timeout_seconds,
                    request.url.path,
                ),
                headers=STREAM_HEADERS,
                on_close=turn.close,
                on_client_left=turn.client_left,
            )
        completion = await while_connected(receive, _answer(turn), on_leave=turn.client_left)
    except ClientDisconnected:
        logger.info("the client left before its answer was ready: the turn was stopped")
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    answer = writer.completion(completion, metadata=TurnMetadata.of(turn.record()))
    return Response(sse.encode(answer), media_type="application/json")


@router.post(
    "/v1/chatqna",
    summary="Answer a (multi-turn) question from the knowledge base",
    responses=CHAT_RESPONSES,
    dependencies=[Depends(require_json_body)],
)
async def chatqna(body: ChatQnARequest, state: State, request: Request) -> Any:
    return await _respond(body, state, request, metadata_event=True)


@router.post(
    "/v1/chat/completions",
    summary="OpenAI-compatible chat completions with RAG",
    responses=CHAT_RESPONSES,
    dependencies=[Depends(require_json_body)],
)
async def chat_completions(body: OpenAIChatRequest, state: State, request: Request) -> Any:
    return await _respond(body, state, request, metadata_event=False)


@router.get(
    "/v1/models",
    summary="The model this service answers with (OpenAI-compatible)",
    response_model=ModelList,
)
async def models(state: State) -> ModelList:
    card = ModelCard(id=state.backends.llm.model, object="model", owned_by="chatqna")
    return ModelList(object="list", data=[card])
