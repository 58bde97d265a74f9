"""`Backends`: the live backends of one running service, one per role, closed together.

`chatqna.composition.build_backends` builds it from `Settings`; the pipeline and the
API only ever see this bundle and the Protocols of `chatqna.backends.protocols`, never a
concrete implementation.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from chatqna.backends.protocols import ChatLLM, Embedder, Reranker, Retriever
from chatqna.multiturn.translate import HistoryTranslator


@dataclass
class Backends:
    """The live backends of one running service; closed together at shutdown."""

    embedder: Embedder
    retriever: Retriever
    reranker: Reranker | None
    llm: ChatLLM
    condense_llm: ChatLLM
    translator: HistoryTranslator | None = None

    async def aclose(self) -> None:
        seen: set[int] = set()
        for backend in (self.condense_llm, self.llm, self.reranker, self.retriever, self.embedder):
            if backend is None or id(backend) in seen:
                continue
            seen.add(id(backend))
            with contextlib.suppress(Exception):
                await backend.aclose()

    async def describe(self) -> dict[str, Any]:
        """Each backend's readiness: its details, or the error that makes it unready."""
        roles: dict[str, Any] = {
            "embedder": self.embedder,
            "retriever": self.retriever,
            "reranker": self.reranker,
            "llm": self.llm,
        }
        if self.condense_llm is not self.llm:
            roles["condense_llm"] = self.condense_llm

        async def one(backend: Any) -> dict[str, Any]:
            if backend is None:
                return {"ready": True, "kind": "disabled"}
            try:
                return {"ready": True, **await backend.describe()}
            except Exception as exc:  # readiness reports the failure instead of raising it
                return {"ready": False, "error": str(exc) or type(exc).__name__}

        results = await asyncio.gather(*(one(b) for b in roles.values()))
        return dict(zip(roles, results, strict=True))
