"""Scoring a running ChatQnA service over HTTP, from its `/v1/chatqna` metadata.

The same numbers can then be checked on a deployed stack: each scored turn is sent with
its history (`stream: false`, `k` and `top_n` of the ranking depth, `max_tokens: 1`), and
the ranking is the `source_documents` of the response's metadata. Passages are uploaded
(`--ingest`) as one file each, named after the passage id, so a source maps back to it.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote, unquote

import httpx

from chatqna.evaluation.dataset import Dataset
from chatqna.evaluation.metrics import turn_metrics
from chatqna.evaluation.modes import Mode, ModeResult, QueryPlan, QueryStrategy
from chatqna.evaluation.runner import describe_mode

SUFFIX = ".txt"


def passage_filename(passage_id: str) -> str:
    return quote(passage_id, safe="") + SUFFIX


def passage_id_of(source: str) -> str:
    return unquote(source.removesuffix(SUFFIX))


async def ingest_corpus(client: httpx.AsyncClient, dataset: Dataset, batch: int = 100) -> None:
    """Upload every passage as its own file, with chunks large enough to keep it whole."""
    passages = list(dataset.passages)
    for start in range(0, len(passages), batch):
        files = [
            ("files", (passage_filename(p.id), p.indexed_text().encode(), "text/plain"))
            for p in passages[start : start + batch]
        ]
        response = await client.post(
            "/v1/dataprep/ingest", files=files, data={"chunk_size": "20000", "chunk_overlap": "0"}
        )
        response.raise_for_status()


async def run_against_service(
    dataset: Dataset,
    url: str,
    *,
    ingest: bool,
    samples: int,
    depth: int = 10,
    api_key: str | None = None,
) -> dict[str, Any]:
    turns = dataset.scored_turns
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    started = time.perf_counter()
    reports: list[dict[str, Any]] = []
    plans: dict[str, QueryPlan] = {}
    async with httpx.AsyncClient(
        base_url=url, headers=headers, timeout=httpx.Timeout(300, connect=10)
    ) as client:
        if ingest:
            await ingest_corpus(client, dataset)
        result = ModeResult(Mode(QueryStrategy("service"), hybrid=True, rerank=True))
        for turn in turns:
            messages = [m.as_openai() for m in turn.history]
            messages.append({"role": "user", "content": turn.query})
            sent = time.perf_counter()
            response = await client.post(
                "/v1/chatqna",
                json={
                    "messages": messages,
                    "stream": False,
                    "k": depth,
                    "top_n": depth,
                    "max_tokens": 1,
                },
            )
            elapsed = (time.perf_counter() - sent) * 1000
            ranking: list[str] = []
            failure = None
            if response.status_code == 503 and response.json().get("error") == "condense_failed":
                failure = str(response.json().get("reason"))
                result.failures[turn.key] = failure
            else:
                response.raise_for_status()
                metadata = response.json()["metadata"]
                reports.append(metadata["retrieval"])
                ranking = list(
                    dict.fromkeys(
                        passage_id_of(doc["source"]) for doc in metadata["source_documents"]
                    )
                )
            plans[turn.key] = QueryPlan(turn.query, None, 0, 0, elapsed, failure)
            result.rankings[turn.key] = ranking
            result.per_turn[turn.key] = turn_metrics(ranking, turn.relevant_ids)
    retrieval = reports[0] if reports else {}
    mode = describe_mode(result, turns, plans, {}, samples)
    mode["label"] = (
        f"service {url}: {retrieval.get('multi_turn_mode', '?')} | "
        f"{'hybrid' if retrieval.get('hybrid') else 'dense'} | "
        f"{'rerank' if retrieval.get('reranker') else 'no rerank'}"
    )
    mode["hybrid"] = bool(retrieval.get("hybrid"))
    mode["rerank"] = bool(retrieval.get("reranker"))
    mode["service_retrieval"] = retrieval
    return {
        "dataset": dataset.summary(),
        "depth": depth,
        "bootstrap_samples": samples,
        "seconds": round(time.perf_counter() - started, 1),
        "service": url,
        "modes": [mode],
    }
