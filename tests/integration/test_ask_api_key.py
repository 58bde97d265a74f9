"""`chatqna ask` against a service that requires an API key, both in processes of their own:
the key goes as a Bearer token, from `--api-key` or from `CHATQNA_API_KEY`."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.integration.conftest import REPO, ServerProcess, clean_env, start_server

pytestmark = pytest.mark.slow  # starts a server on the embedded models

KEY = "ask-test-key"


@pytest.fixture(scope="module")
def keyed_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    where = tmp_path_factory.mktemp("keyed")
    server = start_server(where / "data", where / "server.log", CHATQNA_API_KEY=KEY)
    yield server
    server.stop()


def ask(url: str, *options: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chatqna", "ask", "--url", url, *options, "What is ChatQnA?"],
        cwd=REPO,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_key_given_as_an_option_is_sent(keyed_service: ServerProcess) -> None:
    run = ask(keyed_service.url, "--api-key", KEY)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip()


def test_the_key_falls_back_to_the_variable(keyed_service: ServerProcess) -> None:
    run = ask(keyed_service.url, CHATQNA_API_KEY=KEY)
    assert run.returncode == 0, run.stderr


def test_without_the_key_the_refusal_is_one_line(keyed_service: ServerProcess) -> None:
    run = ask(keyed_service.url)
    assert run.returncode == 1
    assert run.stderr.strip().splitlines() == [run.stderr.strip()]
    assert "unauthorized" in run.stderr
