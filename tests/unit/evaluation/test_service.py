"""Scoring a running service: the files a corpus is uploaded as, and the turns it is
asked with reference and with own history."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2
import pytest

from chatqna.evaluation.dataset import Dataset, Passage, load_dataset
from chatqna.evaluation.live import ANSWER_CHARS
from chatqna.evaluation.service import (
    condense_failed,
    passage_file,
    passage_filename,
    passage_id_of,
    run_against_service,
    service_strategy,
)
from chatqna.ingest.chunking import chunk_document
from chatqna.ingest.loaders import load_document
from tests.unit.evaluation.test_dataset import write_dataset


def ingested(passage: Passage) -> list[tuple[str, str]]:
    """(title, text) of each chunk the service's ingestion makes of the uploaded file."""
    source = passage_filename(passage.id)
    chunks = chunk_document(load_document(source, passage_file(passage)), 20000, 0)
    return [(chunk.title, chunk.text) for chunk in chunks]


def test_the_service_indexes_an_uploaded_passage_as_the_harness_does() -> None:
    passage = Passage("doc/7-1", "Fee waivers", "You need a waiver in both courts.\nAsk the clerk.")
    assert passage_id_of(passage_filename(passage.id)) == "doc/7-1"
    assert ingested(passage) == [("Fee waivers", passage.text)]


def test_a_line_starting_with_a_hash_does_not_split_the_passage() -> None:
    passage = Passage("p", "Style", "Intro.\n## Not a heading\n# Nor this")
    assert ingested(passage) == [("Style", "Intro.\n\\## Not a heading\n\\# Nor this")]


def service_reply(top: str, text: str, reason: str) -> dict[str, Any]:
    """A `stream: false` reply of `/v1/chatqna` whose metadata ranks `top` first, from a
    service in blend mode that says why it did or did not blend (`reason`)."""
    document = {
        "id": f"{top}#0",
        "doc_id": top,
        "source": passage_filename(top),
        "title": top,
        "text": text,
        "score": 1.0,
        "scores": {},
    }
    retrieval = {
        "multi_turn_mode": "blend",
        "strategy": "blend" if reason == "executed" else "stateless",
        "blend": {"enabled": True, "executed": reason == "executed", "reason": reason},
        "hybrid": True,
        "reranker": None,
    }
    choice = {"index": 0, "message": {"role": "assistant", "content": f"About {top}."}}
    return {
        "choices": [choice],
        "metadata": {"source_documents": [document], "retrieval": retrieval},
    }


class FakeService:
    """Answers every turn with one passage, chosen by the user's last message, and keeps
    the messages each request carried."""

    def __init__(self, ranking: dict[str, tuple[str, str]]) -> None:
        self.ranking = ranking
        self.requests: list[list[dict[str, str]]] = []
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        messages = body["messages"]
        self.requests.append(messages)
        self.bodies.append(body)
        reason = "executed" if len(messages) > 1 else "no_history"
        reply = service_reply(*self.ranking[messages[-1]["content"]], reason)
        return httpx2.Response(200, json=reply)


async def score_both_histories(
    dataset: Dataset, fake: FakeService, answers: bool = False
) -> dict[str, Any]:
    """`run_against_service` on `fake`, with reference and with own history."""
    return await run_against_service(
        dataset,
        "http://service",
        ingest=False,
        samples=50,
        histories=("reference", "own"),
        answers=answers,
        transport=httpx2.MockTransport(fake),
    )


@pytest.mark.anyio
async def test_own_history_sends_the_top_passage_the_service_returned_as_the_answer(
    tmp_path: Path,
) -> None:
    dataset = load_dataset(write_dataset(tmp_path / "tiny"))
    wrong = "Annual plans are refundable. " * 40  # longer than ANSWER_CHARS
    fake = FakeService(
        {
            "How do I export my workspace?": ("p-refund", wrong),
            "How long is it kept?": ("p-retain", "Data is kept 30 days after cancel."),
        }
    )
    results = await score_both_histories(dataset, fake)
    reference, own = fake.requests[:2], fake.requests[2:]
    # Reference history: the dataset's assistant turn, as it stands.
    assert reference[1][1] == {"role": "assistant", "content": "Use the export zip."}
    # Own history: what the service ranked first at turn 1, cut like the in-process proxy.
    assert own[1][1] == {"role": "assistant", "content": wrong[:ANSWER_CHARS]}
    assert [m["history"] for m in results["modes"]] == ["reference", "own"]
    assert results["modes"][1]["label"] == (
        "service http://service: blend, hybrid, no rerank [own history]"
    )
    for mode in results["modes"]:
        assert mode["service_turns"] == {"no_history": 1, "executed": 1}
        assert mode["per_turn_R@5"] == {"c1<::>1": 0.0, "c1<::>2": 0.5}


@pytest.mark.parametrize(
    ("retrieval", "strategy"),
    [
        ({"multi_turn_mode": "blend", "blend": {"enabled": True}}, "blend"),
        ({"multi_turn_mode": "blend", "blend": {"enabled": False}}, "stateless"),
        ({"multi_turn_mode": "condense", "blend": {"enabled": False}}, "condense"),
    ],
)
def test_a_service_is_named_for_what_it_does_with_follow_ups(
    retrieval: dict[str, Any], strategy: str
) -> None:
    assert service_strategy(retrieval) == strategy


@pytest.mark.anyio
async def test_with_answers_own_history_holds_what_the_service_answered(tmp_path: Path) -> None:
    dataset = load_dataset(write_dataset(tmp_path / "tiny"))
    fake = FakeService(
        {
            "How do I export my workspace?": ("p-refund", "Annual plans are refundable."),
            "How long is it kept?": ("p-retain", "Data is kept 30 days after cancel."),
        }
    )
    results = await score_both_histories(dataset, fake, answers=True)
    reference, own = fake.bodies[:2], fake.bodies[2:]
    assert [b["max_tokens"] for b in reference] == [1, 1], "reference history needs no answer"
    # Own history: each turn ranked at the depth, then answered as the service answers users.
    ranked, answered = own[0::2], own[1::2]
    assert [(b["k"], b["top_n"], b["max_tokens"]) for b in ranked] == [(10, 10, 1)] * 2
    # Asked as a user asks: the service's own k, top_n and longest answer, at temperature 0.
    assert [set(b) for b in answered] == [{"messages", "stream", "temperature"}] * 2
    assert [b["temperature"] for b in answered] == [0.0, 0.0]
    assert ranked[1]["messages"][1] == {"role": "assistant", "content": "About p-refund."}
    assert results["own_history_answers"] == "the service's answers"


def test_only_the_services_own_envelope_is_a_closed_failure() -> None:
    closed = {"error": "condense_failed", "reason": "timeout", "message": "retry"}
    assert condense_failed(httpx2.Response(503, json=closed))
    assert not condense_failed(httpx2.Response(503, text="<html>Service Unavailable</html>"))
    assert not condense_failed(httpx2.Response(503, json=["condense_failed"]))
    assert not condense_failed(httpx2.Response(502, json=closed))
