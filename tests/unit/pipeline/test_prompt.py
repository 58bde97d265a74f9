"""The answer prompt: passages numbered with their source, the history bounded, the raw question."""

from chatqna.documents import Chunk, ScoredChunk
from chatqna.multiturn.history import CUT_MARK, Conversation, Message
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


def test_the_previous_question_is_kept_however_small_the_budget() -> None:
    history = [Message("user", "a" * 10), Message("assistant", "b" * 10), Message("user", "c" * 10)]
    assert bounded_history(history, 10) == history[2:]
    question = Message("user", "How do I export my data?")
    assert bounded_history([question], 12) == [Message("user", "How do" + CUT_MARK)]


def test_many_answers_after_the_question_stay_within_the_budget() -> None:
    question = Message("user", "Which plans include single sign-on?")
    answers = [Message("assistant", ("word " * 1600).strip()) for _ in range(197)]
    kept = bounded_history([question, *answers], 6000)
    assert kept[0] == question and kept[-1].content.startswith("word word")
    assert len(kept) == 2
    assert sum(len(m.content) for m in kept) <= 6000


def test_answers_between_the_question_and_the_latest_share_what_is_left() -> None:
    question = Message("user", "q " * 1000)  # 2,000 characters
    middle = [Message("assistant", "m " * 400) for _ in range(10)]  # 800 each
    latest = Message("assistant", "a " * 1000)
    kept = bounded_history([Message("user", "first"), question, *middle, latest], 6000)
    assert kept[0].content == question.content and kept[-1] == latest
    assert sum(len(m.content) for m in kept) <= 6000
    assert kept[1].content.endswith(CUT_MARK) and kept[2:4] == middle[-2:]
    assert len(kept) == 5


def test_a_long_last_answer_is_shortened_not_the_end_of_the_history() -> None:
    question = Message("user", "How do I export my data?")
    answer = Message("assistant", "You can export. " * 400)  # 6,400 characters
    kept = bounded_history([Message("assistant", "Hello! " * 20), question, answer], 6000)
    assert kept[0] == question and kept[1].role == "assistant"
    assert kept[1].content.startswith("You can export. You can")
    assert kept[1].content.endswith(CUT_MARK)
    assert sum(len(m.content) for m in kept) <= 6000


def test_the_older_message_that_overflows_is_shortened() -> None:
    older = Message("assistant", "word " * 1000)
    recent = [Message("user", "q" * 20), Message("assistant", "a" * 20)]
    kept = bounded_history([Message("user", "first"), older, *recent], 1000)
    assert kept[1:] == recent
    assert kept[0].content.startswith("word word") and kept[0].content.endswith(CUT_MARK)
    assert len(kept[0].content) <= 960
