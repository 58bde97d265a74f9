"""The `chatqna` command: its help names every subcommand, `ask` prints a stream, and `serve`
runs on the compiled loop and parser."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import pytest
from typer.testing import CliRunner

from chatqna import cli, workers
from chatqna.api.chat_schemas import ChunkDelta
from chatqna.api.sse import DONE, ChunkWriter, data, event
from chatqna.settings import Settings


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


def serve_with(
    monkeypatch: pytest.MonkeyPatch, handler: Callable[[httpx2.Request], httpx2.Response]
) -> None:
    """Route `chatqna ask`'s request to `handler` instead of the network."""

    def stream(method: str, url: str, *, trust_env: bool = True, **kwargs: Any) -> Any:
        client = httpx2.Client(transport=httpx2.MockTransport(handler), trust_env=trust_env)
        return client.stream(method, url, **kwargs)

    monkeypatch.setattr(httpx2, "stream", stream)


def answering(
    body: bytes, content_type: str = "text/event-stream"
) -> Callable[[httpx2.Request], httpx2.Response]:
    def service(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=body, headers={"content-type": content_type})

    return service


def test_ask_prints_the_answer_and_sends_sources_to_stderr(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    writer = ChunkWriter("m")
    body = (
        event("metadata", {"source_documents": [{"source": "a.md", "title": "A", "score": 0.5}]})
        + data(writer.chunk(ChunkDelta(content="Hello ")))
        + data(writer.chunk(ChunkDelta(content="world"), "stop"))
        + DONE
    )
    sent: list[dict[str, Any]] = []

    def service(request: httpx2.Request) -> httpx2.Response:
        sent.append(json.loads(request.content))
        return answering(body)(request)

    serve_with(monkeypatch, service)
    result = CliRunner().invoke(cli.app, ["ask", "first question", "follow-up?"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "Hello world\n"
    assert "[source] a.md - A (0.500)" in result.stderr
    assert [m["content"] for m in sent[0]["messages"]] == ["first question", "follow-up?"]


def test_ask_reports_an_error_event_by_its_message_and_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    writer = ChunkWriter("m")
    envelope = {"error": "upstream_error", "message": "The LLM failed."}
    body = data(writer.chunk(ChunkDelta(content="Hel"))) + event("error", envelope) + DONE
    serve_with(monkeypatch, answering(body))
    result = CliRunner().invoke(cli.app, ["ask", "q"])
    assert result.exit_code == 1
    assert result.stdout == "Hel\n"
    assert result.stderr == "error: the service failed: The LLM failed. (upstream_error)\n"


@pytest.mark.parametrize(
    ("body", "content_type", "expected"),
    [
        (b"data: {not json\n\n" + DONE, "text/event-stream", "not JSON: '{not json'"),
        (b'data: {"choices": []}\n\n', "text/event-stream", "cut off"),
        (b"", "text/event-stream", "cut off"),
        (b"<html></html>", "text/html; charset=utf-8", "content-type 'text/html'"),
    ],
    ids=["non-json-data", "no-done", "empty", "not-a-stream"],
)
def test_ask_exits_1_with_one_line_on_a_broken_stream(
    monkeypatch: pytest.MonkeyPatch, body: bytes, content_type: str, expected: str
) -> None:
    serve_with(monkeypatch, answering(body, content_type))
    result = CliRunner().invoke(cli.app, ["ask", "q"])
    assert result.exit_code == 1
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.stderr.count("\n") == 1 and expected in result.stderr


def test_ask_names_the_url_it_cannot_reach(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ConnectError("[Errno 111] Connection refused", request=request)

    serve_with(monkeypatch, refused)
    result = CliRunner().invoke(cli.app, ["ask", "--url", "http://127.0.0.1:9", "q"])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == (
        "error: cannot connect to http://127.0.0.1:9: [Errno 111] Connection refused\n"
    )


def test_ask_reports_a_refused_request_by_its_envelope(monkeypatch: pytest.MonkeyPatch) -> None:
    envelope = {"error": "unauthorized", "message": "Missing or wrong API key."}
    serve_with(monkeypatch, lambda request: httpx2.Response(401, json=envelope))
    result = CliRunner().invoke(cli.app, ["ask", "q"])
    assert result.exit_code == 1
    assert "HTTP 401: Missing or wrong API key. (unauthorized)" in result.stderr


def test_ask_refuses_a_url_without_a_scheme() -> None:
    result = CliRunner().invoke(cli.app, ["ask", "--url", "localhost:8888", "q"])
    assert result.exit_code == 2
    assert result.stderr == "--url must be an http:// or https:// URL, got 'localhost:8888'\n"


def test_the_server_runs_on_the_compiled_loop_and_parser_under_the_root_path() -> None:
    assert cli.server_options(Settings(chatqna_root_path="/chat")) == {
        "log_level": "info",
        "root_path": "/chat",
        "timeout_graceful_shutdown": 5,
        "loop": "uvloop",
        "http": "httptools",
    }
    assert cli.server_options(Settings())["root_path"] == ""


def test_render_of_a_missing_or_foreign_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    foreign = tmp_path / "notes.json"
    foreign.write_text('{"not": "a benchmark result"}')
    listed = tmp_path / "list.json"
    listed.write_text("[]")
    for path in (tmp_path / "missing.json", foreign, listed):
        result = CliRunner().invoke(cli.app, ["bench", "--render", str(path)])
        assert result.exit_code == 2, result.output
        assert f"--render {path}: cannot render it" in result.output
        assert "Traceback" not in result.output


def test_serve_counts_auto_workers_under_the_cgroup_limit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    limit = tmp_path / "cpu.max"
    limit.write_text("100000 100000\n")
    monkeypatch.setattr(workers, "CGROUP_CPU_MAX", limit)
    ran: dict[str, Any] = {}
    monkeypatch.setattr("uvicorn.run", lambda app, **options: ran.update(options))
    monkeypatch.setattr("chatqna.app.serve_workers", lambda count, options: ran.update(count=count))
    monkeypatch.setenv("CHATQNA_WORKERS", "auto")
    result = CliRunner().invoke(cli.app, ["serve", "--port", "18999"])
    assert result.exit_code == 0, result.output
    assert "count" not in ran and ran["port"] == 18999  # one process: no supervisor


def test_serve_hands_its_options_to_the_worker_processes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    variables = ("CHATQNA_HOST", "MEGA_SERVICE_PORT", "CHATQNA_DATA_DIR", "CHATQNA_WORKERS")
    # `serve` writes the variables its workers read: it writes them into a copy of the environment.
    monkeypatch.setattr(os, "environ", os.environ.copy())
    for name in (*variables, "PROMETHEUS_MULTIPROC_DIR"):
        monkeypatch.delenv(name, raising=False)
    seen: dict[str, Any] = {}

    def serve_workers(count: int, options: dict[str, Any]) -> bool:
        seen.update(count=count, **{name: os.environ.get(name) for name in variables})
        return True

    monkeypatch.setattr("chatqna.app.serve_workers", serve_workers)
    data = tmp_path / "data"
    args = ["serve", "--port", "18998", "--workers", "2", "--data-dir", str(data)]
    result = CliRunner().invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    assert seen == {
        "count": 2,
        "CHATQNA_HOST": None,  # not given: the workers read what the environment says
        "MEGA_SERVICE_PORT": "18998",
        "CHATQNA_DATA_DIR": str(data),
        "CHATQNA_WORKERS": "2",
    }


def test_the_help_rewraps_the_docstrings_to_the_terminal() -> None:
    result = CliRunner().invoke(cli.app, ["--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    lines = [" ".join(line.strip(" │").split()) for line in result.output.splitlines()]
    assert (
        "serve runs the chat service, retriever the retriever service, ingest indexes files, "
        "ask streams an answer from a running service, and bench scores retrieval on a dataset."
    ) in lines
    assert any(line.endswith("files into the index, with a progress bar.") for line in lines)


@pytest.mark.parametrize(
    ("options", "env", "sent"),
    [
        (["--api-key", "opt-key"], {}, "Bearer opt-key"),
        ([], {"CHATQNA_API_KEY": "env-key"}, "Bearer env-key"),
        (["--api-key", "opt-key"], {"CHATQNA_API_KEY": "env-key"}, "Bearer opt-key"),
        ([], {}, None),
    ],
)
def test_ask_sends_the_api_key_as_a_bearer_token(
    monkeypatch: pytest.MonkeyPatch, options: list[str], env: dict[str, str], sent: str | None
) -> None:
    monkeypatch.delenv("CHATQNA_API_KEY", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    headers: list[str | None] = []

    def service(request: httpx2.Request) -> httpx2.Response:
        headers.append(request.headers.get("authorization"))
        return answering(data(ChunkWriter("m").chunk(ChunkDelta(content="ok"), "stop")) + DONE)(
            request
        )

    serve_with(monkeypatch, service)
    result = CliRunner().invoke(cli.app, ["ask", *options, "question?"])
    assert result.exit_code == 0, result.output
    assert headers == [sent]


@pytest.mark.parametrize(
    "server_side",
    [
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "victoriatraces:4317"},
        {"LLM_ENDPOINT": "vllm:8000"},
        {"CHATQNA_WORKERS": "many"},
    ],
)
def test_ask_reads_only_the_api_key(
    monkeypatch: pytest.MonkeyPatch, server_side: dict[str, str]
) -> None:
    monkeypatch.setenv("CHATQNA_API_KEY", "env-key")
    for name, value in server_side.items():
        monkeypatch.setenv(name, value)
    headers: list[str | None] = []

    def service(request: httpx2.Request) -> httpx2.Response:
        headers.append(request.headers.get("authorization"))
        return answering(data(ChunkWriter("m").chunk(ChunkDelta(content="ok"), "stop")) + DONE)(
            request
        )

    serve_with(monkeypatch, service)
    result = CliRunner().invoke(cli.app, ["ask", "question?"])
    assert result.exit_code == 0, result.output
    assert headers == ["Bearer env-key"]
