"""Scoring a running ChatQnA service over HTTP, from its `/v1/chatqna` metadata.

The same numbers can then be checked on a deployed stack: each scored turn is sent with
its history (`stream: false`, `k` and `top_n` of the ranking depth, `max_tokens: 1`), and
the ranking is the `source_documents` of the response's metadata. Passages are uploaded
(`--ingest`) as one Markdown file each, named after the passage id, so a source maps back
to it, with the passage title as the document title: the service then indexes the title
line and the passage, as the in-process harness does.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

import httpx

from chatqna.evaluation.dataset import Dataset, EvalTurn, Passage
from chatqna.evaluation.metrics import turn_metrics
from chatqna.evaluation.modes import Mode, ModeResult, QueryPlan, QueryStrategy
from chatqna.evaluation.progress import Progress
from chatqna.evaluation.runner import describe_mode

SUFFIX = ".md"
_HEADING_LINE = re.compile(r"^#", re.MULTILINE)


def passage_filename(passage_id: str) -> str:
    return quote(passage_id, safe="") + SUFFIX


def passage_id_of(source: str) -> str:
    return unquote(source.removesuffix(SUFFIX))


def passage_file(passage: Passage) -> bytes:
    """The passage as Markdown: its title as the `#` title (a passage without one is titled
    by its file name), then its text, with `#` at a line start escaped so no line of the
    passage becomes a heading that would split it."""
    body = _HEADING_LINE.sub(r"\\#", passage.text)
    return (f"# {passage.title}\n\n{body}" if passage.title else body).encode()


async def ingest_corpus(client: httpx.AsyncClient, dataset: Dataset, batch: int = 100) -> None:
    """Upload every passage as its own file, with chunks large enough to keep it whole."""
    passages = list(dataset.passages)
    for start in range(0, len(passages), batch):
        files = [
            ("files", (passage_filename(p.id), passage_file(p), "text/markdown"))
            for p in passages[start : start + batch]
        ]
        response = await client.post(
            "/v1/dataprep/ingest", files=files, data={"chunk_size": "20000", "chunk_overlap": "0"}
        )
        response.raise_for_status()


@dataclass(frozen=True)
class ServiceTurn:
    """What the service did on one scored turn: its ranking (passage ids), or the condense
    failure it answered with, the metadata's `retrieval` report and the milliseconds."""

    ranking: list[str]
    failure: str | None
    retrieval: dict[str, Any] | None
    milliseconds: float

    def plan(self, query: str) -> QueryPlan:
        """The turn as a plan: the query sent, no embedding or LLM of the harness's own."""
        return QueryPlan(query, None, 0, 0, self.milliseconds, self.failure)


async def ask_service(client: httpx.AsyncClient, turn: EvalTurn, depth: int) -> ServiceTurn:
    """One turn with its history (`stream: false`, `k` and `top_n` of the depth,
    `max_tokens: 1`); a 503 `condense_failed` is a failed turn, any other error raises."""
    messages = [m.as_openai() for m in turn.history]
    messages.append({"role": "user", "content": turn.query})
    body = {"messages": messages, "stream": False, "k": depth, "top_n": depth, "max_tokens": 1}
    sent = time.perf_counter()
    response = await client.post("/v1/chatqna", json=body)
    elapsed = (time.perf_counter() - sent) * 1000
    if response.status_code == 503 and response.json().get("error") == "condense_failed":
        return ServiceTurn([], str(response.json().get("reason")), None, elapsed)
    response.raise_for_status()
    metadata = response.json()["metadata"]
    sources = (passage_id_of(doc["source"]) for doc in metadata["source_documents"])
    return ServiceTurn(list(dict.fromkeys(sources)), None, metadata["retrieval"], elapsed)


def service_mode(
    result: ModeResult,
    turns: Sequence[EvalTurn],
    plans: dict[str, QueryPlan],
    retrieval: dict[str, Any],
    url: str,
    samples: int,
) -> dict[str, Any]:
    """The service's one mode, labelled with how the service says it retrieved."""
    mode = describe_mode(result, turns, plans, {}, samples)
    mode["label"] = (
        f"service {url}: {retrieval.get('multi_turn_mode', '?')} | "
        f"{'hybrid' if retrieval.get('hybrid') else 'dense'} | "
        f"{'rerank' if retrieval.get('reranker') else 'no rerank'}"
    )
    mode["hybrid"] = bool(retrieval.get("hybrid"))
    mode["rerank"] = bool(retrieval.get("reranker"))
    mode["service_retrieval"] = retrieval
    return mode


async def run_against_service(
    dataset: Dataset,
    url: str,
    *,
    ingest: bool,
    samples: int,
    depth: int = 10,
    api_key: str | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    turns = dataset.scored_turns
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    started = time.perf_counter()
    reports: list[dict[str, Any]] = []
    plans: dict[str, QueryPlan] = {}
    result = ModeResult(Mode(QueryStrategy("service"), hybrid=True, rerank=True))
    timeout = httpx.Timeout(300, connect=10)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout) as client:
        if ingest:
            await ingest_corpus(client, dataset)
        tick = progress(f"asking {url}", len(turns)) if progress else None
        for turn in turns:
            answered = await ask_service(client, turn, depth)
            if answered.failure is not None:
                result.failures[turn.key] = answered.failure
            if answered.retrieval is not None:
                reports.append(answered.retrieval)
            plans[turn.key] = QueryPlan(
                turn.query, None, 0, 0, answered.milliseconds, answered.failure
            )
            result.rankings[turn.key] = answered.ranking
            result.per_turn[turn.key] = turn_metrics(answered.ranking, turn.relevant_ids)
            if tick:
                tick(1)
    retrieval = reports[0] if reports else {}
    return {
        "dataset": dataset.summary(),
        "depth": depth,
        "bootstrap_samples": samples,
        "seconds": round(time.perf_counter() - started, 1),
        "service": url,
        "modes": [service_mode(result, turns, plans, retrieval, url, samples)],
    }
