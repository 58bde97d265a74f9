"""The `chatqna` command: its help names every subcommand, `ask` prints a stream, and `serve`
runs on the compiled loop and parser."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from chatqna import cli
from chatqna.api.chat_models import ChunkDelta
from chatqna.api.sse import DONE, ChunkWriter, data, event


def command_names() -> list[str]:
    return sorted(
        command.name or (command.callback.__name__ if command.callback else "")
        for command in cli.app.registered_commands
    )


def test_the_help_text_lists_every_command() -> None:
    summary = (cli.__doc__ or "").split("\n\n")[0].split(":", 1)[1]
    listed = sorted(re.findall(r"`(\w+)`", summary))
    assert listed == command_names()
    assert len(listed) == 5


def test_ask_prints_the_answer_and_sends_sources_and_errors_to_stderr(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    writer = ChunkWriter("m")
    body = (
        event("metadata", {"source_documents": [{"source": "a.md", "title": "A", "score": 0.5}]})
        + data(writer.chunk(ChunkDelta(content="Hello ")))
        + data(writer.chunk(ChunkDelta(content="world"), "stop"))
        + event("error", {"error": "upstream_error"})
        + DONE
    )
    sent: list[dict[str, Any]] = []

    def service(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    def stream(method: str, url: str, **kwargs: Any) -> Any:
        return httpx.Client(transport=httpx.MockTransport(service)).stream(method, url, **kwargs)

    monkeypatch.setattr(httpx, "stream", stream)
    result = CliRunner().invoke(cli.app, ["ask", "first question", "follow-up?"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "Hello world\n"
    assert "[source] a.md - A (0.500)" in result.stderr
    assert "error: {'error': 'upstream_error'}" in result.stderr
    assert [m["content"] for m in sent[0]["messages"]] == ["first question", "follow-up?"]


def test_the_server_runs_on_the_compiled_loop_and_parser() -> None:
    assert cli.server_options() == {"loop": "uvloop", "http": "httptools"}
