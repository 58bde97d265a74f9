"""An https upstream on loopback: its certificate is checked against the CA store the process
starts with (the system's, or `SSL_CERT_FILE`), and one no trusted CA signed is a typed 502.

Each client runs in its own process, because OpenSSL reads `SSL_CERT_FILE` once, when the
first verifying context is made. The upstream is a TLS server in this process whose
certificate comes from a throwaway CA (trustme).
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import trustme

pytestmark = pytest.mark.slow

CLIENT = """
import asyncio, json, sys
from chatqna.upstream.client import UpstreamClient
from chatqna.upstream.policy import post_json
from chatqna.errors import UpstreamFailure

async def main() -> None:
    client = UpstreamClient(sys.argv[1], timeout_seconds=5, connect_timeout_seconds=5)
    try:
        body = await post_json(client, "/v1/embeddings", {"input": ["q"]}, backend="embedder")
        print(json.dumps({"body": body}))
    except UpstreamFailure as exc:
        print(json.dumps({"status": exc.status_code, "message": exc.message}))
    finally:
        await client.aclose()

asyncio.run(main())
"""


class Embeddings(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        answer = json.dumps({"data": [{"embedding": [1.0, 0.0]}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def upstream(ca: trustme.CA) -> Iterator[str]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost", "127.0.0.1").configure_cert(context)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Embeddings)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"https://localhost:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def without_proxies() -> dict[str, str]:
    """This environment without proxy variables: the upstream is on loopback."""
    return {
        name: value for name, value in os.environ.items() if not name.lower().endswith("_proxy")
    }


def call(url: str, env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, url],
        env={**without_proxies(), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_a_certificate_from_the_ca_in_ssl_cert_file_is_trusted(
    ca: trustme.CA, upstream: str, tmp_path: Path
) -> None:
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    result = call(upstream, {"SSL_CERT_FILE": str(bundle)})
    assert result == {"body": {"data": [{"embedding": [1.0, 0.0]}]}}


def test_a_certificate_no_trusted_ca_signed_is_a_typed_upstream_error(upstream: str) -> None:
    result = call(upstream, {"SSL_CERT_FILE": os.devnull})
    assert result["status"] == 502
    assert "embedder: POST /v1/embeddings failed (ConnectError)" in str(result["message"])
