"""A turn's `metadata`, built from its record: each mode's blocks, and only its own."""

from __future__ import annotations

import numpy as np

from chatqna.api.chat_metadata_schemas import TurnMetadata
from chatqna.api.chat_schemas import wire
from chatqna.documents import Chunk, ScoredChunk
from chatqna.multiturn.blend import SKIP_DISABLED, BlendResult
from chatqna.multiturn.condense import STATUS_OK, CondenseOutcome
from chatqna.multiturn.rerank_query import RerankQuery
from chatqna.multiturn.strategy import HistoryLeg, QueryPlan
from chatqna.multiturn.translate import TranslationReport
from chatqna.pipeline.record import Fusion, RerankRecord, TurnRecord

VECTOR = np.ones(4, dtype=np.float32)
SOURCE = ScoredChunk(
    chunk=Chunk(id="c1", text="Data is kept for 30 days.", source="retention.md", index=0),
    score=0.9,
    scores={"dense": 0.8, "bm25": 0.4},
)


def record(plan: QueryPlan, *, fusion: Fusion | None, rerank: RerankRecord) -> TurnRecord:
    return TurnRecord(
        raw_query="And then?",
        history_messages=2,
        plan=plan,
        fusion=fusion,
        rerank=rerank,
        hybrid=True,
        k=4,
        top_n=1,
        sources=(SOURCE,),
        timings_ms={"retrieve": 2.0, "total": 10.0},
        trace_id=None,
    )


def test_a_blend_turn_reports_its_blend_fusion_and_history_leg() -> None:
    translation = TranslationReport(True, True, translated=1, from_cache=2, failed=1)
    blend = BlendResult(VECTOR, VECTOR, True, "executed", 0.7, 2, 2, translation=translation)
    plan = QueryPlan(
        mode="blend",
        strategy="blend",
        text="And then?",
        embedding=VECTOR,
        rerank=RerankQuery("And then? Refunds?", VECTOR, "conversation"),
        blend=blend,
        history_leg=HistoryLeg(True, 0.3, "Refunds?"),
    )
    turn = record(plan, fusion=Fusion((1.0, 0.3), 60, 50), rerank=RerankRecord("tei", ""))
    sent = wire(TurnMetadata.of(turn))
    retrieval = sent["retrieval"]
    assert "condense" not in retrieval
    # Searched in translation: translated for this turn or remembered from an earlier one.
    assert retrieval["blend"]["translation"] == {
        "enabled": True,
        "ran": True,
        "translated": 3,
        "failed": 1,
    }
    assert retrieval["bm25_history"] == {"ran": True, "weight": 0.3}
    assert (retrieval["fusion_weights"], retrieval["rrf_k"], retrieval["rrf_candidates"]) == (
        [1.0, 0.3],
        60,
        50,
    )
    assert retrieval["rerank"] == {
        "ran": True,
        "reason": "reranked",
        "query_kind": "conversation",
        "query": "And then? Refunds?",
    }
    assert sent["source_documents"][0]["scores"] == {"dense": 0.8, "bm25": 0.4}


def test_a_condense_turn_leaves_out_the_blend_blocks_and_says_why_nothing_reranked() -> None:
    outcome = CondenseOutcome(STATUS_OK, "How long is data kept?", "And then?", 2, 12.0, "m")
    plan = QueryPlan(
        mode="condense",
        strategy="condense",
        text=outcome.query,
        embedding=VECTOR,
        rerank=RerankQuery(outcome.query, VECTOR, "standalone"),
        condense=outcome,
    )
    turn = record(plan, fusion=None, rerank=RerankRecord(None, "disabled"))
    retrieval = wire(TurnMetadata.of(turn))["retrieval"]
    for absent in ("blend", "bm25_history", "fusion_weights", "rrf_k", "rrf_candidates"):
        assert absent not in retrieval
    assert retrieval["condense"]["standalone_query"] == "How long is data kept?"
    assert retrieval["rerank"] == {
        "ran": False,
        "reason": "disabled",
        "query_kind": None,
        "query": None,
    }


def test_a_blend_switched_off_is_reported_as_not_enabled() -> None:
    blend = BlendResult(VECTOR, VECTOR, False, SKIP_DISABLED, 0.7, 0)
    plan = QueryPlan(
        mode="blend",
        strategy="stateless",
        text="And then?",
        embedding=VECTOR,
        rerank=RerankQuery("And then?", VECTOR, "question"),
        blend=blend,
    )
    turn = record(plan, fusion=None, rerank=RerankRecord(None, "disabled"))
    sent = wire(TurnMetadata.of(turn))["retrieval"]["blend"]
    assert (sent["enabled"], sent["executed"], sent["reason"]) == (False, False, SKIP_DISABLED)
    assert sent["translation"] == {}
