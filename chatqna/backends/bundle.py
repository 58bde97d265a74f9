"""`Backends`: the live backends of one running service, one per role, closed together.

`chatqna.composition.build_backends` builds it from `Settings`; the pipeline and the
API only ever see this bundle and the Protocols of `chatqna.backends.protocols`, never a
concrete implementation.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

from chatqna.backends.protocols import ChatLLM, Embedder, Reranker, Retriever
from chatqna.multiturn.translate import HistoryTranslator


async def probe(backend: Any) -> dict[str, Any]:
    """One backend's readiness: its details, or the error that makes it unready (a disabled
    role is ready). Bounded by the backend's own timeout."""
    if backend is None:
        return {"ready": True, "kind": "disabled"}
    try:
        return {"ready": True, **await backend.describe()}
    except Exception as exc:  # readiness reports the failure instead of raising it
        return {"ready": False, "error": str(exc) or type(exc).__name__}


@dataclass
class Backends:
    """The live backends of one running service; closed together at shutdown.

    `rewrite_llm` is the embedded LLM's second server, when it has one: the LLM that
    `condense_llm` (unless `CONDENSE_LLM_ENDPOINT` is set) and the translator then use.

    Concurrent readiness checks share probes: while a role's probe is in flight, another
    `describe()` waits for that probe's answer instead of starting its own, so N load
    balancer checks at once cost each upstream one probe, each bounded by its role's
    timeout. A caller that goes away does not cancel a probe others wait for; the next
    `describe()` after a probe has answered starts a new one (nothing is cached).
    """

    embedder: Embedder
    retriever: Retriever
    reranker: Reranker | None
    llm: ChatLLM
    condense_llm: ChatLLM
    translator: HistoryTranslator | None = None
    rewrite_llm: ChatLLM | None = None
    _probes: dict[str, asyncio.Task[dict[str, Any]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    async def aclose(self) -> None:
        for task in self._probes.values():
            task.cancel()
        seen: set[int] = set()
        llms = (self.condense_llm, self.rewrite_llm, self.llm)
        for backend in (*llms, self.reranker, self.retriever, self.embedder):
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
        if self.rewrite_llm is not None:
            roles["rewrite_llm"] = self.rewrite_llm
        if self.condense_llm is not self.llm and self.condense_llm is not self.rewrite_llm:
            roles["condense_llm"] = self.condense_llm

        results = await asyncio.gather(*(self._shared(r, b) for r, b in roles.items()))
        return dict(zip(roles, results, strict=True))

    async def _shared(self, role: str, backend: Any) -> dict[str, Any]:
        """The answer of the probe of `role` in flight, or of a new one."""
        task = self._probes.get(role)
        if task is None:
            task = asyncio.create_task(probe(backend), name=f"readiness probe: {role}")
            self._probes[role] = task
            task.add_done_callback(lambda done: self._forget(role, done))
        return await asyncio.shield(task)

    def _forget(self, role: str, task: asyncio.Task[dict[str, Any]]) -> None:
        if self._probes.get(role) is task:
            del self._probes[role]
