"""The one observer of chat turns: span attributes and metrics from the turn's typed record.

The pipeline calls it (`chatqna.pipeline.observer.TurnObserver`) as each thing becomes
known: the rewrite's outcome, the query plan, what the reranker kept, the answer's token
counts, the final stage timings, a failure. Texts go on spans only with
`CHATQNA_TRACE_CONTENT=true` (`chatqna.telemetry.attributes`).
"""

from __future__ import annotations

from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

from chatqna.backends.protocols import GenerationParams, Usage
from chatqna.errors import CondenseFailed, UpstreamFailure
from chatqna.multiturn.condense import STATUS_FAILED, CondenseOutcome
from chatqna.pipeline.record import TurnRecord
from chatqna.telemetry import attributes
from chatqna.telemetry.metrics import ServiceMetrics


class TurnTelemetry:
    """Span attributes for every turn, and the service's turn metrics."""

    def __init__(self, metrics: ServiceMetrics, record_content: bool) -> None:
        self.metrics = metrics
        self.record_content = record_content

    def condensed(self, span: Span, outcome: CondenseOutcome) -> None:
        attributes.condense_ok(span, outcome, self.record_content)
        self.metrics.condense.labels(status=outcome.status, reason="").inc()

    def condense_failed(self, span: Span, failure: CondenseFailed) -> None:
        attributes.condense_failed(span, failure)

    def planned(self, span: Span, record: TurnRecord) -> None:
        attributes.orchestrate(span, record, self.record_content)
        blend = record.plan.blend
        if blend is not None:
            executed = "true" if blend.executed else "false"
            self.metrics.blend.labels(executed=executed, reason=blend.reason).inc()

    def selected(self, span: Span, record: TurnRecord, candidates: int) -> None:
        attributes.reranker_selection(span, record, candidates, self.record_content)

    def generating(
        self, parent: Span, model: str, params: GenerationParams
    ) -> dict[str, AttributeValue] | None:
        return attributes.generation(parent, model, params)

    def generated(self, span: Span, usage: Usage | None, finish_reason: str | None) -> None:
        attributes.generation_result(span, usage, finish_reason)

    def answered(self, record: TurnRecord) -> None:
        self.metrics.record_stages(record.timings_ms)

    def failed(self, error: BaseException) -> None:
        """Count a failed turn. A failed rewrite counts as a condense failure and, when the
        rewrite LLM's call failed (`CondenseFailed` raised from that `UpstreamFailure`), as
        an upstream error of that backend (`condense_llm`, `rewrite_llm`, `llm`) too."""
        cause: BaseException | None = error
        if isinstance(error, CondenseFailed):
            self.metrics.condense.labels(status=STATUS_FAILED, reason=error.reason or "").inc()
            cause = error.__cause__
        if isinstance(cause, UpstreamFailure):
            self.metrics.upstream_errors.labels(backend=cause.backend, error=cause.code).inc()
