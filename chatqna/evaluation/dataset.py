"""Benchmark datasets in the MTRAG layout: `corpus.jsonl` + `conversations.jsonl`.

`corpus.jsonl` holds one passage per line (`id`, `title`, `text`). `conversations.jsonl`
holds one conversation per line with every user and assistant turn; user turns with
`"evaluate": true` are scored against their `relevant_ids`, the rest stay as history.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chatqna.documents import Chunk
from chatqna.multiturn.history import Conversation, Message, split_conversation


@dataclass(frozen=True)
class Passage:
    """One corpus passage; benchmark rankings are lists of passage ids."""

    id: str
    title: str
    text: str

    def chunk(self, source: str, index: int, context: str = "title") -> Chunk:
        """The passage as the index stores it: with `context="title"` its title is the
        chunk's title, so its legs see the title line, then the passage (as ingestion
        indexes a chunk); with `"none"` they see the passage alone."""
        title = self.title if context == "title" else ""
        return Chunk(id=self.id, text=self.text, source=source, title=title, index=index)

    def indexed_text(self, context: str = "title") -> str:
        """What the index's dense and BM25 legs see of the passage (see `chunk`)."""
        return self.chunk("", 0, context).indexed_text


@dataclass(frozen=True)
class EvalTurn:
    """A scored user turn with everything said before it."""

    conversation_id: str
    turn: int
    query: str
    history: tuple[Message, ...]
    relevant_ids: tuple[str, ...]
    gold_rewrite: str | None

    @property
    def is_follow_up(self) -> bool:
        return self.turn >= 2

    @property
    def key(self) -> str:
        return f"{self.conversation_id}<::>{self.turn}"

    def conversation(self) -> Conversation:
        """The turn as the service receives it: its messages split by the API's own
        `split_conversation` (system messages leave the history)."""
        return split_conversation((*self.history, Message("user", self.query)))


@dataclass(frozen=True)
class Dataset:
    """A corpus and the scored turns of its conversations."""

    name: str
    path: Path
    passages: tuple[Passage, ...]
    turns: tuple[EvalTurn, ...]

    @property
    def conversations(self) -> list[str]:
        return sorted({turn.conversation_id for turn in self.turns})

    @property
    def scored_turns(self) -> list[EvalTurn]:
        """Evaluated turns that have labels (a turn without relevant ids cannot be scored)."""
        return [turn for turn in self.turns if turn.relevant_ids]

    def summary(self) -> dict[str, object]:
        turns = self.scored_turns
        return {
            "name": self.name,
            "passages": len(self.passages),
            "conversations": len(self.conversations),
            "turns": len(turns),
            "turn_1": sum(1 for t in turns if t.turn == 1),
            "follow_ups": sum(1 for t in turns if t.is_follow_up),
        }


def _read_jsonl(path: Path) -> list[tuple[int, dict[str, object]]]:
    """The JSON object on each non-blank line, with its line number."""
    rows = []
    try:
        with path.open(encoding="utf-8") as stream:
            for number, line in enumerate(stream, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from exc
                if not isinstance(row, dict):
                    raise ValueError(f"{path}:{number}: not a JSON object")
                rows.append((number, row))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text") from exc
    return rows


def _required(row: dict[str, Any], name: str, where: str) -> Any:
    """`row[name]`; a missing or null field is a ValueError naming the file and line."""
    if row.get(name) is None:
        raise ValueError(f"{where}: no {name!r}")
    return row[name]


def _eval_turn(
    conversation_id: str, item: dict[str, Any], history: list[Message], where: str
) -> EvalTurn:
    value = _required(item, "turn", where)
    try:
        turn = int(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: 'turn' is not a whole number ({value!r})") from exc
    relevant = item.get("relevant_ids") or []
    if not isinstance(relevant, list):
        raise ValueError(f"{where}: 'relevant_ids' is not a list ({relevant!r})")
    return EvalTurn(
        conversation_id=conversation_id,
        turn=turn,
        query=str(item["text"]),
        history=tuple(history),
        relevant_ids=tuple(str(i) for i in relevant),
        gold_rewrite=item.get("gold_rewrite") or None,
    )


def load_dataset(directory: Path) -> Dataset:
    """Read a dataset directory; a missing file is a FileNotFoundError, a bad line a
    ValueError naming the file and line."""
    corpus_path, conversations_path = directory / "corpus.jsonl", directory / "conversations.jsonl"
    for required in (corpus_path, conversations_path):
        if not required.is_file():
            raise FileNotFoundError(f"{required} is missing (a dataset needs both files)")
    passages = []
    for number, row in _read_jsonl(corpus_path):
        where = f"{corpus_path}:{number}"
        passages.append(
            Passage(
                str(_required(row, "id", where)),
                str(row.get("title") or ""),
                str(_required(row, "text", where)),
            )
        )
    turns: list[EvalTurn] = []
    for number, row in _read_jsonl(conversations_path):
        where = f"{conversations_path}:{number}"
        conversation_id = str(_required(row, "conversation_id", where))
        history: list[Message] = []
        raw_turns = row.get("turns")
        if not isinstance(raw_turns, list):
            raise ValueError(f"{where}: {conversation_id} has no turns list")
        for item in raw_turns:
            if not isinstance(item, dict):
                raise ValueError(f"{where}: a turn of {conversation_id} is not a JSON object")
            role, text = str(_required(item, "role", where)), str(_required(item, "text", where))
            if role == "user" and item.get("evaluate"):
                turns.append(_eval_turn(conversation_id, item, history, where))
            history.append(Message(role, text))
    return Dataset(directory.name, directory, tuple(passages), tuple(turns))
