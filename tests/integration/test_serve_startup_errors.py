"""`chatqna serve` with a setting that fails only once backends are built, in a process of
its own: it exits 3 with one short error naming the variable, not a traceback; a value the
settings can check exits 2 before anything starts."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import clean_env, free_port

pytestmark = pytest.mark.slow  # each case starts a server process and loads models

REPO = Path(__file__).resolve().parents[2]


def serve(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    settings = {
        "CHATQNA_DATA_DIR": str(tmp_path / "data"),
        "MEGA_SERVICE_PORT": str(free_port()),
        "CHATQNA_HOST": "127.0.0.1",
        **env,
    }
    return subprocess.run(
        [sys.executable, "-m", "chatqna", "serve"],
        cwd=REPO,
        env=clean_env(**settings),
        capture_output=True,
        text=True,
        timeout=180,
    )


def assert_one_clear_error(run: subprocess.CompletedProcess[str], code: int, line: str) -> None:
    assert run.returncode == code, run.stderr
    assert "Traceback" not in run.stderr and "╭" not in run.stderr, run.stderr
    errors = [text for text in run.stderr.splitlines() if line in text]
    assert len(errors) == 1, run.stderr
    assert len(run.stderr.splitlines()) <= 8, run.stderr


@pytest.fixture
def silent_listener() -> Iterator[str]:
    """A loopback server that accepts connections and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def test_an_unreachable_redis(tmp_path: Path) -> None:
    run = serve(tmp_path, REDIS_URL=f"redis://127.0.0.1:{free_port()}")
    assert_one_clear_error(run, 3, "ERROR:    REDIS_URL: ")
    assert "start-up: connecting to REDIS_URL, up to 10s (REDIS_TIMEOUT_SECONDS)" in run.stderr


def test_an_unreachable_embedding_server(tmp_path: Path) -> None:
    run = serve(
        tmp_path,
        TEI_EMBEDDING_ENDPOINT=f"http://127.0.0.1:{free_port()}",
        UPSTREAM_RETRY_BACKOFF_SECONDS="0",
    )
    assert_one_clear_error(run, 3, "ERROR:    TEI_EMBEDDING_ENDPOINT: ")


def test_an_embedding_server_that_never_answers_is_waited_for_as_configured(
    tmp_path: Path, silent_listener: str
) -> None:
    run = serve(
        tmp_path,
        TEI_EMBEDDING_ENDPOINT=silent_listener,
        EMBEDDING_TIMEOUT_SECONDS="0.5",
        UPSTREAM_RETRY_ATTEMPTS="1",
    )
    assert_one_clear_error(run, 3, "ERROR:    TEI_EMBEDDING_ENDPOINT: ")
    assert "timed out" in run.stderr
    assert "waiting for TEI_EMBEDDING_ENDPOINT to embed a probe, 1 tries of up to 0.5s" in (
        run.stderr
    )


@pytest.mark.parametrize("gguf", ["absent.gguf", "README.md"])
def test_a_gguf_that_cannot_be_loaded(tmp_path: Path, gguf: str) -> None:
    path = tmp_path / gguf
    if gguf == "README.md":
        path.write_text("# not a model\n")
    run = serve(tmp_path, CHATQNA_LLM_GGUF=str(path))
    assert_one_clear_error(
        run, 3, f"ERROR:    CHATQNA_LLM_GGUF: {path if gguf == 'README.md' else ''}"
    )


def test_a_data_dir_that_is_a_file(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    run = serve(tmp_path, CHATQNA_DATA_DIR=str(afile))
    assert_one_clear_error(run, 3, f"CHATQNA_DATA_DIR must be a directory: {afile} is a file")


def test_every_worker_reports_the_same_one_line(tmp_path: Path) -> None:
    run = serve(tmp_path, REDIS_URL=f"redis://127.0.0.1:{free_port()}", CHATQNA_WORKERS="2")
    assert run.returncode == 3, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    assert run.stderr.count("ERROR:    REDIS_URL: ") in (1, 2), run.stderr
    assert run.stderr.rstrip().endswith("a worker failed to start (see its error above)")


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OTEL_TRACES_EXPORTER", "jaeger"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "victoriatraces:10428"),
        # opentelemetry-api raises on it when FastAPI is first imported
        ("OTEL_PROPAGATORS", "b3"),
    ],
)
def test_an_otel_setting_the_settings_can_check_exits_2(
    tmp_path: Path, variable: str, value: str
) -> None:
    run = serve(tmp_path, **{variable: value})
    assert run.returncode == 2, run.stderr
    assert run.stderr.splitlines()[0] == "invalid configuration:", run.stderr
    assert len(run.stderr.splitlines()) == 2 and variable in run.stderr, run.stderr
