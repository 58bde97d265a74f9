"""Blend history assembly: order, composition, window counting, and truncation."""

from __future__ import annotations

import numpy as np
import pytest

from chatqna.backends.fakes import HashingEmbedder
from chatqna.multiturn.blend import blend_query, history_text, history_window
from chatqna.multiturn.history import Conversation, Message

pytestmark = pytest.mark.anyio

HISTORY = (
    Message("user", "q1 refunds"),
    Message("assistant", "a1 refunds take days"),
    Message("user", "q2 export"),
    Message("assistant", "a2 export zip"),
)


def test_newest_first_puts_the_latest_message_first() -> None:
    assert history_text(HISTORY, "newest_first").splitlines() == [
        "a2 export zip",
        "q2 export",
        "a1 refunds take days",
        "q1 refunds",
    ]
    assert history_text(HISTORY).splitlines()[0] == "q1 refunds"


def test_window_counts_messages_of_the_chosen_roles() -> None:
    conversation = Conversation("and then?", HISTORY)
    assert history_window(conversation, 2) == HISTORY[2:]
    assert history_window(conversation, 2, "user") == (HISTORY[0], HISTORY[2])
    assert history_window(conversation, 1, "user") == (HISTORY[2],)
    assert history_window(conversation, 0) == ()


async def test_blend_uses_the_configured_assembly() -> None:
    embedder = HashingEmbedder()
    conversation = Conversation("and then?", HISTORY)
    await blend_query(
        conversation,
        embedder,
        enabled=True,
        alpha=0.7,
        history_turns=2,
        translator=None,
        order="newest_first",
        roles="user",
    )
    assert embedder.batches == [["and then?", "q2 export\nq1 refunds"]]


@pytest.mark.slow  # loads the packaged ONNX model
def test_newest_first_keeps_the_recent_subject_when_the_embedder_truncates() -> None:
    from chatqna.backends.local_embedder import OnnxMiniLMEmbedder

    embedder = OnnxMiniLMEmbedder()
    old = Message("assistant", "Billing happens monthly on the signup date. " * 60)
    recent = Message("user", "How do I reset my password?")
    subject = embedder.embed_sync(["resetting a forgotten password"])[0]
    chronological, newest = embedder.embed_sync(
        [history_text([old, recent]), history_text([old, recent], "newest_first")]
    )
    # 256 tokens fit: chronological order truncates the recent question away.
    assert float(newest @ subject) > float(chronological @ subject) + 0.1
    np.testing.assert_allclose(np.linalg.norm(newest), 1.0, rtol=1e-5)
