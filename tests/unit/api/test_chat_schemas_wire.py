"""The chat endpoints' bytes on the wire, whole: bodies and streams against recorded copies.

Each case runs a real turn on the fake backends and compares the full response body with
the file recorded in `wire/`. Only what differs per request is masked first: the completion
id, the creation time, the trace id, the rewrite's latency and the stage timings' values
(their names and order stay). A change of a key, of key order, of a value or of the framing
fails here.
Set `CHATQNA_RECORD_WIRE=1` to rewrite the recorded copies after an intended change: that
run fails, each case naming the file it wrote; read the diff, then run without it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import BaseModel

from chatqna.api.chat_metadata_schemas import TurnMetadata
from chatqna.api.chat_schemas import ChatCompletion, ChatCompletionChunk
from chatqna.api.sse import encode
from chatqna.backends.bundle import Backends
from chatqna.backends.fakes import ScriptedLLM
from chatqna.settings import Settings
from tests.sse_events import parse_events
from tests.unit.api.conftest import ClientFactory, make_backends

pytestmark = pytest.mark.anyio

WIRE = Path(__file__).parent / "wire"
TWO_TURNS = [
    {"role": "user", "content": "How do I export my data?"},
    {"role": "assistant", "content": "Open Settings and choose Export."},
    {"role": "user", "content": "How long is data kept after cancellation?"},
]
REWRITE = '{"standalone_query": "How long is exported data kept after cancellation?"}'

_MASKS = [
    (re.compile(rb'"id":"chatcmpl-[0-9a-f]{32}"'), b'"id":"chatcmpl-ID"'),
    (re.compile(rb'"created":\d+'), b'"created":0'),
    (re.compile(rb'"trace_id":"[0-9a-f]{32}"'), b'"trace_id":"TRACE"'),
    (re.compile(rb'"latency_ms":[0-9.]+'), b'"latency_ms":0'),
]
_TIMINGS = re.compile(rb'"timings_ms":\{[^}]*\}')
_TIMING_VALUE = re.compile(rb'("[a-z_]+"):[0-9.eE+-]+')


def masked(body: bytes) -> bytes:
    for pattern, replacement in _MASKS:
        body = pattern.sub(replacement, body)
    return _TIMINGS.sub(lambda found: _TIMING_VALUE.sub(rb"\1:0", found.group(0)), body)


def check(name: str, body: bytes) -> None:
    recorded = WIRE / f"{name}.txt"
    body = masked(body)
    if os.environ.get("CHATQNA_RECORD_WIRE") == "1":
        recorded.write_bytes(body)
        # A recording is no check: the run that wrote it fails, so a re-record cannot pass
        # unseen; read the diff, then run again without the variable.
        pytest.fail(f"recorded {recorded.relative_to(WIRE.parent)}: review the diff, rerun")
    assert body == recorded.read_bytes()


def blend_settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={"multi_turn_blend_enabled": True, "multi_turn_bm25_history_weight": 0.3}
    )


async def condense_backends(settings: Settings) -> Backends:
    backends = await make_backends(settings)
    backends.condense_llm = ScriptedLLM(REWRITE, model="rewriter")
    return backends


CASES: list[tuple[str, str, dict[str, Any], str]] = [
    ("chatqna-stream-blend", "/v1/chatqna", {"messages": TWO_TURNS}, "blend"),
    ("chatqna-body-blend", "/v1/chatqna", {"messages": TWO_TURNS, "stream": False}, "blend"),
    ("chatqna-stream-first-turn", "/v1/chatqna", {"messages": "annual refund"}, "blend"),
    ("chatqna-stream-stateless", "/v1/chatqna", {"messages": TWO_TURNS}, "stateless"),
    ("chatqna-stream-condense", "/v1/chatqna", {"messages": TWO_TURNS}, "condense"),
    (
        "chatqna-body-condense-skipped",
        "/v1/chatqna",
        {"messages": "annual refund", "stream": False},
        "condense",
    ),
    ("openai-stream", "/v1/chat/completions", {"messages": TWO_TURNS, "stream": True}, "blend"),
    ("openai-body", "/v1/chat/completions", {"messages": TWO_TURNS}, "blend"),
    ("chatqna-stream-no-reranker", "/v1/chatqna", {"messages": TWO_TURNS}, "no-reranker"),
]


@pytest.mark.parametrize(("name", "path", "body", "mode"), CASES, ids=[c[0] for c in CASES])
async def test_the_wire_is_the_recorded_one(
    client_for: ClientFactory,
    settings: Settings,
    name: str,
    path: str,
    body: dict[str, Any],
    mode: str,
) -> None:
    if mode == "condense":
        chosen = settings.model_copy(update={"multi_turn_mode": "condense"})
        backends = await condense_backends(chosen)
    else:
        chosen = blend_settings(settings) if mode != "stateless" else settings
        backends = await make_backends(chosen)
        if mode == "no-reranker":
            backends.reranker = None
    client = await client_for(backends, chosen)
    response = await client.post(path, json=body)
    assert response.status_code == 200
    check(name, response.content)


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_the_published_models_describe_every_recorded_frame_whole(name: str) -> None:
    # Read back through the response models and written out again, each body and frame is
    # what was sent: no key the models do not declare, none they would add.
    for kind, payload in _payloads((WIRE / f"{name}.txt").read_bytes()):
        model = _MODELS[kind].model_validate_json(payload)
        assert orjson.loads(encode(model)) == orjson.loads(payload), kind


_MODELS: dict[str, type[BaseModel]] = {
    "metadata": TurnMetadata,
    "chunk": ChatCompletionChunk,
    "completion": ChatCompletion,
}


def _payloads(body: bytes) -> list[tuple[str, bytes]]:
    if not body.startswith((b"event:", b"data:")):
        return [("completion", body)]
    found = []
    for event in parse_events(body.decode()):
        if event.data != "[DONE]":
            found.append(
                ("metadata" if event.event == "metadata" else "chunk", event.data.encode())
            )
    return found
