"""The embedded llama.cpp LLM, without loading a model: how the in-process server is set up,
that every call goes through the OpenAI client, and that teardown runs off the event loop.

The real model is exercised by the chat-LLM contract suite (`tests/contract/`, slow).
"""

from __future__ import annotations

import json
import sys
import threading
import types
from pathlib import Path
from typing import Any

import httpx2
import pytest

from chatqna.backends import local_llm
from chatqna.backends.local_llm import LlamaCppLLM
from chatqna.backends.openai_chat import OpenAIChatLLM
from chatqna.backends.protocols import ChatLLM, GenerationParams
from chatqna.errors import StartupFailed

pytestmark = pytest.mark.anyio

ADDRESS = "http://127.0.0.1:39999"
GGUF = Path("tiny-model.gguf")
MESSAGES = [{"role": "user", "content": "Hi"}]


class FakeServer:
    """Stands in for `xllamacpp.Server`; records the thread that destroys it."""

    def __init__(self, destroyed_on: list[threading.Thread]) -> None:
        self.listening_address = ADDRESS
        self._destroyed_on = destroyed_on

    def __del__(self) -> None:
        self._destroyed_on.append(threading.current_thread())


def openai_server(request: httpx2.Request) -> httpx2.Response:
    """The parts of llama.cpp's OpenAI-compatible server the client uses."""
    if request.url.path == "/v1/models":
        return httpx2.Response(200, json={"object": "list", "data": [{"id": GGUF.name}]})
    body = json.loads(request.content)
    if body["stream"]:
        chunks = [
            {"choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}]},
            {"choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]},
        ]
        text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx2.Response(200, text=text, headers={"content-type": "text/event-stream"})
    return httpx2.Response(
        200,
        json={
            "choices": [{"message": {"content": "Hello"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1},
        },
    )


def llm_on(server: Any) -> LlamaCppLLM:
    client = OpenAIChatLLM(ADDRESS, GGUF.name, transport=httpx2.MockTransport(openai_server))
    return LlamaCppLLM(client, server, GGUF)


async def test_it_is_a_chat_llm_named_after_its_gguf() -> None:
    llm = llm_on(FakeServer([]))
    assert isinstance(llm, ChatLLM)
    assert llm.model == "tiny-model.gguf"
    await llm.aclose()


async def test_complete_and_stream_go_through_the_openai_client() -> None:
    llm = llm_on(FakeServer([]))
    completion = await llm.complete(MESSAGES, GenerationParams(max_tokens=4))
    pieces = [delta.text async for delta in llm.stream(MESSAGES, GenerationParams())]
    assert completion.text == "Hello" and completion.usage.completion_tokens == 1
    assert "".join(pieces) == "Hello"
    assert llm.calls == 2
    await llm.aclose()


async def test_describe_names_the_runtime_and_the_model_file() -> None:
    llm = llm_on(FakeServer([]))
    details = await llm.describe()
    assert details["kind"] == "embedded"
    assert details["runtime"] == "llama.cpp" and details["gguf"] == "tiny-model.gguf"
    await llm.aclose()


async def test_aclose_destroys_the_server_in_a_worker_thread() -> None:
    """llama.cpp's destructor joins its threads: it must not run on the event loop."""
    destroyed_on: list[threading.Thread] = []
    llm = llm_on(FakeServer(destroyed_on))
    await llm.aclose()
    assert len(destroyed_on) == 1
    assert destroyed_on[0] is not threading.current_thread()


async def test_start_loads_in_a_worker_thread_with_a_fresh_key_each_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[threading.Thread, Path, int, int | None, str]] = []
    destroyed_on: list[threading.Thread] = []

    def fake_start(gguf: Path, context: int, threads: int | None, api_key: str) -> FakeServer:
        calls.append((threading.current_thread(), gguf, context, threads, api_key))
        return FakeServer(destroyed_on)

    monkeypatch.setattr(local_llm, "_start_server", fake_start)
    first = await LlamaCppLLM.start(GGUF, context=2048, threads=2)
    second = await LlamaCppLLM.start(GGUF)
    assert [call[0] is threading.current_thread() for call in calls] == [False, False]
    assert calls[0][1:4] == (GGUF, 2048, 2) and calls[1][1:4] == (GGUF, 4096, None)
    keys = [call[4] for call in calls]
    assert keys[0] != keys[1] and min(len(key) for key in keys) >= 32
    await first.aclose()
    await second.aclose()
    assert len(destroyed_on) == 2


async def test_start_names_the_server_in_its_client_s_errors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The embedded LLM's second server (rewrites, translations) says so in its errors."""
    clients: list[dict[str, Any]] = []

    def client(endpoint: str, model: str, **options: Any) -> OpenAIChatLLM:
        clients.append(options)
        return OpenAIChatLLM(endpoint, model, transport=httpx2.MockTransport(openai_server))

    monkeypatch.setattr(local_llm, "_start_server", lambda *args: FakeServer([]))
    monkeypatch.setattr(local_llm, "OpenAIChatLLM", client)
    chat = await LlamaCppLLM.start(GGUF)
    rewrites = await LlamaCppLLM.start(GGUF, backend="rewrite_llm")
    assert [options["backend"] for options in clients] == ["llm", "rewrite_llm"]
    await chat.aclose()
    await rewrites.aclose()


def fake_xllamacpp(servers: list[Any]) -> types.ModuleType:
    """A module with the two names `_start_server` uses; `Server` records its params."""

    class Namespace:
        pass

    def common_params() -> Any:
        params = Namespace()
        params.model = Namespace()  # type: ignore[attr-defined]
        params.cpuparams = Namespace()  # type: ignore[attr-defined]
        params.cpuparams_batch = Namespace()  # type: ignore[attr-defined]
        return params

    module = types.ModuleType("xllamacpp")
    module.CommonParams = common_params  # type: ignore[attr-defined]
    module.Server = lambda params: servers.append(params) or params  # type: ignore[attr-defined]
    return module


def test_the_server_listens_on_loopback_only_behind_the_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    servers: list[Any] = []
    monkeypatch.setitem(sys.modules, "xllamacpp", fake_xllamacpp(servers))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    local_llm._start_server(gguf, 1024, 3, "secret-key")
    (params,) = servers
    assert params.hostnames == ["127.0.0.1"] and params.port == 0
    assert params.api_keys == ["secret-key"]
    assert params.model.path == str(gguf) and params.n_ctx == 1024
    assert params.cpuparams.n_threads == 3 and params.cpuparams_batch.n_threads == 3


def test_a_missing_gguf_fails_before_llama_cpp_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    servers: list[Any] = []
    monkeypatch.setitem(sys.modules, "xllamacpp", fake_xllamacpp(servers))
    with pytest.raises(FileNotFoundError, match="CHATQNA_LLM_GGUF"):
        local_llm._start_server(tmp_path / "absent.gguf", 1024, None, "key")
    assert servers == []


def test_a_file_llama_cpp_cannot_load_is_named_with_its_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    module = fake_xllamacpp([])

    def refuse(params: Any) -> Any:
        raise RuntimeError("Failed to init server, please check the input params.")

    module.Server = refuse  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "xllamacpp", module)
    notes = tmp_path / "README.md"
    notes.write_text("# not a model")
    with pytest.raises(StartupFailed) as raised:
        local_llm._start_server(notes, 1024, None, "key")
    assert str(raised.value) == f"CHATQNA_LLM_GGUF: {notes} is not a loadable GGUF file"
