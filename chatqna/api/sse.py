"""Server-Sent Events framing for the chat stream.

The stream is: `event: metadata` (sources and how retrieval ran), one `data: {json}` per
token in OpenAI's `chat.completion.chunk` shape, then `data: [DONE]`. An error after the
stream has started is `event: error` with the error envelope, then `data: [DONE]`.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

DONE = "data: [DONE]\n\n"


def event(name: str, data: Any) -> str:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def data(payload: Any) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


class ChunkWriter:
    """Builds OpenAI `chat.completion.chunk` objects that share one id and timestamp."""

    def __init__(self, model: str) -> None:
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model

    def chunk(
        self, delta: dict[str, Any], finish_reason: str | None = None, **extra: Any
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }
        body.update(extra)
        return body

    def completion(
        self, text: str, finish_reason: str | None, usage: dict[str, int], **extra: Any
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": finish_reason or "stop",
                }
            ],
            "usage": usage,
        }
        body.update(extra)
        return body
