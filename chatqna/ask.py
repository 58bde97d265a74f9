"""The client behind `chatqna ask`: stream one answer from a running service.

The answer goes to stdout as it arrives, the sources to stderr. Anything short of a whole
answer raises `AskFailed`, whose message is the one line the command shows: the service
cannot be reached, it refuses the request, it ends the stream with an `error` event (the
envelope's `message` and `error` code), it sends something that is not a JSON event stream,
or the stream stops before its final `data: [DONE]`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import httpx2
import typer

from chatqna.upstream.proxies import trust_env_for
from chatqna.upstream.sse import ServerSentEvent, iter_events

TIMEOUT = httpx2.Timeout(120, connect=5)


class AskFailed(Exception):
    """The service gave no whole answer; the message says why in one line."""


class AnswerPrinter:
    """Prints a chat stream's events: answer text to stdout, sources to stderr.

    `wrote_text` tells whether the answer line was started, so a failure can end it before
    the error is shown.
    """

    def __init__(self) -> None:
        self.wrote_text = False

    def print_stream(self, events: Iterable[ServerSentEvent]) -> None:
        """Print every event up to `data: [DONE]`; raises AskFailed if the stream ends
        without it, carries an error event or a body that is not JSON."""
        for event in events:
            if event.is_done:
                return
            self.print_event(event)
        raise AskFailed("the answer was cut off: the stream ended before its final [DONE]")

    def print_event(self, event: ServerSentEvent) -> None:
        body = _json_object(event.data)
        if event.event == "error":
            raise AskFailed(f"the service failed: {describe_envelope(body)}")
        if event.event == "metadata":
            for doc in body.get("source_documents") or []:
                if not isinstance(doc, dict):
                    raise AskFailed("the service sent metadata whose sources are not objects")
                score = doc.get("score")
                shown = f"{score:.3f}" if isinstance(score, int | float) else "?"
                typer.echo(f"[source] {doc.get('source')} - {doc.get('title')} ({shown})", err=True)
            return
        for choice in body.get("choices", []):
            text = choice.get("delta", {}).get("content") or ""
            if text:
                typer.echo(text, nl=False)
                self.wrote_text = True


def _json_object(data: str) -> dict[str, Any]:
    try:
        body = json.loads(data)
    except json.JSONDecodeError:
        raise AskFailed(f"the service sent an event that is not JSON: {data[:80]!r}") from None
    if not isinstance(body, dict):
        raise AskFailed(f"the service sent an event that is not a JSON object: {data[:80]!r}")
    return body


def describe_envelope(body: dict[str, Any]) -> str:
    """`message (code)` of an error envelope, or the body itself if it is not one."""
    message, code = body.get("message"), body.get("error")
    if message is None and code is None:
        return json.dumps(body)[:200]
    return f"{message} ({code})" if code is not None else str(message)


def _refusal(response: httpx2.Response) -> str:
    response.read()
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        return f"HTTP {response.status_code}: {describe_envelope(body)}"
    return f"HTTP {response.status_code}: {response.text[:200]}"


def stream_answer(
    url: str, questions: list[str], printer: AnswerPrinter, api_key: str | None = None
) -> None:
    """POST the turns to `{url}/v1/chatqna`, with `api_key` as a Bearer token when given, and
    print the streamed answer (straight to a service on loopback, whatever proxy the
    environment names)."""
    endpoint = f"{url.rstrip('/')}/v1/chatqna"
    messages = [{"role": "user", "content": text} for text in questions]
    try:
        with httpx2.stream(
            "POST",
            endpoint,
            json={"messages": messages, "stream": True},
            headers=None if api_key is None else {"Authorization": f"Bearer {api_key}"},
            timeout=TIMEOUT,
            trust_env=trust_env_for(url),
        ) as response:
            if response.status_code >= 400:
                raise AskFailed(f"{endpoint} refused the request: {_refusal(response)}")
            media_type = response.headers.get("content-type", "").split(";")[0].strip()
            if media_type != "text/event-stream":
                raise AskFailed(
                    f"{endpoint} did not answer with an event stream "
                    f"(content-type {media_type or 'missing'!r})"
                )
            printer.print_stream(iter_events(response.iter_bytes()))
    except httpx2.ConnectError as exc:
        raise AskFailed(f"cannot connect to {url}: {exc}") from exc
    except httpx2.TimeoutException as exc:
        raise AskFailed(f"{endpoint} did not answer in time ({type(exc).__name__})") from exc
    except (httpx2.HTTPError, httpx2.InvalidURL) as exc:
        raise AskFailed(f"the request to {endpoint} failed: {exc}") from exc
