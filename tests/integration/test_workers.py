"""`chatqna serve --workers 2` with remote backends: two processes behind one port, and one
`/metrics` scrape that counts what both answered."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2
import pytest

from tests.integration.conftest import REPO, clean_env, start_server
from tests.standins.servers import create_standin_app, free_port, serve_in_thread
from tests.unit.api.conftest import parse_sse

pytestmark = pytest.mark.slow

CHATS = 40


def workers_of(pid: int) -> list[int]:
    """uvicorn's worker processes under `pid` (spawned; not multiprocessing's tracker)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                spawned = b"spawn_main" in (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and spawned:
                found.append(int(entry.name))
    return found


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def chat_requests_counted(url: str) -> float:
    text = httpx2.get(f"{url}/metrics", timeout=10).text
    pattern = r'^chatqna_requests_total\{[^}]*route="/v1/chatqna"[^}]*status="200"[^}]*\} (\S+)$'
    return sum(float(value) for value in re.findall(pattern, text, flags=re.MULTILINE))


def ask(url: str) -> list[tuple[str, str]]:
    # A new connection each time, so the kernel hands chats to either worker.
    response = httpx2.post(
        f"{url}/v1/chatqna",
        json={"messages": [{"role": "user", "content": "How do I export my data?"}]},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    return parse_sse(response.text)


def test_two_workers_share_the_port_and_one_scrape_counts_both(tmp_path: Path) -> None:
    with serve_in_thread(create_standin_app()) as standin:
        server = start_server(
            tmp_path / "data",
            tmp_path / "server.log",
            CHATQNA_WORKERS="2",
            TEI_EMBEDDING_ENDPOINT=standin,
            TEI_RERANKING_ENDPOINT=standin,
            RETRIEVER_ENDPOINT=standin,
            LLM_ENDPOINT=standin,
            LLM_MODEL_ID="standin",
            OTEL_TRACES_EXPORTER="none",
            CHATQNA_MAX_CONCURRENT_CHATS="4",
        )
        try:
            workers = workers_of(server.process.pid)
            assert len(workers) == 2, workers
            before = {pid: cpu_seconds(pid) for pid in workers}
            with ThreadPoolExecutor(max_workers=4) as pool:
                answers = list(pool.map(lambda _: ask(server.url), range(CHATS)))
            assert all(events[-1] == ("message", "[DONE]") for events in answers)
            assert all(events[0][0] == "metadata" for events in answers)
            used = {pid: cpu_seconds(pid) - before[pid] for pid in workers}
            assert all(seconds > 0 for seconds in used.values()), used  # both answered
            # Any worker's scrape sums every worker's counters.
            assert chat_requests_counted(server.url) == CHATS
            assert chat_requests_counted(server.url) == CHATS
        finally:
            log = server.stop()
    assert "serving with 2 worker processes" in log
    assert "Traceback" not in log


def sources_listed(url: str) -> set[str]:
    # A new connection each time, so either worker may answer.
    response = httpx2.post(f"{url}/v1/dataprep/get", timeout=30)
    assert response.status_code == 200, response.text
    return {item["name"] for item in response.json()}


def test_two_workers_share_the_embedded_index(tmp_path: Path) -> None:
    """On the embedded index, a file ingested through whichever worker answered the upload is
    listed and found by every worker (they share the data directory)."""
    with serve_in_thread(create_standin_app()) as standin:
        server = start_server(
            tmp_path / "data",
            tmp_path / "server.log",
            CHATQNA_WORKERS="2",
            TEI_EMBEDDING_ENDPOINT=standin,
            LLM_ENDPOINT=standin,
            LLM_MODEL_ID="standin",
            OTEL_TRACES_EXPORTER="none",
        )
        try:
            assert len(workers_of(server.process.pid)) == 2
            upload = httpx2.post(
                f"{server.url}/v1/dataprep/ingest",
                files=[("files", ("moonlit.md", b"# Moonlit\n\nThe moonlit archive keeps logs."))],
                timeout=60,
            )
            assert upload.status_code == 200, upload.text
            seen = [sources_listed(server.url) for _ in range(12)]
            assert all("moonlit.md" in listed for listed in seen), seen
        finally:
            log = server.stop()
    assert "Traceback" not in log


def test_a_worker_that_cannot_start_fails_the_command(tmp_path: Path) -> None:
    """uvicorn's supervisor stops when a worker fails to start and returns as after a
    shutdown; `chatqna serve` tells the two apart and exits 3, as one process does."""
    env = clean_env(
        CHATQNA_DATA_DIR=str(tmp_path / "data"),
        CHATQNA_HOST="127.0.0.1",
        MEGA_SERVICE_PORT=str(free_port()),
        CHATQNA_LLM_GGUF=str(tmp_path / "missing.gguf"),
    )
    done = subprocess.run(
        [sys.executable, "-m", "chatqna", "serve", "--workers", "2"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3, done.stderr[-2000:]
    assert "CHATQNA_LLM_GGUF" in done.stderr and "a worker failed to start" in done.stderr
