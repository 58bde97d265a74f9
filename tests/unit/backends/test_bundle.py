"""The live backends: closed once each (a shared LLM too), readiness per role."""

from __future__ import annotations

from typing import Any

import pytest

from chatqna.backends.bundle import Backends
from chatqna.backends.fakes import HashingEmbedder, ScriptedLLM

pytestmark = pytest.mark.anyio


class Closing(ScriptedLLM):
    closed = 0

    async def aclose(self) -> None:
        Closing.closed += 1


class Retriever:
    supports_bm25_history = True

    async def describe(self) -> dict[str, Any]:
        raise RuntimeError("index unavailable")

    async def aclose(self) -> None:
        raise RuntimeError("closing fails: the others still close")


async def test_close_once_each_and_report_readiness() -> None:
    llm = Closing()
    backends = Backends(HashingEmbedder(), Retriever(), None, llm, llm)  # type: ignore[arg-type]
    ready = await backends.describe()
    assert ready["retriever"] == {"ready": False, "error": "index unavailable"}
    assert ready["reranker"] == {"ready": True, "kind": "disabled"}
    assert "condense_llm" not in ready, "the chat LLM also condenses"
    await backends.aclose()
    assert Closing.closed == 1
