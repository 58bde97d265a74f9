"""The `chatqna` command's checks that run before any server starts."""

from __future__ import annotations

from typer.testing import CliRunner

from chatqna.cli import app, server_options


def test_serve_refuses_several_workers_with_the_embedded_index() -> None:
    result = CliRunner().invoke(app, ["serve", "--workers", "2"])
    assert result.exit_code == 2
    assert "CHATQNA_WORKERS=2 needs a shared index" in result.output
    assert "REDIS_URL" in result.output and "RETRIEVER_ENDPOINT" in result.output


def test_the_server_runs_on_the_compiled_loop_and_parser() -> None:
    assert server_options() == {"loop": "uvloop", "http": "httptools"}
