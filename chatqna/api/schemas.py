"""Wire models: OPEA's ChatCompletionRequest for `/v1/chatqna`, OpenAI's for `/v1/chat/completions`.

`messages` is a string (a single user turn) or a list of `{role, content}`; content may be
a string or OpenAI's list of `{"type": "text", "text": ...}` parts. `k` is the retrieval
depth and `top_n` the number of chunks kept after reranking; `top_k` is LLM sampling.
Unknown fields are ignored, as OPEA's gateway does, so existing clients keep working.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from chatqna.backends.protocols import GenerationParams
from chatqna.multiturn.history import Message

Role = Literal["system", "user", "assistant"]


class TextPart(BaseModel):
    """One text part of an OpenAI multi-part message content."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """A chat message; the role must be system, user or assistant."""

    model_config = ConfigDict(extra="ignore")
    role: Role
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatQnARequest(BaseModel):
    """Body of `POST /v1/chatqna` (OPEA's ChatCompletionRequest, the fields we honour)."""

    model_config = ConfigDict(extra="ignore")

    messages: str | list[ChatMessage]
    model: str | None = None
    stream: bool = True
    max_tokens: int | None = Field(None, ge=1, le=32768)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    k: int | None = Field(None, ge=1, le=100, description="retrieval depth")
    top_n: int | None = Field(None, ge=1, le=100, description="chunks kept after reranking")

    @field_validator("messages")
    @classmethod
    def _not_empty(cls, value: str | list[ChatMessage]) -> str | list[ChatMessage]:
        if isinstance(value, str):
            if not value.strip():
                raise ValueError("messages must not be empty")
            return value
        if not value:
            raise ValueError("messages must hold at least one message")
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

    stream: bool = False


class DataprepDeleteRequest(BaseModel):
    """Body of `POST /v1/dataprep/delete`: a source name, or `all`."""

    model_config = ConfigDict(extra="ignore")
    file_path: str = Field(min_length=1)


class ErrorEnvelope(BaseModel):
    """The one error body every endpoint returns."""

    error: str
    reason: str | None = None
    message: str
    details: Any = None
