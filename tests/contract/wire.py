"""Stand-in upstreams on `httpx2.MockTransport`, speaking each one's documented wire format.

- TEI `POST /v1/embeddings` (OpenAI's embeddings shape) and `POST /rerank`
  (`[{"index", "score"}]`, best first), `GET /health`, and `GET /info` naming the model
  served (`model_id`, with the rest of TEI's `Info`);
- an OpenAI-compatible `POST /v1/chat/completions`, whole or streamed as
  `chat.completion.chunk` events ending with `data: [DONE]`, and `GET /v1/models`.

Their "model" is bag-of-words feature hashing (`HashingEmbedder.vector`), so texts that
share words are close, and the chat model answers a fixed sentence cut to `max_tokens`
words: enough for the contract cases to hold for a reason.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
import numpy as np

from chatqna.backends.fakes import HashingEmbedder
from tests.standins.servers import tei_info

DIMENSION = 64
# TEI's `GET /info`, in the shape of its `Info` schema.
INFO = {**tei_info("contract/feature-hashing"), "version": "contract"}
REPLY = "Refunds for annual plans are paid within thirty days of the request"
_HASHING = HashingEmbedder(DIMENSION)


def _unit(text: str) -> np.ndarray:
    vector = _HASHING.vector(text)
    return vector / max(float(np.linalg.norm(vector)), 1e-9)


def tei(request: httpx2.Request) -> httpx2.Response:
    """TEI's embeddings, rerank, health and info routes."""
    if request.url.path == "/health":
        return httpx2.Response(200)
    if request.url.path == "/info":
        return httpx2.Response(200, json=INFO)
    body = json.loads(request.content)
    if request.url.path == "/v1/embeddings":
        texts = [body["input"]] if isinstance(body["input"], str) else body["input"]
        data = [
            {"object": "embedding", "index": i, "embedding": (2.0 * _HASHING.vector(t)).tolist()}
            for i, t in enumerate(texts)
        ]
        return httpx2.Response(200, json={"object": "list", "data": data, "model": "hashing"})
    if request.url.path == "/rerank":
        query = _unit(body["query"])
        scores = [float(_unit(text) @ query) for text in body["texts"]]
        ranked = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)
        return httpx2.Response(200, json=[{"index": i, "score": scores[i]} for i in ranked])
    return httpx2.Response(404, json={"error": "no such route"})


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
    body = {
        "id": "chatcmpl-contract",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "contract-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }
    return f"data: {json.dumps(body)}\n\n"


# The longest prompt (characters of all messages) the stand-in chat server accepts.
CONTEXT_CHARS = 8192


def openai_chat(request: httpx2.Request) -> httpx2.Response:
    """An OpenAI-compatible chat server whose answer is `REPLY` cut to `max_tokens` words; a
    prompt over `CONTEXT_CHARS` is refused as beyond the model's context."""
    if request.url.path == "/v1/models":
        return httpx2.Response(200, json={"object": "list", "data": [{"id": "contract-model"}]})
    body = json.loads(request.content)
    prompt_chars = sum(len(m["content"]) for m in body["messages"])
    if prompt_chars > CONTEXT_CHARS:  # refused as llama.cpp's server refuses it
        error = {
            "code": 400,
            "message": "the request exceeds the available context size, try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": prompt_chars // 4,
            "n_ctx": CONTEXT_CHARS // 4,
        }
        return httpx2.Response(400, json={"error": error})
    words = REPLY.split()
    limit = body.get("max_tokens") or len(words)
    kept = words[:limit]
    finish = "length" if limit < len(words) else "stop"
    usage = {"prompt_tokens": 9, "completion_tokens": len(kept), "total_tokens": 9 + len(kept)}
    if not body.get("stream"):
        message = {"role": "assistant", "content": " ".join(kept)}
        choice = {"index": 0, "message": message, "finish_reason": finish}
        return httpx2.Response(200, json={"choices": [choice], "usage": usage})
    pieces = [word if i == 0 else " " + word for i, word in enumerate(kept)]
    text = _chunk({"role": "assistant"}) + "".join(_chunk({"content": p}) for p in pieces)
    text += _chunk({}, finish) + f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
    text += "data: [DONE]\n\n"
    return httpx2.Response(200, text=text, headers={"content-type": "text/event-stream"})
