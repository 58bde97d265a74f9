"""Scoring a running ChatQnA service over HTTP, from its `/v1/chatqna` metadata.

The same numbers can then be checked on a deployed stack: each scored turn is sent with
its history (`stream: false`, `k` and `top_n` of the ranking depth, `max_tokens: 1`), and
the ranking is the `source_documents` of the response's metadata. Passages are uploaded
(`--ingest`) as one Markdown file each, named after the passage id, so a source maps back
to it, with the passage title as the document title: the service then indexes the title
line and the passage, as the in-process harness does.

With own history (`--history own`) each conversation is replayed through the service turn
by turn, every earlier assistant message replaced by what the service gave at that turn:
with `--no-llm` the first 800 characters of the passage it ranked first (the in-process
harness's LLM-free proxy, `chatqna.evaluation.live`), with `--llm` its real answer, asked
for separately with the service's own `k`, `top_n` and `LLM_MAX_TOKENS` (at temperature 0),
as a user of it would see it.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

import httpx2

from chatqna.evaluation.dataset import Dataset, EvalTurn, Passage
from chatqna.evaluation.live import ANSWER_CHARS, dialogues, replay_dialogue
from chatqna.evaluation.metrics import turn_metrics
from chatqna.evaluation.modes import BenchPlan, Mode, ModeResult
from chatqna.evaluation.progress import Progress
from chatqna.evaluation.runner import describe_mode
from chatqna.evaluation.strategies import QueryStrategy
from chatqna.upstream.proxies import trust_env_for

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


async def ingest_corpus(client: httpx2.AsyncClient, dataset: Dataset, batch: int = 100) -> None:
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
    failure it answered with, the metadata's `retrieval` report, the milliseconds, and the
    text of the passage it ranked first (the own-history proxy for its answer)."""

    ranking: list[str]
    failure: str | None
    retrieval: dict[str, Any] | None
    milliseconds: float
    top_text: str = ""

    def plan(self) -> BenchPlan:
        """The turn as a plan: the service planned it, no embedding or LLM of the harness's."""
        return BenchPlan(None, 0, 0, self.milliseconds, self.failure)


def turn_messages(turn: EvalTurn) -> list[dict[str, str]]:
    return [*(m.as_openai() for m in turn.history), {"role": "user", "content": turn.query}]


async def ask_service(client: httpx2.AsyncClient, turn: EvalTurn, depth: int) -> ServiceTurn:
    """One turn with its history (`stream: false`, `k` and `top_n` of the depth,
    `max_tokens: 1`); a 503 `condense_failed` is a failed turn, any other error raises."""
    body = {
        "messages": turn_messages(turn),
        "stream": False,
        "k": depth,
        "top_n": depth,
        "max_tokens": 1,
    }
    sent = time.perf_counter()
    response = await client.post("/v1/chatqna", json=body)
    elapsed = (time.perf_counter() - sent) * 1000
    if condense_failed(response):
        return ServiceTurn([], str(response.json().get("reason")), None, elapsed)
    response.raise_for_status()
    metadata = response.json()["metadata"]
    documents = metadata["source_documents"]
    sources = (passage_id_of(doc["source"]) for doc in documents)
    top_text = documents[0]["text"] if documents else ""
    return ServiceTurn(list(dict.fromkeys(sources)), None, metadata["retrieval"], elapsed, top_text)


def condense_failed(response: httpx2.Response) -> bool:
    """Whether the service failed the turn closed (503 `condense_failed`); any other error,
    a proxy's HTML page included, is left to `raise_for_status`."""
    if response.status_code != 503:
        return False
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("error") == "condense_failed"


async def service_answer(client: httpx2.AsyncClient, turn: EvalTurn) -> str:
    """The answer a user of the service would get: its own `k`, `top_n` and longest answer,
    at temperature 0 ("" when the turn fails closed)."""
    body = {"messages": turn_messages(turn), "stream": False, "temperature": 0.0}
    response = await client.post("/v1/chatqna", json=body)
    if condense_failed(response):
        return ""
    response.raise_for_status()
    return str(response.json()["choices"][0]["message"]["content"])


def service_strategy(retrieval: dict[str, Any]) -> str:
    """How the service says it treats follow-ups: condense, blend, or stateless (blend mode
    with the blend switched off)."""
    mode = str(retrieval.get("multi_turn_mode", "?"))
    if mode == "blend" and not (retrieval.get("blend") or {}).get("enabled"):
        return "stateless"
    return mode


def service_mode(
    result: ModeResult,
    turns: Sequence[EvalTurn],
    plans: dict[str, BenchPlan],
    reports: Sequence[dict[str, Any]],
    url: str,
    samples: int,
) -> dict[str, Any]:
    """The service's mode under one history kind, labelled with how the service says it
    retrieved, and how many turns it searched which way (`strategy`, and the blend's
    reason on the turns it did not blend)."""
    retrieval = reports[0] if reports else {}
    mode = describe_mode(result, turns, plans, {}, samples)
    own = " [own history]" if result.mode.history == "own" else ""
    mode["label"] = (
        f"service {url}: {service_strategy(retrieval)}, "
        f"{'hybrid' if retrieval.get('hybrid') else 'dense'}, "
        f"{'rerank' if retrieval.get('reranker') else 'no rerank'}{own}"
    )
    mode["history"] = result.mode.history
    mode["hybrid"] = bool(retrieval.get("hybrid"))
    mode["rerank"] = bool(retrieval.get("reranker"))
    mode["service_retrieval"] = retrieval
    mode["service_turns"] = dict(
        Counter(
            str((report.get("blend") or {}).get("reason") or report.get("strategy"))
            for report in reports
        )
    )
    return mode


class ServiceScorer:
    """Scores the service's answers to turns, one history kind at a time; with `answers`
    the own history holds the service's real answers."""

    def __init__(
        self, client: httpx2.AsyncClient, kind: str, depth: int, answers: bool = False
    ) -> None:
        self.client = client
        self.depth = depth
        self.answers = answers
        self.result = ModeResult(Mode(QueryStrategy("service"), True, True, history=kind))
        self.plans: dict[str, BenchPlan] = {}
        self.reports: list[dict[str, Any]] = []

    async def ask(self, turn: EvalTurn, scored: bool = True) -> str:
        """Send `turn` with its history; record it if `scored`; return the own-history
        answer: the service's answer, or the first `ANSWER_CHARS` characters of its top
        passage."""
        answered = await ask_service(self.client, turn, self.depth)
        if scored:
            if answered.retrieval is not None:
                self.reports.append(answered.retrieval)
            if answered.failure is not None:
                self.result.failures[turn.key] = answered.failure
            self.plans[turn.key] = answered.plan()
            self.result.rankings[turn.key] = answered.ranking
            self.result.per_turn[turn.key] = turn_metrics(answered.ranking, turn.relevant_ids)
        if self.answers and answered.failure is None:
            return await service_answer(self.client, turn)
        return answered.top_text[:ANSWER_CHARS]


async def score_service(
    client: httpx2.AsyncClient,
    dataset: Dataset,
    kind: str,
    depth: int,
    progress: Progress | None,
    answers: bool = False,
) -> ServiceScorer:
    """Every scored turn of `dataset`: with the dataset's history (`reference`), or replayed
    conversation by conversation with each earlier assistant message replaced by the top
    passage the service returned at that turn, or with `answers` by its answer (`own`,
    as `chatqna.evaluation.live`)."""
    turns = dataset.scored_turns
    scorer = ServiceScorer(client, kind, depth, answers and kind == "own")
    tick = progress(f"asking the service ({kind} history)", len(turns)) if progress else None

    async def step(turn: EvalTurn, scored: bool) -> str:
        answer = await scorer.ask(turn, scored)
        if scored and tick:
            tick(1)
        return answer

    if kind == "own":
        for dialogue in dialogues(dataset, turns):
            await replay_dialogue(dialogue, step)
    else:
        for turn in turns:
            await step(turn, True)
    return scorer


async def run_against_service(
    dataset: Dataset,
    url: str,
    *,
    ingest: bool,
    samples: int,
    depth: int = 10,
    api_key: str | None = None,
    progress: Progress | None = None,
    histories: Sequence[str] = ("reference",),
    answers: bool = False,
    transport: httpx2.AsyncBaseTransport | None = None,
) -> dict[str, Any]:
    """Every scored turn under each history kind; with `answers`, own history holds the
    service's real answers instead of its top passages."""
    turns = dataset.scored_turns
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    started = time.perf_counter()
    modes = []
    timeout = httpx2.Timeout(300, connect=10)
    client = httpx2.AsyncClient(
        base_url=url,
        headers=headers,
        timeout=timeout,
        transport=transport,
        trust_env=trust_env_for(url),
    )
    async with client:
        if ingest:
            await ingest_corpus(client, dataset)
        for kind in histories:
            scorer = await score_service(client, dataset, kind, depth, progress, answers)
            modes.append(
                service_mode(scorer.result, turns, scorer.plans, scorer.reports, url, samples)
            )
    return {
        "dataset": dataset.summary(),
        "depth": depth,
        "bootstrap_samples": samples,
        "seconds": round(time.perf_counter() - started, 1),
        "service": url,
        "histories": list(histories),
        "own_history_answers": "the service's answers" if answers else "top passages",
        "modes": modes,
    }
