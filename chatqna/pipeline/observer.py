"""What the pipeline tells whoever observes its turns (spans' attributes, metrics).

The pipeline owns its spans (names from `chatqna.telemetry.names`) and calls a
`TurnObserver` at each point something is known: the telemetry observer
(`chatqna.telemetry.observer`) turns these typed values into span attributes and metrics.
"""

from __future__ import annotations

from typing import Protocol

from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

from chatqna.backends.protocols import GenerationParams, Usage
from chatqna.errors import CondenseFailed
from chatqna.multiturn.condense import CondenseOutcome
from chatqna.pipeline.record import TurnRecord


class TurnObserver(Protocol):
    def condensed(self, span: Span, outcome: CondenseOutcome) -> None:
        """The rewrite's outcome, on its `chatqna.query_condense` span."""

    def condense_failed(self, span: Span, failure: CondenseFailed) -> None:
        """A failed rewrite, on its `chatqna.query_condense` span."""

    def planned(self, span: Span, record: TurnRecord) -> None:
        """The turn's record once its query is planned (no sources yet), on orchestrate."""

    def selected(self, span: Span, record: TurnRecord, candidates: int) -> None:
        """What the reranker kept (`record.sources`), on `chatqna.reranker_selection`."""

    def generating(
        self, parent: Span, model: str, params: GenerationParams
    ) -> dict[str, AttributeValue] | None:
        """The attributes `chatqna.generate` starts with (None: `parent` records nothing)."""

    def generated(self, span: Span, usage: Usage | None, finish_reason: str | None) -> None:
        """The answer's token counts and finish reason, on `chatqna.generate`."""

    def answered(self, record: TurnRecord) -> None:
        """A turn whose answer was generated in full (its final stage timings)."""

    def failed(self, error: BaseException) -> None:
        """A turn that failed (before or during generation)."""


class SilentObserver:
    """Observes nothing (turns run outside the service: benchmarks)."""

    def condensed(self, span: Span, outcome: CondenseOutcome) -> None:
        return None

    def condense_failed(self, span: Span, failure: CondenseFailed) -> None:
        return None

    def planned(self, span: Span, record: TurnRecord) -> None:
        return None

    def selected(self, span: Span, record: TurnRecord, candidates: int) -> None:
        return None

    def generating(
        self, parent: Span, model: str, params: GenerationParams
    ) -> dict[str, AttributeValue] | None:
        return None

    def generated(self, span: Span, usage: Usage | None, finish_reason: str | None) -> None:
        return None

    def answered(self, record: TurnRecord) -> None:
        return None

    def failed(self, error: BaseException) -> None:
        return None
