"""`NoLLM`: the chat LLM of a service that has none (the retriever service).

The retriever service serves retrieval and dataprep only, but the `Backends` bundle has a
chat LLM role; this one fills it, and every call to it fails with `NotSupported` (501).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from chatqna.backends.protocols import Completion, Delta, GenerationParams
from chatqna.errors import NotSupported

NO_LLM = "this service has no chat LLM"


class NoLLM:
    """The chat LLM of a service that has none: every call fails."""

    model = "none"

    async def complete(
        self, messages: Sequence[dict[str, str]], params: GenerationParams
    ) -> Completion:
        raise NotSupported(NO_LLM)

    def stream(
        self, messages: Sequence[dict[str, str]], params: GenerationParams
    ) -> AsyncIterator[Delta]:
        raise NotSupported(NO_LLM)

    async def describe(self) -> dict[str, Any]:
        return {"kind": "none"}

    async def aclose(self) -> None:
        return None
