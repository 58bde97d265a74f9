"""Blend mode end to end: the real server, the sample corpus, a pronoun-only follow-up."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx2
import pytest

from tests.integration.conftest import REPO, SAMPLE_CORPUS, clean_env, ingest_cli, start_server

pytestmark = pytest.mark.slow

TOPIC = "accounts-and-sign-in.md"
CHAT = [
    {"role": "user", "content": "How do I reset my password?"},
    {
        "role": "assistant",
        "content": "Use the Forgot password link on the sign-in page; it is valid for 1 hour.",
    },
    {"role": "user", "content": "Can you elaborate on this?"},
]


def _sources(url: str) -> list[str]:
    response = httpx2.post(
        f"{url}/v1/chatqna", json={"messages": CHAT, "stream": False, "max_tokens": 4}, timeout=120
    )
    assert response.status_code == 200, response.text
    metadata = response.json()["metadata"]
    return [doc["source"] for doc in metadata["source_documents"]]


@pytest.mark.parametrize("reranker", ["none", "similarity"])
def test_pronoun_follow_up_finds_the_first_turns_topic_only_with_blend(
    tmp_path: Path, reranker: str
) -> None:
    data = tmp_path / "data"
    ingest_cli(data, SAMPLE_CORPUS)
    results = {}
    for blend in ("true", "false"):
        server = start_server(
            data,
            tmp_path / f"blend-{blend}.log",
            MULTI_TURN_BLEND_ENABLED=blend,
            CHATQNA_EMBEDDED_RERANKER=reranker,
        )
        try:
            results[blend] = _sources(server.url)
        finally:
            server.stop()
    assert TOPIC in results["true"], results
    assert TOPIC not in results["false"], results
    # The fused order (the embedded default) and the similarity reranker scoring with the
    # blended vector both put the first turn's topic first.
    assert results["true"][0] == TOPIC, results


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("MULTI_TURN_BLEND_ALPHA", "1.5"),
        ("MULTI_TURN_MODE", "sideways"),
        ("MULTI_TURN_HISTORY_TURNS", "64"),
    ],
)
def test_invalid_multi_turn_settings_stop_the_service_at_start_up(
    tmp_path: Path, variable: str, value: str
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "chatqna", "serve"],
        cwd=REPO,
        env=clean_env(CHATQNA_DATA_DIR=str(tmp_path), **{variable: value}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert variable in result.stderr
