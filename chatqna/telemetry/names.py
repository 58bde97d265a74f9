"""Span names and attribute keys: one place, so code, tests and dashboards agree.

`chatqna.orchestrate` is the pipeline's span; `chatqna.query_condense` is opened only in
condense mode, before and beside it (both children of the request's server span).
Attribute keys follow the OpenTelemetry GenAI conventions where they fit (`gen_ai.*`).
"""

SPAN_QUERY_CONDENSE = "chatqna.query_condense"
SPAN_ORCHESTRATE = "chatqna.orchestrate"
SPAN_EMBED = "chatqna.embed"
SPAN_RETRIEVE = "chatqna.retrieve"
SPAN_RERANK = "chatqna.rerank"
SPAN_RERANKER_SELECTION = "chatqna.reranker_selection"
SPAN_GENERATE = "chatqna.generate"
EVENT_FIRST_TOKEN = "first_token"

# condense
CONDENSE_STATUS = "chatqna.condense.status"  # ok | failed | skipped_no_history
CONDENSE_REASON = "chatqna.condense.reason"
CONDENSE_LATENCY_MS = "chatqna.condense.latency_ms"
CONDENSE_HISTORY_SIZE = "chatqna.condense.history_size"
CONDENSE_STANDALONE_QUERY = "chatqna.condense.standalone_query"  # content: opt-in

# orchestrate and generate: the turn stopped because its client left, or stopped reading
# the answer until its deadline (not a failure)
CLIENT_DISCONNECTED = "chatqna.client_disconnected"
CLIENT_STALLED = "chatqna.client_stalled"

# orchestrate
MULTI_TURN_MODE = "chatqna.multi_turn.mode"
RETRIEVAL_STRATEGY = "chatqna.retrieval.strategy"
RETRIEVAL_K = "chatqna.retrieval.k"
RETRIEVAL_TOP_N = "chatqna.retrieval.top_n"
RETRIEVAL_HYBRID = "chatqna.retrieval.hybrid"
RETRIEVAL_CANDIDATES = "chatqna.retrieval.candidates"
HISTORY_MESSAGES = "chatqna.history.messages"
BLEND_EXECUTED = "chatqna.blend.executed"
BLEND_REASON = "chatqna.blend.reason"
BLEND_ALPHA = "chatqna.blend.alpha"
BLEND_HISTORY_TURNS = "chatqna.blend.history_turns"
BLEND_HISTORY_MESSAGES = "chatqna.blend.history_messages"
BLEND_QUESTION_SIMILARITY = "chatqna.blend.question_similarity"
BLEND_TRANSLATED = "chatqna.blend.translated"
BLEND_TRANSLATION_FAILED = "chatqna.blend.translation_failed"
BM25_HISTORY_RAN = "chatqna.bm25_history.ran"
BM25_HISTORY_WEIGHT = "chatqna.bm25_history.weight"
FUSION_DENSE_WEIGHT = "chatqna.fusion.dense_weight"
FUSION_BM25_WEIGHT = "chatqna.fusion.bm25_weight"
HISTORY_ORDER = "chatqna.blend.history_order"
HISTORY_ROLES = "chatqna.blend.history_roles"
QUERY_TEXT = "chatqna.query.text"  # content: opt-in

# reranker selection
RERANKER_NAME = "chatqna.reranker.name"
RERANKER_KEPT_IDS = "chatqna.reranker.kept_ids"
RERANKER_KEPT_SOURCES = "chatqna.reranker.kept_sources"
RERANKER_KEPT_SCORES = "chatqna.reranker.kept_scores"
RERANKER_CANDIDATES = "chatqna.reranker.candidates"
RERANKER_QUERY_KIND = "chatqna.reranker.query_kind"
RERANKER_QUERY = "chatqna.reranker.query"

# generation (OpenTelemetry GenAI semantic conventions)
GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_FINISH_REASON = "gen_ai.response.finish_reasons"
