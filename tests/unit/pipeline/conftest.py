"""What the pipeline's tests share: a conversation, the turn's options, an observer that
records, and the backends and settings the turns run with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Span

from chatqna.backends.bundle import Backends
from chatqna.backends.fakes import HashingEmbedder, ScriptedLLM
from chatqna.backends.protocols import GenerationParams, Usage
from chatqna.errors import CondenseFailed
from chatqna.multiturn.condense import CondenseOutcome
from chatqna.multiturn.history import Message
from chatqna.pipeline.record import TurnRecord
from chatqna.pipeline.turn import TurnOptions
from chatqna.settings import Settings
from tests.unit.api.conftest import make_backends

CHAT = [
    Message("user", "How do I export my data?"),
    Message("assistant", "Open Settings and choose Export."),
    Message("user", "How long is data kept after cancellation?"),
]
OPTIONS = TurnOptions(k=4, top_n=2, params=GenerationParams(max_tokens=32))


class Recorder:
    """A `TurnObserver` that keeps what it was told, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def condensed(self, span: Span, outcome: CondenseOutcome) -> None:
        self.calls.append(("condensed", outcome))

    def condense_failed(self, span: Span, failure: CondenseFailed) -> None:
        self.calls.append(("condense_failed", failure))

    def planned(self, span: Span, record: TurnRecord) -> None:
        self.calls.append(("planned", record))

    def selected(self, span: Span, record: TurnRecord, candidates: int) -> None:
        self.calls.append(("selected", (record, candidates)))

    def generating(self, parent: Span, model: str, params: GenerationParams) -> None:
        self.calls.append(("generating", model))

    def generated(self, span: Span, usage: Usage | None, finish_reason: str | None) -> None:
        self.calls.append(("generated", (finish_reason, usage)))

    def answered(self, record: TurnRecord) -> None:
        self.calls.append(("answered", record))

    def failed(self, error: BaseException) -> None:
        self.calls.append(("failed", error))

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(chatqna_data_dir=tmp_path / "data", multi_turn_blend_enabled=True)


async def backends_for(settings: Settings, llm: ScriptedLLM | None = None) -> Backends:
    return await make_backends(settings, embedder=HashingEmbedder(), llm=llm)


def finished(spans: InMemorySpanExporter, name: str) -> Any:
    found = [span for span in spans.get_finished_spans() if span.name == name]
    return found[0] if found else None
