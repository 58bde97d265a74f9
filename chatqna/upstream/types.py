"""What an upstream client gives its backends: timeouts, whole replies, streamed replies.

Beside `chatqna.upstream.client` (the client), so that the backends and the client's own
helpers (`policy`, `sessions`) import these without importing the client.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

import orjson


@dataclass(frozen=True)
class Timeouts:
    """`read` bounds a wait for a pooled connection and each read or write, `connect` a new
    connection's handshake (httpx2's `Timeout(read, connect=connect)`)."""

    read: float
    connect: float


class ResponseTooLarge(Exception):
    """An upstream's body passed the most its client reads of one answer (`limit` bytes,
    decoded); retrying would meet the same body, and the policy names it a bad response."""

    def __init__(self, limit: int) -> None:
        size = f"{limit >> 20} MiB" if limit % (1 << 20) == 0 else f"{limit:,} bytes"
        super().__init__(f"the response body is larger than {size}")
        self.limit = limit


@dataclass(frozen=True)
class Reply:
    """A whole response: status, the body as sent, and its `Retry-After` header as sent
    (None without one): the pause an overloaded upstream asks for before a retry."""

    status: int
    body: bytes
    retry_after: str | None = None

    def json(self) -> Any:
        """The body decoded as JSON (orjson; raises `orjson.JSONDecodeError`, a
        `json.JSONDecodeError`, when it is not JSON)."""
        return orjson.loads(self.body)


class StreamReply(Protocol):
    """A response whose body is read as it arrives; `aclose` must always be awaited."""

    status: int
    server: str  # the `Server` header ("" without one)

    def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes, chunk by chunk, as the network delivers them."""
        ...

    async def read(self) -> bytes:
        """The rest of the body at once (an error answer's few bytes); `ResponseTooLarge`
        beyond the client's limit."""
        ...

    async def finish(self) -> None:
        """The caller has read all it needs (the stream's own end marker): read what little
        is left of the body, if it ends at once, so that `aclose` can give the connection
        back to the pool instead of closing it. Never raises a transport error."""
        ...

    async def aclose(self) -> None:
        """Release the connection: back to the pool when the body was read to its end,
        closed (ending the upstream's work, e.g. a generation) when it was not."""
        ...
