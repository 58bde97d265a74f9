"""The README's two-turn example against the quick start's own service, as a new user runs it.

The server gets exactly what `scripts/serve` exports (multi-turn blending on), the embedded
default for every backend (reranker included) and the sample corpus. The request body is
read from the README, so the documented example and this test cannot drift apart.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx2
import pytest

from tests.integration.conftest import REPO, SAMPLE_CORPUS, ingest_cli, start_server
from tests.unit.api.conftest import parse_sse

pytestmark = pytest.mark.slow


def readme_example() -> dict[str, object]:
    """The JSON body of the README's `curl ... /v1/chatqna` quick-start example."""
    readme = (REPO / "README.md").read_text()
    match = re.search(
        r"curl -N http://127\.0\.0\.1:8888/v1/chatqna .*?-d '(\{.*?\})'", readme, re.S
    )
    assert match, "the README's quick start shows a curl example"
    body: dict[str, object] = json.loads(match.group(1))
    return body


def quick_start_env() -> dict[str, str]:
    """The variables `scripts/serve` exports for the quick start."""
    script = (REPO / "scripts" / "serve").read_text()
    return dict(re.findall(r'^export ([A-Z_]+)="\$\{\1:-([^}]*)\}"$', script, re.M))


def metadata_of(url: str, body: dict[str, object]) -> dict[str, object]:
    response = httpx2.post(f"{url}/v1/chatqna", json=body, timeout=120)
    assert response.status_code == 200, response.text
    name, data = parse_sse(response.text)[0]
    assert name == "metadata"
    metadata: dict[str, object] = json.loads(data)
    return metadata


def test_the_readme_follow_up_finds_the_export_passage_because_of_the_blend(
    tmp_path: Path,
) -> None:
    body = readme_example()
    assert quick_start_env() == {"MULTI_TURN_BLEND_ENABLED": "true"}
    runs = {}
    for name, env in (("quick start", quick_start_env()), ("stateless", {})):
        data = tmp_path / name.replace(" ", "-")
        ingest_cli(data, SAMPLE_CORPUS)
        server = start_server(data, tmp_path / f"{data.name}.log", **env)
        try:
            # The contrast run needs the sources only: a short answer keeps it quick.
            runs[name] = metadata_of(server.url, body if env else {**body, "max_tokens": 4})
        finally:
            server.stop()

    quick = runs["quick start"]
    sources = [doc["source"] for doc in quick["source_documents"]]  # type: ignore[union-attr]
    assert sources[0] == "export.md", sources
    retrieval = quick["retrieval"]
    assert isinstance(retrieval, dict)
    assert retrieval["strategy"] == "blend"
    # The embedded default keeps the fused order, and says so.
    assert retrieval["rerank"] == {
        "ran": False,
        "reason": "embedded_default",
        "query_kind": None,
        "query": None,
    }
    # The same request without the blend ranks the cancellation pages first.
    stateless = runs["stateless"]
    first = stateless["source_documents"][0]["source"]  # type: ignore[index]
    assert stateless["retrieval"]["strategy"] == "stateless"  # type: ignore[index]
    assert first != "export.md"
