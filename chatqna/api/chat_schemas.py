"""The chat endpoints' wire models: `/v1/chatqna`, `/v1/chat/completions` and `/v1/models`.

Requests: OPEA's ChatCompletionRequest for `/v1/chatqna`, OpenAI's for `/v1/chat/completions`.
`messages` is a string (a single user turn) or a list of `{role, content}`; content may be
a string or OpenAI's list of `{"type": "text", "text": ...}` parts, joined one per line.
`k` is the retrieval depth and `top_n` the number of chunks kept after reranking; `top_k`
is LLM sampling. Unknown fields are ignored, as OPEA's gateway does, so existing clients
keep working.

Responses: every chat body and SSE frame is one of these models (its `metadata` block is
`chatqna.api.chat_metadata_schemas`), serialised by `wire`: the fields a model was built
without are left out (a closing chunk's delta is `{}`), while a field given as `None` is
sent as `null`. `CHAT_STREAM_EVENT` publishes one event of the stream in the OpenAPI
document, which the test suite fuzzes: every response must be one the schema declares.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema, field_validator

from chatqna.api.chat_metadata_schemas import TurnMetadata
from chatqna.api.error_schemas import ErrorEnvelope
from chatqna.backends.protocols import GenerationParams
from chatqna.multiturn.history import Message

Role = Literal["system", "user", "assistant"]
ROLES = get_args(Role)


def _encodable(value: str) -> str:
    """JSON may escape a lone surrogate (`"\\ud800"`), which no UTF-8 text can hold: refused
    here, rather than failing where the text is sent on."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text must be valid Unicode (a lone surrogate is not)") from None
    return value


# Text that can be written out again as UTF-8 (every text field the service passes on).
Text = Annotated[str, AfterValidator(_encodable)]


class TextPart(BaseModel):
    """One text part of an OpenAI multi-part message content."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: Text


class ChatMessage(BaseModel):
    """A chat message; the role must be system, user or assistant."""

    model_config = ConfigDict(extra="ignore")
    role: Role
    content: Text | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        # One part per line, as vLLM joins them: "How do I export" + "my data?" stays two words.
        return "\n".join(part.text for part in self.content)


def _supported_message(position: int, item: object) -> object:
    """`item` as a `ChatMessage` can read it, or one error that names the message and what
    is not supported (rather than pydantic's account of every branch of the union).
    `developer` is OpenAI's newer name for `system`, which its SDKs send."""
    if not isinstance(item, dict):
        raise ValueError(f"messages[{position}] must be an object with a role and content")
    role = item.get("role")
    if role == "developer":
        item = {**item, "role": "system"}
    elif role not in ROLES:
        allowed = ", ".join(ROLES)
        raise ValueError(f"messages[{position}]: role {role!r} is not supported ({allowed})")
    content = item.get("content")
    if content is None or isinstance(content, str):
        return item
    if not isinstance(content, list):
        raise ValueError(f"messages[{position}]: content must be a string or a list of parts")
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind != "text":
            raise ValueError(
                f"messages[{position}]: content part {kind!r} is not supported (text only)"
            )
    return item


# Documented as "holds a non-space character"; the validator below enforces it with a
# clearer message than a regular-expression mismatch.
QuestionText = Annotated[Text, WithJsonSchema({"type": "string", "pattern": r"\S"})]
Flag = Annotated[bool, WithJsonSchema({"type": ["boolean", "null"]})]


class ChatQnARequest(BaseModel):
    """Body of `POST /v1/chatqna` (OPEA's ChatCompletionRequest, the fields we honour)."""

    # Strict: `"stream": "false"` or `"temperature": true` is an error, not a guess.
    model_config = ConfigDict(extra="ignore", strict=True)

    messages: QuestionText | Annotated[list[ChatMessage], Field(min_length=1)] = Field(
        description="a question, or the conversation; the last message is the user's"
    )
    model: str | None = None
    stream: Flag = True  # null: the endpoint's default, as OpenAI's API takes it
    # The schema's bound is absolute; the service's own, `LLM_MAX_TOKENS_LIMIT`, answers 400.
    max_tokens: int | None = Field(
        None,
        ge=1,
        le=32768,
        description="answer length; at most LLM_MAX_TOKENS_LIMIT (2048 by default)",
    )
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    # Bounded as the LLM servers' own integers are (a larger one cannot even be sent on).
    top_k: int | None = Field(None, ge=1, le=2**31 - 1)
    stop: Text | list[Text] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    k: int | None = Field(None, ge=1, le=100, description="retrieval depth")
    top_n: int | None = Field(None, ge=1, le=100, description="chunks kept after reranking")

    @field_validator("stream", mode="before")
    @classmethod
    def _null_is_the_default(cls, value: object) -> object:
        return cls.model_fields["stream"].default if value is None else value

    @field_validator("messages", mode="before")
    @classmethod
    def _supported(cls, value: object) -> object:
        if not isinstance(value, list):
            return value
        if not value:
            raise ValueError("messages must not be empty")
        return [_supported_message(position, item) for position, item in enumerate(value)]

    @field_validator("messages")
    @classmethod
    def _not_empty(cls, value: str | list[ChatMessage]) -> str | list[ChatMessage]:
        if isinstance(value, str):
            if not value.strip():
                raise ValueError("messages must not be empty")
            return value
        if value[-1].role != "user":
            raise ValueError("the last message must have role 'user'")
        if not value[-1].text().strip():
            raise ValueError("the last user message must not be empty")
        return value

    def chat_messages(self) -> list[Message]:
        if isinstance(self.messages, str):
            return [Message("user", self.messages)]
        return [Message(m.role, m.text()) for m in self.messages]

    def generation_params(self, default_max_tokens: int) -> GenerationParams:
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        return GenerationParams(
            max_tokens=self.max_tokens if self.max_tokens is not None else default_max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            stop=stop,
            seed=self.seed,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
        )


class OpenAIChatRequest(ChatQnARequest):
    """Body of `POST /v1/chat/completions`: OpenAI's convention, not streamed by default."""

    stream: Flag = False


def wire(model: BaseModel) -> dict[str, Any]:
    """The model as the JSON object sent: the fields it was built with, in declared order."""
    return model.model_dump(exclude_unset=True)


class Usage(BaseModel):
    """Token counts of a non-streamed completion."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(BaseModel):
    """The answer of a non-streamed completion."""

    role: Literal["assistant"]
    content: str


class CompletionChoice(BaseModel):
    """The single choice of a non-streamed completion."""

    index: int
    message: AssistantMessage
    finish_reason: str


class ChatCompletion(BaseModel):
    """A non-streamed answer (OpenAI's `chat.completion`, plus `metadata`)."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    metadata: TurnMetadata | None = None


class ChunkDelta(BaseModel):
    """What one stream chunk adds to the answer."""

    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(BaseModel):
    """The single choice of a stream chunk; `finish_reason` is set on the last one."""

    index: int
    delta: ChunkDelta
    finish_reason: str | None


class ChatCompletionChunk(BaseModel):
    """One streamed piece of the answer (OpenAI's `chat.completion.chunk`)."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChunkChoice]
    metadata: TurnMetadata | None = None


class ModelCard(BaseModel):
    """One model in `GET /v1/models`."""

    id: str
    object: Literal["model"]
    owned_by: str


class ModelList(BaseModel):
    """Body of `GET /v1/models` (OpenAI's shape)."""

    object: Literal["list"]
    data: list[ModelCard]


def _inline(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema with its `$defs` inlined: it is embedded in an SSE event schema,
    where a local `#/$defs/...` reference would resolve against the whole OpenAPI document."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return resolve(defs[ref.removeprefix("#/$defs/")])
            return {key: resolve(value) for key, value in node.items()}
        if isinstance(node, list):
            return [resolve(item) for item in node]
        return node

    return dict(resolve(schema))


def _json_data(model: type[BaseModel]) -> dict[str, Any]:
    data = {"contentMediaType": "application/json", "contentSchema": _inline(model)}
    return {"properties": {"data": data}}


def _when_event(name: str, then: dict[str, Any]) -> dict[str, Any]:
    condition: dict[str, Any] = {"properties": {"event": {"const": name}}}
    if name != "message":  # an event without a name is a `message`
        condition["required"] = ["event"]
    return {"if": condition, "then": then}


# One event of a chat stream (`metadata`, chunks, `[DONE]`; `error` ends a failed one): the
# `schema` of `text/event-stream`, as OpenAPI 3.1 tools read it (3.1 has no `itemSchema`).
CHAT_STREAM_EVENT: dict[str, Any] = {
    "description": "One event of the stream (the schema describes each event, not the body)",
    "type": "object",
    "required": ["data"],
    "properties": {
        "event": {"type": "string", "enum": ["message", "metadata", "error"]},
        "data": {"type": "string"},
    },
    "allOf": [
        _when_event("metadata", _json_data(TurnMetadata)),
        _when_event("error", _json_data(ErrorEnvelope)),
        _when_event(
            "message",
            {
                "if": {"properties": {"data": {"const": "[DONE]"}}},
                "else": _json_data(ChatCompletionChunk),
            },
        ),
    ],
}

# The 200 response of the chat endpoints: a completion, or with `stream: true` an SSE stream.
CHAT_RESPONSE: dict[str, Any] = {
    "model": ChatCompletion,
    "description": "The answer: a `chat.completion`, or with `stream: true` an event stream",
    "content": {"text/event-stream": {"schema": CHAT_STREAM_EVENT}},
}
