"""The answer prompt: passages numbered with their source, the history bounded, the raw question."""

from chatqna.documents import Chunk, ScoredChunk
from chatqna.multiturn.history import Conversation, Message
from chatqna.pipeline.prompt import bounded_history, build_answer_prompt, format_passages


def test_passages_history_and_the_users_own_words() -> None:
    sources = [
        ScoredChunk(
            Chunk(id="c1", text=" Export from Settings. ", source="export.md", title="Export"), 1.0
        )
    ]
    conversation = Conversation(
        "Is that possible after I cancel?",
        (Message("user", "How do I export?"), Message("assistant", "Settings > Export.")),
        ("Answer in English.",),
    )
    messages = build_answer_prompt(conversation, sources)
    assert messages[0]["role"] == "system"
    assert messages[0]["content"].startswith("Answer in English.")
    assert "[1] export.md - Export\nExport from Settings." in messages[0]["content"]
    assert messages[1:] == [
        {"role": "user", "content": "How do I export?"},
        {"role": "assistant", "content": "Settings > Export."},
        {"role": "user", "content": "Is that possible after I cancel?"},
    ]
    assert format_passages([]) == "(no passages were found)"


def test_history_is_cut_from_the_oldest_end() -> None:
    history = [Message("user", "a" * 10), Message("assistant", "b" * 10), Message("user", "c" * 10)]
    assert bounded_history(history, 25) == history[1:]
    assert bounded_history(history, 5) == []
